"""The JAX runtime's compiled train step, without TensorFlow: the job's loss in micro-batches,
then the step tail both runtimes share: unscale, clip by the global norm, skip a non-finite
step (counted, nothing applied), AdamW without bias correction or LAMB with layer-wise
learning-rate multipliers, float16 loss scaling, every formula `training/update.py`'s (the
TensorFlow runtime calls the same functions). One `jax.jit` over the global batch: the
state is replicated on a 1-D `data` mesh of every device (every process's, under
`jax.distributed`), the batch is split over it by rows, and XLA inserts the gradient
all-reduce. The state is passed in and out and donated, so its memory is not doubled.

`trainer.py` puts the host loop, checkpoints and input around it (the batches placed
ahead by `BatchesAhead`); `bench/` times it alone (a GPU machine has no TensorFlow)."""

import atexit
import dataclasses
import queue
import threading
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from electra_tf import rng
from electra_tf.training import update
from electra_tf.training.schedule import WarmupPolynomialDecay

DATA_AXIS = "data"


# --------------------------------------------------------------------------- devices


def make_mesh(devices: Optional[Sequence] = None) -> Mesh:
    """A 1-D mesh named `data` over `devices` (default: every device of every process)."""
    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.array(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows split over the mesh: device i holds rows [i B / n, (i + 1) B / n)."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


# --------------------------------------------------------------------------- optimizer


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """`update.py`'s AdamW / LAMB over the step's lists of arrays: the hyper-parameters, the
    schedule and each variable's flags (`decay[i]`: weight decay applies to variable i,
    `excluded[i]`: its name matches the exclusions, `multipliers[i]`: its learning-rate
    multiplier, 1.0 for none)."""
    hyper: update.Hyper
    schedule: WarmupPolynomialDecay
    decay: Tuple[bool, ...]
    excluded: Tuple[bool, ...]
    multipliers: Tuple[float, ...]

    @classmethod
    def of(cls, config, total_steps: int, names: Sequence[str],
           multipliers: Optional[Dict[str, float]] = None) -> "UpdateRule":
        """From an `OptimizerConfig` for the variables `names` (Keras paths), with
        `multipliers` {name: learning-rate multiplier}."""
        hyper = update.Hyper.of(config)
        schedule = WarmupPolynomialDecay(config.learning_rate, total_steps, config.warmup_steps,
                                         config.end_learning_rate, config.lr_decay_power)
        multipliers = multipliers or {}
        unknown = sorted(set(multipliers) - set(names))
        if unknown:
            raise ValueError(f"lr multiplier for unknown variable name {unknown[0]!r}")
        return cls(hyper, schedule, tuple(hyper.decays(n) for n in names),
                   tuple(hyper.is_excluded(n) for n in names),
                   tuple(float(multipliers.get(n, 1.0)) for n in names))

    def learning_rate(self, step, lengths=None):
        """The schedule's float32 learning rate at `step` (a traced or host number);
        `lengths`: the schedule's `lengths()` as the compiled step's input (None: as
        constants, for the host)."""
        return self.schedule.compute(jnp.asarray(step, jnp.float32), jnp.minimum, jnp.power,
                                     lengths)

    def lengths(self) -> np.ndarray:
        """What `apply` takes as `lengths`: the run's total and warmup steps (float32),
        inputs of the compiled step rather than constants, so one program serves runs of
        any length and JAX's persistent compilation cache finds it."""
        return self.schedule.lengths()

    def apply(self, params, grads, m, v, step, grad_scale, ok, lengths=None):
        """-> (params, m, v) after one `update.new_values` per variable; where `ok` is
        False the old values (selects, not a branch)."""
        lr = self.learning_rate(step, lengths)
        c = dict(self.hyper.constants(), **update.bias_corrections(self.hyper, step))
        out_p, out_m, out_v = [], [], []
        for i, (p, g, m0, v0) in enumerate(zip(params, grads, m, v)):
            rate = lr if self.multipliers[i] == 1.0 else lr * self.multipliers[i]
            new = update.new_values(self.hyper, p, m0, v0, g, rate, c, decay=self.decay[i],
                                    excluded=self.excluded[i], grad_scale=grad_scale, ok=ok)
            for out, value in zip((out_p, out_m, out_v), new):
                out.append(value)
        return out_p, out_m, out_v


# --------------------------------------------------------------------------- the state


def initial_state(trainable: Sequence, frozen: Sequence, float16: bool, base_seed) -> Dict:
    """The step's state from Keras variables: their values, zero slots, counters."""
    params = [jnp.asarray(keras.ops.convert_to_numpy(v.value)) for v in trainable]
    return {
        "params": params,
        "frozen": [jnp.asarray(keras.ops.convert_to_numpy(v.value)) for v in frozen],
        "m": [jnp.zeros_like(p) for p in params],
        "v": [jnp.zeros_like(p) for p in params],
        "step": jnp.zeros([], jnp.int32),
        "loss_scale": jnp.asarray(update.initial_loss_scale(float16), jnp.float32),
        "good_steps": jnp.zeros([], jnp.int32),
        "base_seed": jnp.asarray(base_seed, jnp.int32),
    }


# --------------------------------------------------------------------------- the step


class StepBuilder:
    """Builds the compiled train and eval steps of a Keras model and a job's loss.

    `loss(batch, seed, context, training, phase, step) -> (float32 loss, metric sums)` runs
    the job's Keras code; it is called inside a `keras.StatelessScope` that maps the model's
    variables to the step's arrays. `context(batch)`: what the loss needs from the whole
    global batch (pre-training's denominators)."""

    def __init__(self, trainable: Sequence, frozen: Sequence, loss: Callable, context: Callable,
                 rule: UpdateRule, *, clip_norm: float, grad_accum_steps: int = 1,
                 float16: bool = False, mesh: Optional[Mesh] = None):
        self.trainable, self.frozen = list(trainable), list(frozen)
        self.loss, self.context, self.rule = loss, context, rule
        self.clip_norm, self.k, self.float16 = clip_norm, int(grad_accum_steps), float16
        self.mesh = mesh or make_mesh()
        self.trace_count = 0

    # ----------------------------------------------------------------- pieces

    def _loss_of(self, params, frozen, batch, seed, context, training, phase, step):
        mapping = list(zip(self.trainable, params)) + list(zip(self.frozen, frozen))
        with keras.StatelessScope(state_mapping=mapping):
            loss, sums = self.loss(batch, seed, context, training, phase, step)
        return jnp.asarray(loss, jnp.float32), {k: jnp.asarray(v) for k, v in sums.items()}

    def _grads(self, state, batch, seed, context, phase):
        def scaled(params):
            loss, sums = self._loss_of(params, state["frozen"], batch, seed, context, True,
                                       phase, state["step"])
            return loss * state["loss_scale"], (loss, sums)

        grads, (loss, sums) = jax.grad(scaled, has_aux=True)(state["params"])
        return grads, loss, sums

    def _accumulated(self, state, batch, seed, context, phase):
        """Gradients of the global batch in `k` micro-batches of consecutive rows, each
        drawing with its rows' global indices (as the TensorFlow runtime's replicas do)."""
        k = self.k
        if k == 1:
            return self._grads(state, batch, seed, context, phase)
        rows = next(iter(batch.values())).shape[0] // k
        micro = {n: t.reshape((k, rows) + t.shape[1:]) for n, t in batch.items()}
        take = lambda i: {n: t[i] for n, t in micro.items()}
        grads, loss, sums = self._grads(state, take(0), seed, context, phase)

        def body(i, carry):
            grads, loss, sums = carry
            g, l, s = self._grads(state, take(i), rng.offset_rows(seed, i * rows), context,
                                  phase)
            return ([a + b for a, b in zip(grads, g)], loss + l,
                    {n: sums[n] + s[n] for n in sums})

        return jax.lax.fori_loop(1, k, body, (grads, loss, sums))

    def train_fn(self, phase: int = 0):
        """The pure step: (state, batch, lengths) -> (state, metric sums); `lengths`:
        `UpdateRule.lengths()`."""

        def step(state, batch, lengths):
            self.trace_count += 1  # Python side effect: counts traces
            seed = rng.step_seed(state["base_seed"], state["step"], 0)
            context = self.context(batch)
            grads, loss, sums = self._accumulated(state, batch, seed, context, phase)
            grads, norm, finite, scale = update.prepare(grads, state["loss_scale"],
                                                        self.clip_norm, self.float16)
            params, m, v = self.rule.apply(state["params"], grads, state["m"], state["v"],
                                           state["step"], scale, finite, lengths)
            new = dict(state, params=params, m=m, v=v,
                       step=state["step"] + finite.astype(jnp.int32))
            if self.float16:
                new["loss_scale"], new["good_steps"] = update.update_loss_scale(
                    state["loss_scale"], state["good_steps"], finite)
            return new, update.step_sums(sums, loss, norm, finite)

        return step

    def eval_fn(self, phase: int = 0, seed_offset: int = 1):
        """(state, batch) -> the loss and metric sums without dropout, the draws of
        `seed_offset` (evaluation's, apart from training's)."""

        def step(state, batch):
            seed = rng.step_seed(state["base_seed"] + seed_offset, state["step"], 0)
            loss, sums = self._loss_of(state["params"], state["frozen"], batch, seed,
                                       self.context(batch), False, phase, state["step"])
            return dict(sums, loss_sum=loss, steps=jnp.ones([], jnp.float32))

        return step

    def compile_train(self, phase: int = 0, donate: bool = True):
        """`train_fn` jitted: the state replicated and donated, the batch split by rows.
        Call it as `step(state, batch)`: the schedule's lengths are passed in."""
        rep, rows = replicated(self.mesh), batch_sharding(self.mesh)
        jitted = jax.jit(self.train_fn(phase), in_shardings=(rep, rows, rep),
                         out_shardings=(rep, rep), donate_argnums=(0,) if donate else ())
        lengths = jax.device_put(self.rule.lengths(), rep)

        def step(state, batch):
            return jitted(state, batch, lengths)

        step.jitted = jitted  # (state, batch, lengths): for lowering and inspection
        return step

    def compile_eval(self, phase: int = 0):
        rep, rows = replicated(self.mesh), batch_sharding(self.mesh)
        return jax.jit(self.eval_fn(phase), in_shardings=(rep, rows), out_shardings=rep)

    def place_state(self, state):
        return jax.device_put(state, replicated(self.mesh))

    def place_batch(self, batch: Dict[str, np.ndarray]):
        """A host's rows of the global batch -> global arrays split over the mesh (one
        process: the whole batch; several: each gives its own consecutive share)."""
        sharding = batch_sharding(self.mesh)
        return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
                for k, v in batch.items()}


