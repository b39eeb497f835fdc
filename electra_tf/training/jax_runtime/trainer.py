"""The JAX runtime (`runtime.Runtime`) over `step.py`'s compiled step: the state on the
devices (weights, slots, the step, the loss scale), the data position a host number, host
loops that dispatch steps without waiting and read the batches ahead on a thread. No
TensorFlow state: checkpoints go through `training/checkpoints.py` (TensorFlow's
object-based format written and read without TensorFlow, with the TensorFlow runtime's
object graph, so either runtime resumes the other's run and every reader of a run reads a
JAX run unchanged)."""

from typing import Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import keras
import numpy as np

from electra_tf.training import checkpoints, runtime
from electra_tf.training.jax_runtime import step as jax_step


def host_array(array) -> np.ndarray:
    """A replicated global array's value on this host."""
    return np.asarray(jax.device_get(array.addressable_data(0)))


def _values(variables) -> List[jax.Array]:
    return [jnp.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]


class JaxRuntime(runtime.Runtime):
    """A job on JAX: the Keras model (its variables mapped to the step's arrays inside the
    step), the state on the devices (`self.state`), the compiled steps per phase. The Keras
    variables take the state's values when something reads them (`sync_model`)."""

    jit_compile = True  # XLA, always

    def __init__(self, job: runtime.Job, devices):
        self.job, self.devices = job, devices
        s = job.settings
        self.float16 = runtime.active_precision() == "float16"
        keras.utils.set_random_seed(s.seed)
        self.model = job.build_model()
        self.variables = list(self.model.trainable_variables)
        self.frozen = list(self.model.non_trainable_variables)
        rule = jax_step.UpdateRule.of(s.optimizer, s.total_steps,
                                      jax_step.names_of(self.variables),
                                      job.lr_multipliers(self.model))
        self.rule = rule
        self.steps = jax_step.StepBuilder(
            self.variables, self.frozen, self._loss, job.denominators, rule,
            clip_norm=s.clip_norm, grad_accum_steps=s.grad_accum_steps, float16=self.float16,
            mesh=devices.mesh)
        self.state = self._initial_state(s.seed)
        self._data_batches = 0  # global batches read (a host number)
        self._checkpoint: Optional[checkpoints.ArrayCheckpoint] = None
        self._train_steps: Dict[int, Callable] = {}
        self._eval_steps: Dict[int, Callable] = {}
        self._predict = None
        self._ahead: Optional[jax_step.BatchesAhead] = None

    def _initial_state(self, seed: int):
        return self.steps.place_state(jax_step.initial_state(
            self.variables, self.frozen, self.float16, [seed, self.job.settings.seed_stream]))

    def _loss(self, batch, seed, context, training, phase, step):
        return self.job.loss(self.model, batch, seed, context, training, phase, step)

    @property
    def trace_count(self) -> int:
        return self.steps.trace_count

    def describe_step(self) -> str:
        return "XLA-compiled (one jax.jit program)"

    # ------------------------------------------------------------------ counters

    @property
    def step(self) -> int:
        return int(host_array(self.state["step"]))

    @property
    def data_position(self) -> int:
        return self._data_batches

    def advance_data(self, batches: int):
        self._data_batches += int(batches)

    @property
    def loss_scale(self) -> float:
        return float(host_array(self.state["loss_scale"]))

    def learning_rate(self, step: int) -> float:
        return float(self.rule.learning_rate(step))

    # ------------------------------------------------------------------ model <-> state

    def sync_model(self):
        for v, value in zip(self.variables + self.frozen,
                            self.state["params"] + self.state["frozen"]):
            v.assign(host_array(value))

    def model_changed(self):
        self.state = self.steps.place_state(dict(
            self.state, params=_values(self.variables), frozen=_values(self.frozen)))

    def reinitialize(self, seed: int):
        keras.utils.set_random_seed(seed)
        fresh = self.job.build_model()
        runtime.check_same_model(fresh, self.model)
        for target, value in zip(self.variables + self.frozen,
                                 fresh.trainable_variables + fresh.non_trainable_variables):
            target.assign(keras.ops.convert_to_numpy(value.value))
        self.state = self._initial_state(seed)
        self._data_batches = 0

    # ------------------------------------------------------------------ checkpoints

    def _layout(self):
        """(the checkpoint's arrays, the object paths of the model's variables in the
        state's order)."""
        paths = checkpoints.object_paths(self.model, "model")
        model_keys = [paths[id(v)] for v in self.variables + self.frozen]
        if self._checkpoint is None:
            entries = [checkpoints.Entry(k, tuple(v.shape), v.dtype, v.path)
                       for k, v in zip(model_keys, self.variables + self.frozen)]
            entries += [checkpoints.Entry(checkpoints.slot_path(v.path, slot), tuple(v.shape),
                                          v.dtype, f"{v.path}/{slot}")
                        for slot in ("adam_m", "adam_v") for v in self.variables]
            entries += [checkpoints.Entry(name, (), dtype, name)
                        for name, dtype in checkpoints.COUNTERS.items()]
            self._checkpoint = checkpoints.ArrayCheckpoint(entries)
        return self._checkpoint, model_keys

    def state_arrays(self) -> Dict[str, np.ndarray]:
        """The state as {checkpoint object path: host array}."""
        _, model_keys = self._layout()
        out = {k: host_array(v) for k, v in zip(model_keys,
                                                 self.state["params"] + self.state["frozen"])}
        for slot, key in (("adam_m", "m"), ("adam_v", "v")):
            for v, value in zip(self.variables, self.state[key]):
                out[checkpoints.slot_path(v.path, slot)] = host_array(value)
        out.update(global_step=np.int64(self.step), loss_scale=np.float32(self.loss_scale),
                   loss_scale_good_steps=np.int64(host_array(self.state["good_steps"])),
                   data_batches=np.int64(self._data_batches))
        return out

    def checkpoint_manager(self, directory: str, max_to_keep: int):
        if not self.devices.is_chief():  # process 0 writes; a save is no collective here
            return checkpoints.ReadOnlyManager(directory)
        return self._layout()[0].manager(directory, max_to_keep, self.state_arrays)

    def restore(self, path: str):
        checkpoint, model_keys = self._layout()
        saved = checkpoint.read(path)
        n = len(self.variables)
        values = [jnp.asarray(saved[k]) for k in model_keys]
        slots = {key: [jnp.asarray(saved[checkpoints.slot_path(v.path, slot)])
                       for v in self.variables]
                 for slot, key in (("adam_m", "m"), ("adam_v", "v"))}
        step = int(saved["global_step"])
        self.state = self.steps.place_state(dict(
            self.state, params=values[:n], frozen=values[n:], **slots,
            step=jnp.asarray(step, jnp.int32),
            loss_scale=jnp.asarray(float(saved["loss_scale"]), jnp.float32),
            good_steps=jnp.asarray(int(saved["loss_scale_good_steps"]), jnp.int32)))
        self._data_batches = int(saved.get("data_batches", step))
        self.sync_model()

    # ------------------------------------------------------------------ host loops

    def _batch(self, element) -> Dict:
        return self.steps.place_batch({k: v.numpy() if hasattr(v, "numpy") else v
                                       for k, v in element.items()})

    def batches(self, iterator) -> jax_step.BatchesAhead:
        """`iterator`'s batches placed ahead by a thread (`step.BatchesAhead`), one reader
        per iterator: the host loops of a run share it, a new iterator (evaluation, the next
        run) ends the previous reader."""
        if self._ahead is None or self._ahead.source is not iterator:
            if self._ahead is not None:
                self._ahead.close()
            self._ahead = jax_step.BatchesAhead(iterator, self._batch)
        return self._ahead

    def end_input(self):
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def make_train_loop(self, phase: int = 0):
        """Each step is dispatched without waiting for the one before; the sums come back
        as host numbers (which waits for the steps)."""
        if phase not in self._train_steps:
            self._train_steps[phase] = self.steps.compile_train(phase)
        step = self._train_steps[phase]

        def loop(iterator, num_steps):
            sums = None
            ahead = self.batches(iterator)
            for _ in range(int(num_steps)):
                self.state, step_sums = step(self.state, next(ahead))
                sums = runtime.add_sums(sums, step_sums)
            return {k: host_array(v) for k, v in sums.items()}

        return loop

    def make_eval_loop(self, phase: Optional[int] = None):
        if phase is None:
            phase = self.phase_at(self.step)
        if phase not in self._eval_steps:
            self._eval_steps[phase] = self.steps.compile_eval(phase)
        step = self._eval_steps[phase]

        def loop(iterator, num_steps):
            sums = None
            ahead = self.batches(iterator)
            for _ in range(int(num_steps)):
                sums = runtime.add_sums(sums, step(self.state, next(ahead)))
            return {k: host_array(v) for k, v in sums.items()}

        return loop

    def predict(self, arrays: Dict[str, np.ndarray], batch_size: int) -> Dict[str, np.ndarray]:
        """In padded batches of one shape split over the devices. With several processes
        each holds the whole split and sends its share of every batch; the outputs come
        back whole to every process."""
        rows = len(arrays["weight"])
        batch = batch_size + -batch_size % self.devices.num_replicas
        arrays = runtime.pad_rows(arrays, batch)
        if self._predict is None:
            rep = jax_step.replicated(self.devices.mesh)
            split = jax_step.batch_sharding(self.devices.mesh)

            def fetch(params, frozen, batch):
                mapping = list(zip(self.variables, params)) + list(zip(self.frozen, frozen))
                with keras.StatelessScope(state_mapping=mapping):
                    return self.job.fetches(batch, self.model(batch, training=False))

            self._predict = jax.jit(fetch, in_shardings=(rep, rep, split), out_shardings=rep)
        share = batch // self.devices.process_count
        mine = self.devices.process_index * share

        def outputs():
            for start in range(0, len(arrays["weight"]), batch):
                chunk = self.steps.place_batch({k: v[start + mine:start + mine + share]
                                                for k, v in arrays.items()})
                out = self._predict(self.state["params"], self.state["frozen"], chunk)
                yield {k: host_array(v) for k, v in out.items()}

        return runtime.concat_rows(outputs(), rows)
