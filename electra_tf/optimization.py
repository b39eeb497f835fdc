"""Learning-rate schedule, AdamW and LAMB as explicit update rules, clipping, accumulation.

Everything here is plain TensorFlow on `tf.Variable`s, so that one train step (forward,
backward, clipping, update) can live in a single `tf.function(jit_compile=True)` that runs
through `strategy.run` under any `tf.distribute` strategy (TPU, Mirrored, one device).

* `WarmupPolynomialDecay`: the official ELECTRA schedule,
  lr(step) = polynomial_decay(lr, step, total, end, power) * min(1, step / warmup).
* `AdamW`: the official ELECTRA optimizer (no bias correction by default, decoupled weight
  decay skipping LayerNorm and bias variables). `LAMB`: You et al. (2019), Algorithm 2.
  Slots are `tf.Variable`s named `<var>/adam_m` and `<var>/adam_v`, the names of the slots
  in the official TF1 training checkpoints (`slot_variables()` maps names to slots).
* `clip_by_global_norm`, `all_reduce_gradients`, `GradientAccumulator`: helpers for the
  train step.

A train step under a strategy (replica function passed to `strategy.run`):

    with tf.GradientTape() as tape:
        loss = model_loss(batch)                        # mean over the replica's batch
    grads = tape.gradient(loss, variables)
    grads = all_reduce_gradients(grads)                 # mean over replicas
    grads, norm = clip_by_global_norm(grads, 1.0)
    optimizer.apply_gradients(zip(grads, variables), step)

`apply_gradients` does not all-reduce: it expects the same gradients on every replica.
Call `optimizer.build(variables)` once, eagerly, under `strategy.scope()`, before tracing.
"""

import functools
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf

DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


# --------------------------------------------------------------------------- schedule

def warmup_polynomial_decay(step, learning_rate: float, total_steps: int, warmup_steps: int = 0,
                            end_learning_rate: float = 0.0, power: float = 1.0) -> tf.Tensor:
    """The official ELECTRA learning rate at `step` (a scalar tensor, any numeric dtype).

    decay = (lr - end) * (1 - min(step, total) / total) ** power + end   (TF1 polynomial_decay,
    cycle=False), then, when warmup_steps > 0, lr = decay * min(1, step / warmup_steps).
    Warmup multiplies the decayed value, as in the official code. Returns float32.
    """
    step = tf.cast(step, tf.float32)
    total = float(max(1, int(total_steps)))
    progress = tf.minimum(step, total) / total
    lr = (float(learning_rate) - float(end_learning_rate)) * tf.pow(
        1.0 - progress, float(power)) + float(end_learning_rate)
    if warmup_steps and warmup_steps > 0:
        lr = lr * tf.minimum(1.0, step / float(warmup_steps))
    return lr


class WarmupPolynomialDecay:
    """Callable schedule `step -> float32 lr`; see `warmup_polynomial_decay`."""

    def __init__(self, learning_rate: float, total_steps: int, warmup_steps: int = 0,
                 end_learning_rate: float = 0.0, power: float = 1.0):
        self.learning_rate = float(learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)

    def __call__(self, step) -> tf.Tensor:
        return warmup_polynomial_decay(step, self.learning_rate, self.total_steps,
                                       self.warmup_steps, self.end_learning_rate, self.power)

    def get_config(self) -> Dict[str, Any]:
        return dict(learning_rate=self.learning_rate, total_steps=self.total_steps,
                    warmup_steps=self.warmup_steps, end_learning_rate=self.end_learning_rate,
                    power=self.power)

    def __repr__(self):
        return "WarmupPolynomialDecay(" + ", ".join(
            f"{k}={v}" for k, v in self.get_config().items()) + ")"


# --------------------------------------------------------------------------- variables

