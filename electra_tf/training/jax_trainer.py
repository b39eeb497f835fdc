"""The JAX runtime's trainer: what `training/loop.py` asks of a `Trainer` (host loops of
compiled steps, the global step, the learning rate, checkpoints, phases), over
`jax_step.py`'s compiled step. The host keeps TensorFlow for CPU, as JAX TPU users run it:
tf.data feeds the step, and checkpoints are TensorFlow's object-based format with the same
object graph as the TensorFlow runtime's, so either runtime resumes the other's run and
every reader of a run (fine-tuning, `convert`, scoring, export) reads a JAX run unchanged.
The compiled step itself needs no TensorFlow (`jax_step.py`)."""

import abc
import collections
import contextlib
import types
from typing import Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import keras
import numpy as np
import tensorflow as tf

from electra_tf.training import jax_step
from electra_tf.training.schedule import Phases

# Keras' own bookkeeping attributes of a layer: not part of its object graph (TensorFlow's
# tracking of Keras 3 layers leaves them out too).
_KERAS_INTERNALS = frozenset({
    "_layers", "_trainable_variables", "_non_trainable_variables", "_metrics",
    "_seed_generators", "_tracker", "_inbound_nodes", "_outbound_nodes"})
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


# --------------------------------------------------------------------------- devices


class JaxDevices:
    """The devices of a JAX run, answering what the host loop asks of a
    `tf.distribute.Strategy` (`num_replicas_in_sync`, `extended.worker_devices`, `scope()`)
    plus the process's place among `jax.distributed`'s processes."""

    def __init__(self, devices: Optional[List] = None):
        self.mesh = jax_step.make_mesh(devices)
        devices = list(self.mesh.devices.flat)
        self.num_replicas_in_sync = len(devices)
        here = jax.process_index()
        self.extended = types.SimpleNamespace(worker_devices=[
            f"/job:worker/replica:0/task:{d.process_index}/device:{d.platform.upper()}:{d.id}"
            for d in devices if d.process_index == here])
        self.cluster_resolver = None
        self.platform = devices[0].platform.upper()
        self.device_kind = devices[0].device_kind
        self.process_index, self.process_count = here, jax.process_count()

    def scope(self):
        return contextlib.nullcontext()

    def task(self):
        """(task_type, task_id) as `distribute.task` gives them: ('worker', i) under
        several processes, else (None, None)."""
        return ("worker", self.process_index) if self.process_count > 1 else (None, None)

    def sum_over_processes(self, value: int) -> int:
        """`value` summed over every process (a collective: all must call it)."""
        if self.process_count == 1:
            return int(value)
        from jax.experimental import multihost_utils
        return int(np.sum(multihost_utils.process_allgather(np.int32(value))))

    def describe(self) -> str:
        return (f"JAX {jax.__version__}: {self.num_replicas_in_sync} {self.platform} "
                f"device(s) ({self.device_kind}), {self.process_count} process(es)")


# --------------------------------------------------------------------------- checkpoints


def object_paths(root, prefix: str) -> Dict[int, str]:
    """{id(variable): its path in TensorFlow's object graph of `root`}, e.g.
    `model/electra/layer_0/query/_kernel`: the attribute names from `root` to the variable
    along the shortest path, the first in attribute order among equals (the breadth-first
    walk of `tf.train.Checkpoint`). The same on every backend: a JAX run's checkpoint has
    the TensorFlow runtime's keys (tests/test_jax_runtime.py compares them)."""
    out: Dict[int, str] = {}
    seen = {id(root)}
    queue = collections.deque([(root, prefix)])
    while queue:
        obj, path = queue.popleft()
        for name, value in _children(obj):
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, keras.Variable):
                out[id(value)] = f"{path}/{name}"
            else:
                queue.append((value, f"{path}/{name}"))
    return out


def _tracked(value) -> bool:
    return isinstance(value, (keras.Variable, keras.layers.Layer))


def _children(obj):
    if isinstance(obj, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(obj)]
    elif isinstance(obj, dict):
        items = list(obj.items())
    else:
        items = [(k, v) for k, v in vars(obj).items() if k not in _KERAS_INTERNALS]
    for name, value in items:
        if _tracked(value):
            yield name, value
        elif isinstance(value, (list, tuple, dict)) and value and all(
                _tracked(v) for v in (value.values() if isinstance(value, dict) else value)):
            yield name, value