# --------------------------------------------------------------------------- input


class BatchesAhead:
    """The batches of `source` (an iterator of host batches) placed on the devices by a
    thread, up to `depth` ahead of the step that takes them: reading the pipeline,
    converting and sending a batch overlap the steps instead of sitting between them
    (ELECTRA-Small on an H200 took 13.8 ms a step and the host ~19 ms a batch). What the
    source raises (a bad shard, the end of a finite split) comes out of `next` at the batch
    where it happened. The data position is the host loop's count of batches taken, so the
    batches read ahead and never taken change nothing a checkpoint holds."""

    _END = object()
    # Readers not closed yet: closed before the interpreter stops its threads. A daemon
    # thread stopped there while holding placed batches aborts the process (jaxlib's array
    # destructor during the forced unwind: "FATAL: exception not rethrown").
    _open: "weakref.WeakSet[BatchesAhead]" = weakref.WeakSet()
    JOIN_TIMEOUT_S = 30.0

    def __init__(self, source, place: Callable, depth: int = 2):
        self.source, self._place = source, place
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="jax-batches-ahead",
                                        daemon=True)
        BatchesAhead._open.add(self)
        self._thread.start()

    def _fill(self):
        while not self._closed.is_set():
            try:
                item = self._place(next(self.source))
            except StopIteration:
                item = self._END
            except BaseException as e:  # noqa: BLE001  (handed to the taker, raised there)
                item = e
            while not self._closed.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item is self._END or isinstance(item, BaseException):
                return

    def __iter__(self):
        return self

    def __next__(self):
        item = self._queue.get()
        if item is self._END or isinstance(item, BaseException):
            self._queue.put(item)  # every later `next` ends or raises the same
            if item is self._END:
                raise StopIteration
            raise item
        return item

    def close(self):
        """Stops the thread after the batch it is reading (it holds the source till then),
        waits for it (up to JOIN_TIMEOUT_S: a read that hangs does not hang the job) and
        frees the batches it placed and nobody took, on this thread."""
        self._closed.set()
        BatchesAhead._open.discard(self)
        if self._thread is not threading.current_thread():
            self._thread.join(self.JOIN_TIMEOUT_S)
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break

    @classmethod
    def close_all(cls):
        for ahead in list(cls._open):
            ahead.close()


atexit.register(BatchesAhead.close_all)


def names_of(variables: Sequence) -> List[str]:
    return [v.path for v in variables]