def _tf_variable(variable):
    """The `tf.Variable` (possibly a distributed one) behind a TF or Keras 3 variable."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)  # keras.Variable on the TF backend
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(f"expected a tf.Variable or a keras.Variable, got {type(variable).__name__}")


def variable_name(variable) -> str:
    """The name used for exclusion patterns and slot names: a Keras 3 variable's `path`
    (e.g. `electra/encoder/layer_0/output/dense/kernel`), else the tf name without `:0`."""
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    return re.sub(r":\d+$", "", _tf_variable(variable).name)


def _dense(grad):
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


class _Entry:
    """What the optimizer knows about one trained variable (plain object: not tracked)."""

    def __init__(self, variable, name: str, excluded: bool, decay: bool, m, v):
        self.variable = variable
        self.tf_variable = _tf_variable(variable)
        self.name = name
        self.excluded = excluded  # matches exclude_from_weight_decay
        self.decay = decay  # weight decay applied (not excluded and weight_decay != 0)
        self.m = m
        self.v = v


class _State:
    """Plain container, so that tf.Module does not track the bookkeeping."""

    def __init__(self):
        self.entries: List[_Entry] = []
        self.by_id: Dict[int, int] = {}
        self.by_name: Dict[str, int] = {}


def _variable_strategy(tf_var):
    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    return getattr(tf_var, "distribute_strategy", None) or tf.distribute.get_strategy()


def _zeros_like_variable(tf_var, name: str, dtype=None, synchronization=None, aggregation=None):
    """A non-trainable zeros variable shaped like `tf_var`, created in its strategy's scope
    (mirrored under MirroredStrategy/TPUStrategy) and colocated with it."""
    strategy = _variable_strategy(tf_var)
    shape = tf_var.shape
    dtype = dtype or tf_var.dtype
    kwargs = {}
    if synchronization is not None:
        kwargs.update(synchronization=synchronization, aggregation=aggregation)
    with strategy.scope(), strategy.extended.colocate_vars_with(tf_var):
        return tf.Variable(lambda: tf.zeros(shape, dtype), trainable=False, name=name, **kwargs)


LrMultipliers = Union[Mapping[Any, float], Iterable[Tuple[Any, float]], None]


# --------------------------------------------------------------------------- optimizers

class _AdamFamily(tf.Module):
    """Shared state and distribution plumbing of AdamW and LAMB."""

    def __init__(self, learning_rate_fn: Union[Callable, float], weight_decay: float,
                 beta_1: float, beta_2: float, epsilon: float, bias_correction: bool,
                 exclude_from_weight_decay: Optional[Sequence[str]], name: str):
        super().__init__(name=name)
        if callable(learning_rate_fn):
            self.learning_rate_fn = learning_rate_fn
        else:
            constant = float(learning_rate_fn)
            self.learning_rate_fn = lambda step: tf.constant(constant, tf.float32)
        self.weight_decay = float(weight_decay)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.bias_correction = bool(bias_correction)
        self.exclude_from_weight_decay = tuple(exclude_from_weight_decay or ())
        self._state = _State()
        # Slots keyed by their TF1 names; tracked, so tf.train.Checkpoint saves them.
        self.adam_m: Dict[str, tf.Variable] = {}
        self.adam_v: Dict[str, tf.Variable] = {}

    # ------------------------------------------------------------------ build

    def is_excluded(self, name: str) -> bool:
        """Whether a variable name matches `exclude_from_weight_decay` (regex search, as the
        official `_do_use_weight_decay`)."""
        return any(re.search(pattern, name) for pattern in self.exclude_from_weight_decay)

    def build(self, variables: Iterable) -> "_AdamFamily":
        """Creates m and v for each new variable (zeros, non-trainable, named
        `<var>/adam_m`, `<var>/adam_v`) and fixes its weight-decay flag from its name.

        Call eagerly, under the strategy scope the variables were created in (the slots then
        are mirrored the same way). Variables already built are skipped, so it can be called
        again with extra variables (a new task head)."""
        state = self._state
        for variable in variables:
            tf_var = _tf_variable(variable)
            if id(tf_var) in state.by_id:
                continue
            name = variable_name(variable)
            if name in state.by_name:
                raise ValueError(f"two different variables are both named {name!r}; slot names "
                                 "must be unique")
            excluded = self.is_excluded(name)
            m = _zeros_like_variable(tf_var, f"{name}/adam_m")
            v = _zeros_like_variable(tf_var, f"{name}/adam_v")
            self.adam_m[f"{name}/adam_m"] = m
            self.adam_v[f"{name}/adam_v"] = v
            state.by_id[id(tf_var)] = len(state.entries)
            state.by_name[name] = len(state.entries)
            state.entries.append(_Entry(variable, name, excluded,
                                        decay=self.weight_decay != 0.0 and not excluded, m=m, v=v))
        return self

    @property
    def built(self) -> bool:
        return bool(self._state.entries)

    def slot_variables(self) -> Dict[str, tf.Variable]:
        """{'<var>/adam_m': m, '<var>/adam_v': v} in build order (the TF1 checkpoint names)."""
        out = {}
        for e in self._state.entries:
            out[f"{e.name}/adam_m"] = e.m
            out[f"{e.name}/adam_v"] = e.v
        return out

    def get_slot(self, variable, slot: str) -> tf.Variable:
        """`slot` is 'm' / 'adam_m' or 'v' / 'adam_v'."""
        entry = self._entry(variable)
        if slot in ("m", "adam_m"):
            return entry.m
        if slot in ("v", "adam_v"):
            return entry.v
        raise ValueError(f"unknown slot {slot!r}: expected m or v")

    def weight_decay_flags(self) -> Dict[str, bool]:
        """{variable name: whether weight decay is applied to it}."""
        return {e.name: e.decay for e in self._state.entries}

    def _entry(self, variable) -> _Entry:
        index = self._state.by_id.get(id(_tf_variable(variable)))
        if index is None:
            raise ValueError(f"variable {variable_name(variable)!r} was not passed to "
                             f"{type(self).__name__}.build()")
        return self._state.entries[index]

    def _resolve_multipliers(self, lr_multipliers: LrMultipliers) -> Dict[int, float]:
        """{entry index: multiplier}; keys may be variables (TF or Keras), `var.ref()`
        references or variable names. A key naming no built variable is an error."""
        if not lr_multipliers:
            return {}
        items = lr_multipliers.items() if isinstance(lr_multipliers, Mapping) else lr_multipliers
        out = {}
        for key, multiplier in items:
            if isinstance(key, str):
                index = self._state.by_name.get(key)
                if index is None:
                    raise ValueError(f"lr multiplier for unknown variable name {key!r}")
            else:
                if hasattr(key, "deref") and not isinstance(key, tf.Variable):
                    key = key.deref()
                index = self._state.by_id.get(id(_tf_variable(key)))
                if index is None:
                    raise ValueError(f"lr multiplier for variable {variable_name(key)!r} that "
                                     "was not built")
            out[index] = multiplier
        return out

    # ------------------------------------------------------------------ update

    def learning_rate(self, step) -> tf.Tensor:
        return tf.cast(self.learning_rate_fn(step), tf.float32)

    def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]], step,
                        lr_multipliers: LrMultipliers = None, should_update=None):
        """Updates the variables (and m, v) in place from gradients.

        grads_and_vars: (gradient, variable) pairs; None gradients are skipped; IndexedSlices
          are densified. Gradients must already be aggregated over replicas.
        step: the number of updates applied so far (the global step before this update):
          lr = learning_rate_fn(step), bias correction uses t = step + 1. Not incremented here.
        lr_multipliers: optional {variable | var.ref() | name: float}, or (variable, float)
          pairs, scaling the learning rate per variable (layer-wise decay).
        should_update: optional boolean scalar tensor; where False nothing changes (selects,
          not a branch: usable in XLA and in replica context, e.g. to skip a non-finite step).

        Works eagerly, in a tf.function (jit_compile too), in cross-replica context, and in
        replica context under `strategy.run` (one merge_call for all variables, or none
        where the strategy runs without merge_call).
        """
        grads_and_vars = list(grads_and_vars)
        if not self.built and tf.executing_eagerly() and not tf.distribute.has_strategy():
            self.build(v for _, v in grads_and_vars)  # convenience for eager, one device
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            return None
        indices = [self._state.by_id.get(id(_tf_variable(v)), None) for _, v in pairs]
        missing = [variable_name(v) for (_, v), i in zip(pairs, indices) if i is None]
        if missing:
            raise ValueError(f"{type(self).__name__}.build() was not called for {missing[:5]}"
                             f"{' ...' if len(missing) > 5 else ''}; build the optimizer "
                             "eagerly, under the strategy scope, before the train step")
        multipliers = self._resolve_multipliers(lr_multipliers)
        step = tf.convert_to_tensor(step)
        scalars = self._step_scalars(step)
        if should_update is not None:
            scalars["should_update"] = tf.cast(should_update, tf.bool)
        # Multipliers travel as tensors through merge_call (never as closures over tensors).
        mults = [tf.cast(multipliers[i], tf.float32) if i in multipliers else None
                 for i in indices]
        grads = [_dense(g) for g, _ in pairs]

        def distributed_update(strategy, grads, mults, scalars):
            for index, grad, mult in zip(indices, grads, mults):
                entry = self._state.entries[index]
                strategy.extended.update(
                    entry.tf_variable, functools.partial(self._update_variable, entry),
                    args=(grad, mult, scalars), group=False)

        if tf.distribute.in_cross_replica_context():
            distributed_update(tf.distribute.get_strategy(), grads, mults, scalars)
        else:
            tf.__internal__.distribute.interim.maybe_merge_call(
                distributed_update, tf.distribute.get_strategy(), grads, mults, scalars)
        return None

    def _step_scalars(self, step) -> Dict[str, tf.Tensor]:
        scalars = {"lr": self.learning_rate(step)}
        if self.bias_correction:
            t = tf.cast(step, tf.float32) + 1.0
            scalars["m_correction"] = 1.0 - tf.pow(self.beta_1, t)
            scalars["v_correction"] = 1.0 - tf.pow(self.beta_2, t)
        return scalars

    def _update_variable(self, entry: _Entry, var, grad, mult, scalars):
        """Runs once per device copy of `var` (m and v resolve to the same device's copy)."""
        dtype = var.dtype
        grad = tf.cast(grad, dtype)
        param = tf.convert_to_tensor(var)
        m_old = tf.convert_to_tensor(entry.m)
        v_old = tf.convert_to_tensor(entry.v)
        m = self.beta_1 * m_old + (1.0 - self.beta_1) * grad
        v = self.beta_2 * v_old + (1.0 - self.beta_2) * tf.square(grad)
        if self.bias_correction:
            m_hat = m / tf.cast(scalars["m_correction"], dtype)
            v_hat = v / tf.cast(scalars["v_correction"], dtype)
        else:
            m_hat, v_hat = m, v
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        if entry.decay:
            update = update + self.weight_decay * param
        lr = scalars["lr"] if mult is None else scalars["lr"] * mult
        step_size = self._step_size(entry, param, update, tf.cast(lr, dtype))
        new_param = param - step_size * update
        if "should_update" in scalars:
            ok = scalars["should_update"]
            m = tf.where(ok, m, m_old)
            v = tf.where(ok, v, v_old)
            new_param = tf.where(ok, new_param, param)
        entry.m.assign(m)
        entry.v.assign(v)
        var.assign(new_param)

    def _step_size(self, entry, param, update, lr):
        return lr


class AdamW(_AdamFamily):
    """The official ELECTRA `AdamWeightDecayOptimizer`:

        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        update = m / (sqrt(v) + eps)        (m / (1 - b1^t), v / (1 - b2^t) if bias_correction)
        update += weight_decay * param      (unless the name matches exclude_from_weight_decay)
        param -= lr * update
    """

    def __init__(self, learning_rate_fn: Union[Callable, float], weight_decay: float = 0.01,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
                 bias_correction: bool = False,
                 exclude_from_weight_decay: Optional[Sequence[str]] =
                 DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY, name: str = "adamw"):
        super().__init__(learning_rate_fn, weight_decay, beta_1, beta_2, epsilon,
                         bias_correction, exclude_from_weight_decay, name)


class LAMB(_AdamFamily):
    """LAMB (You et al. 2019, Algorithm 2) with the same m, v and bias correction:

        r = m_hat / (sqrt(v_hat) + eps) + weight_decay * param   (decay unless excluded)
        trust = ||param|| / ||r||   (1 if either norm is 0, and 1 for excluded variables)
        param -= lr * trust * r
    """

    def __init__(self, learning_rate_fn: Union[Callable, float], weight_decay: float = 0.01,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
                 bias_correction: bool = True,
                 exclude_from_weight_decay: Optional[Sequence[str]] =
                 DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY, name: str = "lamb"):
        super().__init__(learning_rate_fn, weight_decay, beta_1, beta_2, epsilon,
                         bias_correction, exclude_from_weight_decay, name)

    def _step_size(self, entry, param, update, lr):
        if entry.excluded:
            return lr
        return lr * trust_ratio(param, update)


def trust_ratio(param, update) -> tf.Tensor:
    """||param|| / ||update||, or 1 when either norm is 0 (float32 norms)."""
    w = tf.norm(tf.cast(param, tf.float32))
    r = tf.norm(tf.cast(update, tf.float32))
    ok = tf.logical_and(w > 0.0, r > 0.0)
    return tf.cast(tf.where(ok, w / tf.where(ok, r, 1.0), 1.0), param.dtype)


# --------------------------------------------------------------------------- gradients

def global_norm(grads: Sequence) -> tf.Tensor:
    """sqrt(sum of squares) over all non-None gradients, in float32."""
    squares = []
    for g in grads:
        if g is None:
            continue
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        squares.append(tf.reduce_sum(tf.square(tf.cast(values, tf.float32))))
    if not squares:
        return tf.constant(0.0, tf.float32)
    return tf.sqrt(tf.add_n(squares))


def clip_by_global_norm(grads: Sequence, clip_norm: float = 1.0) -> Tuple[List, tf.Tensor]:
    """Scales the gradients by min(1, clip_norm / global_norm); returns (grads, global_norm).

    global_norm is that of the gradients given (before clipping). None gradients stay None;
    IndexedSlices stay IndexedSlices (values scaled; duplicate indices count separately in the
    norm, as tf.clip_by_global_norm does). clip_norm <= 0 or None: no clipping.

    Non-finite norm (a NaN or inf anywhere): unlike tf.clip_by_global_norm, which turns every
    gradient into NaN, the returned gradients are all zeros and the returned norm is the
    non-finite value, so NaNs do not reach m, v or the weights. Zero gradients still let
    AdamW/LAMB move the weights (momentum, weight decay); to skip the step entirely pass
    `should_update=tf.math.is_finite(norm)` to `apply_gradients`.
    """
    grads = list(grads)
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    if clip_norm is None or clip_norm <= 0:
        scale = tf.constant(1.0, tf.float32)
    else:
        safe_norm = tf.where(finite, norm, 1.0)
        scale = float(clip_norm) / tf.maximum(safe_norm, float(clip_norm))
    scale = tf.where(finite, scale, 0.0)

    def _scale(values):
        scaled = values * tf.cast(scale, values.dtype)
        # 0 * inf = NaN: select zeros explicitly when the norm is not finite.
        return tf.where(finite, scaled, tf.zeros_like(values))

    out = []
    for g in grads:
        if g is None:
            out.append(None)
        elif isinstance(g, tf.IndexedSlices):
            out.append(tf.IndexedSlices(_scale(g.values), g.indices, g.dense_shape))
        else:
            out.append(_scale(g))
    return out, norm


def all_reduce_gradients(grads: Sequence, reduce_op: str = "mean") -> List:
    """All-reduces gradients over replicas ('mean' or 'sum') in replica context; identity
    outside `strategy.run` or with one replica. None stays None; IndexedSlices are
    densified first (XLA- and TPU-friendly)."""
    ctx = tf.distribute.get_replica_context()
    grads = list(grads)
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return grads
    op = {"mean": tf.distribute.ReduceOp.MEAN, "sum": tf.distribute.ReduceOp.SUM}[reduce_op]
    present = [i for i, g in enumerate(grads) if g is not None]
    reduced = ctx.all_reduce(op, [_dense(grads[i]) for i in present])
    out = list(grads)
    for i, g in zip(present, reduced):
        out[i] = g
    return out


class GradientAccumulator(tf.Module):
    """Accumulates gradients over `steps` micro-batches; the result is their mean.

    The accumulators are zeros-initialised `tf.Variable`s shaped like the trained ones,
    replica-local (`ON_READ`) under a strategy, so accumulating needs no communication;
    all-reduce the mean once, before clipping and the update.

    Two ways to use it:
    * inside one train step (XLA/TPU friendly): `accumulate_microbatches(grad_fn, batch)`
      splits the replica's batch into `steps` micro-batches and loops with tf.while_loop;
    * across calls: `accumulate(grads)` on each micro-step, and every `steps` micro-steps
      (`ready()` is true, or the host counts) apply `gradients()` and `reset()`.
    """

    def __init__(self, steps: int, name: str = "gradient_accumulator"):
        super().__init__(name=name)
        if int(steps) < 1:
            raise ValueError(f"gradient accumulation steps={steps} must be at least 1")
        self.steps = int(steps)
        self._state = _State()
        self.accumulators: List[tf.Variable] = []
        self.counter: Optional[tf.Variable] = None

    def build(self, variables: Iterable) -> "GradientAccumulator":
        """Creates one accumulator per variable (call eagerly under the strategy scope)."""
        if self._state.entries:
            raise ValueError("GradientAccumulator.build() was already called")
        accumulators = []
        for variable in variables:
            tf_var = _tf_variable(variable)
            name = variable_name(variable)
            acc = _zeros_like_variable(
                tf_var, f"{name}/grad_accum", synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM)
            self._state.entries.append(_Entry(variable, name, False, False, acc, None))
            accumulators.append(acc)
        self.accumulators = accumulators
        strategy = tf.distribute.get_strategy()
        with strategy.scope():
            self.counter = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="grad_accum_counter",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        return self

    def accumulate(self, grads: Sequence):
        """Adds gradients (in the order of `build`) to the accumulators; None adds nothing."""
        grads = list(grads)
        if len(grads) != len(self.accumulators):
            raise ValueError(f"got {len(grads)} gradients for {len(self.accumulators)} "
                             "accumulators")
        for acc, g in zip(self.accumulators, grads):
            if g is not None:
                acc.assign_add(tf.cast(_dense(g), acc.dtype))
        self.counter.assign_add(1)

    def gradients(self) -> List[tf.Tensor]:
        """The mean accumulated gradient: sum / steps (replica-local in replica context)."""
        return [tf.convert_to_tensor(acc) / float(self.steps) for acc in self.accumulators]

    def ready(self) -> tf.Tensor:
        """True once `steps` micro-batches have been accumulated since the last reset."""
        return tf.convert_to_tensor(self.counter) >= self.steps

    def reset(self):
        for acc in self.accumulators:
            acc.assign(tf.zeros(acc.shape, acc.dtype))
        self.counter.assign(0)

    def accumulate_microbatches(self, grad_fn: Callable, batch, aux_spec: Any = "scalar"):
        """Mean gradient (and mean aux) over `steps` equal slices of `batch`.

        grad_fn(micro_batch) -> (grads, aux): grads in the order of `build`; aux matches
        `aux_spec`: nested tf.TensorSpec; "scalar" (default) = a float32 scalar such as the
        loss; None = no aux (grad_fn still returns a pair, aux ignored). Floating aux values
        are averaged over micro-batches, integer ones summed. `batch`: nested tensors whose
        first dimension is divisible by `steps`.
        grad_fn must not synchronise replicas (no all-reduce inside). Resets the
        accumulators first; returns (mean_grads, mean_aux).
        """
        k = self.steps
        if aux_spec is None:
            def grads_only(micro):
                return grad_fn(micro)[0], tf.constant(0.0)

            mean_grads, _ = self.accumulate_microbatches(grads_only, batch)
            return mean_grads, None
        if isinstance(aux_spec, str) and aux_spec == "scalar":
            aux_spec = tf.TensorSpec([], tf.float32)
        self.reset()
        stacked = tf.nest.map_structure(functools.partial(_split_leading, k=k), batch)
        aux_zero = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), aux_spec)

        def body(i, aux_sum):
            micro = tf.nest.map_structure(lambda t: tf.gather(t, i), stacked)
            grads, aux = grad_fn(micro)
            self.accumulate(grads)
            aux_sum = tf.nest.map_structure(
                lambda s, a, spec: s + tf.cast(a, spec.dtype), aux_sum, aux, aux_spec)
            return i + 1, aux_sum

        _, aux_sum = tf.while_loop(lambda i, _: i < k, body, (tf.constant(0), aux_zero),
                                   maximum_iterations=k, parallel_iterations=1)
        aux_mean = tf.nest.map_structure(
            lambda s: s / tf.cast(k, s.dtype) if s.dtype.is_floating else s, aux_sum)
        return self.gradients(), aux_mean