class _Node(tf.__internal__.tracking.AutoTrackable):
    """One object of the checkpoint's object graph (attributes set by name)."""


def _mirror(root_name: str, paths: Dict[str, tf.Variable]):
    """A tree of `_Node`s holding `paths` {'root/a/b': variable} at those object paths."""
    root = _Node()
    nodes = {root_name: root}
    for path in sorted(paths):
        parts = path.split("/")
        for i in range(1, len(parts)):
            key = "/".join(parts[:i + 1])
            if i == len(parts) - 1:
                setattr(nodes["/".join(parts[:i])], parts[i], paths[path])
            elif key not in nodes:
                nodes[key] = _Node()
                setattr(nodes["/".join(parts[:i])], parts[i], nodes[key])
    return root


def host_array(array) -> np.ndarray:
    """A replicated global array's value on this host."""
    return np.asarray(jax.device_get(array.addressable_data(0)))


# --------------------------------------------------------------------------- the trainer


class JaxTrainer(Phases, abc.ABC):
    """A run's state and compiled functions on JAX, for `loop.train` as a `Trainer` is.

    `build_model()` makes the Keras model (after the global seed is set); the job gives
    `loss`, `step_context` and, optionally, phases and log fields, as a `Trainer`'s job
    does. The step's state lives on the devices (`self.state`); the Keras variables, the
    TensorFlow mirror of the checkpoint and the counters the host loop reads are updated
    from it when they are read (`sync_model`, `before_save`, after each host loop)."""

    jit_compile = True  # XLA, always

    def __init__(self, devices: JaxDevices, build_model: Callable, optimizer_config,
                 total_steps: int, *, seed: int, seed_stream: int, clip_norm: float,
                 grad_accum_steps: int = 1, float16: bool = False):
        self.strategy = devices
        self.seed_stream = seed_stream
        self.float16 = float16
        keras.utils.set_random_seed(seed)
        self.model = build_model()
        self._build_model = build_model
        self.variables = list(self.model.trainable_variables)
        self.frozen = list(self.model.non_trainable_variables)
        self._optimizer_config, self._total_steps = optimizer_config, total_steps
        self._clip_norm, self._grad_accum = clip_norm, grad_accum_steps
        self._new_builder()
        self.state = self.steps.place_state(jax_step.initial_state(
            self.variables, self.frozen, float16, [seed, seed_stream]))
        # The counters the host loop reads and the checkpoint holds (host copies).
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.data_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="data_batches")
        self.loss_scale = tf.Variable(2.0 ** 15 if float16 else 1.0, trainable=False,
                                      name="loss_scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                      name="loss_scale_good_steps")
        self._mirror_vars = None  # {object path: tf.Variable}, made on first save/restore
        self._train_steps: Dict[int, Callable] = {}
        self._eval_steps: Dict[int, Callable] = {}
        self._ahead: Optional[jax_step.BatchesAhead] = None

    def _new_builder(self, multipliers: Optional[Dict[str, float]] = None):
        names = jax_step.names_of(self.variables)
        rule = jax_step.UpdateRule.of(self._optimizer_config, self._total_steps, names,
                                      multipliers)
        self.optimizer = types.SimpleNamespace(learning_rate=rule.learning_rate, rule=rule)
        self.steps = jax_step.StepBuilder(
            self.variables, self.frozen, self._job_loss, self.step_context, rule,
            clip_norm=self._clip_norm, grad_accum_steps=self._grad_accum,
            float16=self.float16, mesh=self.strategy.mesh)

    def set_lr_multipliers(self, multipliers: Dict[str, float]):
        """Layer-wise rates, {variable path: multiplier}; before the first step."""
        self._new_builder(multipliers)
        self._train_steps.clear()

    @property
    def trace_count(self) -> int:
        return self.steps.trace_count

    # ------------------------------------------------------------------ the job's part

    @abc.abstractmethod
    def loss(self, batch, seed, context, training: bool, phase: int = 0, step=None):
        """-> (float32 loss, additive metric sums) of the global batch (`step`: the traced
        global step, for what reads it)."""

    def step_context(self, batch) -> Dict:
        return {}

    def _job_loss(self, batch, seed, context, training, phase, step):
        return self.loss(batch, seed, context, training, phase, step)

    def on_phase_start(self, phase: int):
        """Runs eagerly on the Keras model before phase `phase` > 0 (see `enter_phase`)."""

    def log_fields(self, metrics: Dict[str, float]) -> List[str]:
        return []

    # ------------------------------------------------------------------ phases

    def enter_phase(self, step: int):
        starts = self.phases()
        if step in starts[1:]:
            self.sync_model()
            self.on_phase_start(starts.index(step))
            self.model_changed()

    # ------------------------------------------------------------------ model <-> state

    def sync_model(self):
        """The Keras variables take the step's current values (for exports and eager
        code that reads the model)."""
        for v, value in zip(self.variables + self.frozen,
                            self.state["params"] + self.state["frozen"]):
            v.assign(host_array(value))

    def model_changed(self):
        """The step's parameters take the Keras variables' values (after eager code
        assigned them: a fixed generator loaded, a phase's weight copy)."""
        params = [jnp.asarray(keras.ops.convert_to_numpy(v.value)) for v in self.variables]
        frozen = [jnp.asarray(keras.ops.convert_to_numpy(v.value)) for v in self.frozen]
        self.state = self.steps.place_state(dict(self.state, params=params, frozen=frozen))

    def reinitialize(self, seed: int):
        """Puts the trainer where a new one built with `seed` would start (weights, zero
        slots and counters, loss scale, draws), keeping its compiled steps: fine-tuning's
        trials compile once."""
        keras.utils.set_random_seed(seed)
        fresh = self._build_model()
        new, old = fresh.trainable_variables, self.variables
        if [w.path for w in new] != [w.path for w in old]:
            raise ValueError("build_model made a different model on reinitialize")
        for target, value in zip(self.variables + self.frozen,
                                 new + fresh.non_trainable_variables):
            target.assign(keras.ops.convert_to_numpy(value.value))
        self.state = self.steps.place_state(jax_step.initial_state(
            self.variables, self.frozen, self.float16, [seed, self.seed_stream]))
        for counter in (self.global_step, self.good_steps, self.data_batches):
            counter.assign(0)
        self.loss_scale.assign(2.0 ** 15 if self.float16 else 1.0)

    # ------------------------------------------------------------------ checkpoints

    def _mirror(self) -> Dict[str, tf.Variable]:
        if self._mirror_vars is None:
            paths = object_paths(self.model, "model")
            # Named as the TensorFlow runtime's variables are: readers of a checkpoint
            # that build no model go by these names (conversion/source.py).
            mirror = {paths[id(v)]: tf.Variable(np.zeros(v.shape, v.dtype), trainable=False,
                                                name=v.path)
                      for v in self.variables + self.frozen}
            for v in self.variables:
                for slot in ("adam_m", "adam_v"):
                    mirror[f"optimizer/{slot}/{v.path}/{slot}"] = tf.Variable(
                        np.zeros(v.shape, v.dtype), trainable=False, name=f"{v.path}/{slot}")
            self._mirror_vars = mirror
        return self._mirror_vars

    def checkpoint(self, data_position: bool = True) -> tf.train.Checkpoint:
        """The TensorFlow runtime's checkpoint object graph, over host copies."""
        mirror = self._mirror()
        model = _mirror("model", {k: v for k, v in mirror.items() if k.startswith("model/")})
        optimizer = _Node()
        for slot in ("adam_m", "adam_v"):
            head = f"optimizer/{slot}/"
            setattr(optimizer, slot, {k[len(head):]: v for k, v in mirror.items()
                                      if k.startswith(head)})
        state = dict(model=model, optimizer=optimizer, global_step=self.global_step,
                     loss_scale=self.loss_scale, loss_scale_good_steps=self.good_steps)
        if data_position:
            state["data_batches"] = self.data_batches
        return tf.train.Checkpoint(**state)

    def _mirror_order(self):
        paths = object_paths(self.model, "model")
        model_keys = [paths[id(v)] for v in self.variables + self.frozen]
        slots = [[f"optimizer/{s}/{v.path}/{s}" for v in self.variables]
                 for s in ("adam_m", "adam_v")]
        return model_keys, slots

    def before_save(self):
        """Copies the step's state into the checkpoint's host variables."""
        mirror = self._mirror()
        model_keys, (m_keys, v_keys) = self._mirror_order()
        for key, value in zip(model_keys, self.state["params"] + self.state["frozen"]):
            mirror[key].assign(host_array(value))
        for keys, values in ((m_keys, self.state["m"]), (v_keys, self.state["v"])):
            for key, value in zip(keys, values):
                mirror[key].assign(host_array(value))
        self._sync_counters()

    def _sync_counters(self):
        self.global_step.assign(int(host_array(self.state["step"])))
        self.loss_scale.assign(float(host_array(self.state["loss_scale"])))
        self.good_steps.assign(int(host_array(self.state["good_steps"])))

    def restore(self, path: str):
        """Restores a training checkpoint of either runtime (one without data_batches
        resumes the input at global_step)."""
        reader = tf.compat.v1.train.NewCheckpointReader(path)
        saved = {name.split("/")[0] for name in reader.get_variable_to_shape_map()}
        data_position = "data_batches" in saved
        self.checkpoint(data_position).restore(path).assert_existing_objects_matched()
        if not data_position:
            self.data_batches.assign(self.global_step)
        mirror = self._mirror()
        model_keys, (m_keys, v_keys) = self._mirror_order()
        n = len(self.variables)
        values = [jnp.asarray(mirror[k].numpy()) for k in model_keys]
        self.state = self.steps.place_state(dict(
            self.state, params=values[:n], frozen=values[n:],
            m=[jnp.asarray(mirror[k].numpy()) for k in m_keys],
            v=[jnp.asarray(mirror[k].numpy()) for k in v_keys],
            step=jnp.asarray(int(self.global_step.numpy()), jnp.int32),
            loss_scale=jnp.asarray(float(self.loss_scale.numpy()), jnp.float32),
            good_steps=jnp.asarray(int(self.good_steps.numpy()), jnp.int32)))
        self.sync_model()

    # ------------------------------------------------------------------ host loops

    def _batch(self, element) -> Dict:
        return self.steps.place_batch({k: v.numpy() if hasattr(v, "numpy") else v
                                       for k, v in element.items()})

    def batches(self, iterator) -> jax_step.BatchesAhead:
        """`iterator`'s batches placed ahead by a thread (`jax_step.BatchesAhead`), one reader per
        iterator: the host loops of a run share it, a new iterator (evaluation, the next
        run) ends the previous reader."""
        if self._ahead is None or self._ahead.source is not iterator:
            if self._ahead is not None:
                self._ahead.close()
            self._ahead = jax_step.BatchesAhead(iterator, self._batch)
        return self._ahead

    def make_train_loop(self, phase: int = 0):
        """`loop(iterator, num_steps)` -> metric sums (host numbers) over the steps. The
        batches are read and placed on the devices by a thread, two ahead of the step
        (`batches`), and each step is dispatched without waiting for the one before."""
        if phase not in self._train_steps:
            self._train_steps[phase] = self.steps.compile_train(phase)
        step = self._train_steps[phase]

        def loop(iterator, num_steps):
            sums = None
            ahead = self.batches(iterator)
            for _ in range(int(num_steps)):
                self.state, step_sums = step(self.state, next(ahead))
                sums = step_sums if sums is None else {k: sums[k] + step_sums[k]
                                                       for k in sums}
            self._sync_counters()  # waits for the steps
            return {k: host_array(v) for k, v in sums.items()}

        return loop

    def make_eval_loop(self, phase: Optional[int] = None):
        if phase is None:
            phase = self.phase_at(int(self.global_step.numpy()))
        if phase not in self._eval_steps:
            self._eval_steps[phase] = self.steps.compile_eval(phase)
        step = self._eval_steps[phase]

        def loop(iterator, num_steps):
            sums = None
            ahead = self.batches(iterator)
            for _ in range(int(num_steps)):
                s = step(self.state, next(ahead))
                sums = s if sums is None else {k: sums[k] + s[k] for k in sums}
            return {k: host_array(v) for k, v in sums.items()}

        return loop
