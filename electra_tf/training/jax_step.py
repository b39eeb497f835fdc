"""The JAX runtime's compiled train step, without TensorFlow: the job's loss in micro-batches,
then the step tail of the TensorFlow runtime (`training/trainer.py`) with the same semantics:
unscale, clip by the global norm, skip a non-finite step (counted, nothing applied), AdamW
without bias correction or LAMB (`training/optimization.py`'s update rules), layer-wise
learning-rate multipliers, float16 loss scaling. One `jax.jit` over the global batch: the
state is replicated on a 1-D `data` mesh of every device (every process's, under
`jax.distributed`), the batch is split over it by rows, and XLA inserts the gradient
all-reduce. The state is passed in and out and donated, so its memory is not doubled.

`jax_trainer.py` puts the host loop, checkpoints and input around it (the batches placed
ahead by `BatchesAhead`); `bench/` times it
alone (a GPU machine has no TensorFlow)."""

import dataclasses
import queue
import re
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from electra_tf import rng
from electra_tf.training.schedule import (DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY,
                                          WarmupPolynomialDecay)

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
    """AdamW / LAMB hyper-parameters and the per-variable flags of `optimization.py`'s
    `_AdamFamily` (same names, same update): `decay[i]` weight decay applies to variable i,
    `excluded[i]` its name matches exclude_from_weight_decay, `multipliers[i]` its learning
    rate multiplier (1.0: none)."""
    kind: str  # "adamw" or "lamb"
    schedule: WarmupPolynomialDecay
    weight_decay: float
    beta_1: float
    beta_2: float
    epsilon: float
    bias_correction: bool
    decay: Tuple[bool, ...]
    excluded: Tuple[bool, ...]
    multipliers: Tuple[float, ...]

    @classmethod
    def of(cls, config, total_steps: int, names: Sequence[str],
           multipliers: Optional[Dict[str, float]] = None) -> "UpdateRule":
        """From an `OptimizerConfig` (as `optimization.make_optimizer` reads it: LAMB always
        bias-corrects) for the variables `names` (Keras paths), with `multipliers`
        {name: learning-rate multiplier}."""
        if config.optimizer not in ("adamw", "lamb"):
            raise ValueError(f"optimizer={config.optimizer!r}: expected adamw or lamb")
        schedule = WarmupPolynomialDecay(config.learning_rate, total_steps, config.warmup_steps,
                                         config.end_learning_rate, config.lr_decay_power)
        excluded = tuple(any(re.search(p, n) for p in DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY)
                         for n in names)
        multipliers = multipliers or {}
        unknown = sorted(set(multipliers) - set(names))
        if unknown:
            raise ValueError(f"lr multiplier for unknown variable name {unknown[0]!r}")
        wd = float(config.weight_decay)
        return cls(config.optimizer, schedule, wd, float(config.beta_1), float(config.beta_2),
                   float(config.epsilon),
                   True if config.optimizer == "lamb" else bool(config.bias_correction),
                   tuple(wd != 0.0 and not e for e in excluded), excluded,
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
        """-> (params, m, v) after one update from summed gradients; where `ok` is False
        the old values (selects, not a branch)."""
        f32 = jnp.float32
        lr = self.learning_rate(step, lengths)
        b1, b2 = f32(self.beta_1), f32(self.beta_2)
        if self.bias_correction:
            t = jnp.asarray(step, f32) + 1.0
            m_corr, v_corr = 1.0 - jnp.power(b1, t), 1.0 - jnp.power(b2, t)
        out_p, out_m, out_v = [], [], []
        for i, (p, g, m0, v0) in enumerate(zip(params, grads, m, v)):
            dtype = p.dtype
            g = g * grad_scale.astype(g.dtype)
            g = jnp.where(ok, g, jnp.zeros([], g.dtype)).astype(dtype)
            m1 = b1 * m0 + f32(1.0 - self.beta_1) * g
            v1 = b2 * v0 + f32(1.0 - self.beta_2) * jnp.square(g)
            m_hat, v_hat = (m1 / m_corr, v1 / v_corr) if self.bias_correction else (m1, v1)
            update = m_hat / (jnp.sqrt(v_hat) + f32(self.epsilon))
            if self.decay[i]:
                update = update + f32(self.weight_decay) * p
            rate = lr if self.multipliers[i] == 1.0 else lr * f32(self.multipliers[i])
            if self.kind == "lamb" and not self.excluded[i]:
                rate = rate * trust_ratio(p, update)
            new_p = p - rate.astype(dtype) * update
            out_p.append(jnp.where(ok, new_p, p))
            out_m.append(jnp.where(ok, m1, m0))
            out_v.append(jnp.where(ok, v1, v0))
        return out_p, out_m, out_v


def trust_ratio(param, update):
    """||param|| / ||update||, or 1 when either norm is 0 (LAMB)."""
    w = jnp.linalg.norm(param.astype(jnp.float32))
    r = jnp.linalg.norm(update.astype(jnp.float32))
    ok = (w > 0.0) & (r > 0.0)
    return jnp.where(ok, w / jnp.where(ok, r, 1.0), 1.0)


def global_norm(grads) -> jax.Array:
    """sqrt(sum of squares) over all gradients, in float32."""
    total = jnp.zeros([], jnp.float32)
    for g in grads:
        total = total + jnp.sum(jnp.square(g.astype(jnp.float32)))
    return jnp.sqrt(total)


def clip_scale(norm, clip_norm: Optional[float]):
    """min(1, clip_norm / norm) (1 without clipping), 0 for a non-finite norm."""
    finite = jnp.isfinite(norm)
    if clip_norm is None or clip_norm <= 0:
        scale = jnp.ones([], jnp.float32)
    else:
        scale = f32c(clip_norm) / jnp.maximum(jnp.where(finite, norm, 1.0), f32c(clip_norm))
    return jnp.where(finite, scale, 0.0)


def f32c(x):
    return jnp.asarray(x, jnp.float32)


def update_loss_scale(scale, good_steps, finite, growth_interval: int = 2000):
    """float16's dynamic loss scale: halve after a non-finite step (not below 1), double
    after `growth_interval` finite steps in a row."""
    good = jnp.where(finite, good_steps + 1, 0)
    grow = good >= growth_interval
    scale = jnp.where(finite, jnp.where(grow, scale * 2.0, scale), jnp.maximum(scale / 2.0, 1.0))
    return scale, jnp.where(grow, jnp.zeros_like(good), good)


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
        "loss_scale": jnp.asarray(2.0 ** 15 if float16 else 1.0, jnp.float32),
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
            if self.float16:
                grads = [g * (1.0 / state["loss_scale"]) for g in grads]
            norm = global_norm(grads)
            finite = jnp.isfinite(norm)
            scale = clip_scale(norm, self.clip_norm)
            params, m, v = self.rule.apply(state["params"], grads, state["m"], state["v"],
                                           state["step"], scale, finite, lengths)
            new = dict(state, params=params, m=m, v=v,
                       step=state["step"] + finite.astype(jnp.int32))
            if self.float16:
                new["loss_scale"], new["good_steps"] = update_loss_scale(
                    state["loss_scale"], state["good_steps"], finite)
            sums = dict(sums, loss_sum=loss, steps=jnp.ones([], jnp.float32),
                        grad_norm_sum=jnp.where(finite, norm, 0.0),
                        skipped=1.0 - finite.astype(jnp.float32))
            return new, sums

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

    def __init__(self, source, place: Callable, depth: int = 2):
        self.source, self._place = source, place
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="jax-batches-ahead",
                                        daemon=True)
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
        """Stops the thread after the batch it is reading (it holds the source till then)."""
        self._closed.set()


def names_of(variables: Sequence) -> List[str]:
    return [v.path for v in variables]