def _split_leading(t, k: int):
    """[B, ...] -> [k, B/k, ...] (static shapes kept where known)."""
    t = tf.convert_to_tensor(t)
    batch = t.shape[0]
    if batch is not None and batch % k:
        raise ValueError(f"batch dimension {batch} is not divisible by {k} micro-batches")
    rest = t.shape[1:]
    if rest.is_fully_defined():
        return tf.reshape(t, [k, -1] + rest.as_list())
    return tf.reshape(t, tf.concat([[k, -1], tf.shape(t)[1:]], 0))


# --------------------------------------------------------------------------- factory

def make_optimizer(config, total_steps: int) -> _AdamFamily:
    """AdamW or LAMB from an `OptimizerConfig`, with the warmup + polynomial decay schedule.

    `config.bias_correction` applies to AdamW (official: off); LAMB always corrects, as in the
    paper. `config.clip_norm` is for `clip_by_global_norm` in the train step.
    """
    schedule = WarmupPolynomialDecay(config.learning_rate, total_steps, config.warmup_steps,
                                     config.end_learning_rate, config.lr_decay_power)
    common = dict(weight_decay=config.weight_decay, beta_1=config.beta_1, beta_2=config.beta_2,
                  epsilon=config.epsilon)
    if config.optimizer == "adamw":
        return AdamW(schedule, bias_correction=config.bias_correction, **common)
    if config.optimizer == "lamb":
        return LAMB(schedule, bias_correction=True, **common)
    raise ValueError(f"optimizer={config.optimizer!r}: expected adamw or lamb")


def update_loss_scale(scale: tf.Variable, good_steps: tf.Variable, finite,
                      growth_interval: int = 2000):
    """Dynamic loss scaling (float16): halve `scale` after a non-finite step (not below 1),
    double it after `growth_interval` finite steps in a row (`good_steps` counts them)."""
    good = tf.where(finite, good_steps + 1, 0)
    grow = good >= growth_interval
    scale.assign(tf.where(finite, tf.where(grow, scale * 2.0, scale),
                          tf.maximum(scale / 2.0, 1.0)))
    good_steps.assign(tf.where(grow, tf.zeros_like(good), good))

