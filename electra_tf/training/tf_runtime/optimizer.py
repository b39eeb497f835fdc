"""The TensorFlow runtime's optimizer: AdamW and LAMB as `update.py`'s rule applied per
variable under any `tf.distribute` strategy (slot variables `<var>/adam_m` and
`<var>/adam_v`, as in the official TF1 checkpoints; one XLA kernel per variable where the
step runs outside XLA), the schedule read from a variable, and the gradients' all-reduce."""

import dataclasses
import functools
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf

from electra_tf import compat
from electra_tf.training import update

from electra_tf.training.schedule import (  # noqa: F401 (re-exported)
    DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY, WarmupPolynomialDecay)


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


@dataclasses.dataclass
class _Entry:
    """What the optimizer knows about one trained variable (plain object: not tracked)."""
    tf_variable: tf.Variable
    name: str
    excluded: bool  # matches exclude_from_weight_decay
    decay: bool  # weight decay applied (not excluded and weight_decay != 0)
    m: tf.Variable
    v: tf.Variable


@dataclasses.dataclass
class _State:
    """Plain container, so that tf.Module does not track the bookkeeping."""
    entries: List[_Entry] = dataclasses.field(default_factory=list)
    by_id: Dict[int, int] = dataclasses.field(default_factory=dict)
    by_name: Dict[str, int] = dataclasses.field(default_factory=dict)
    kernel: Optional[Callable] = None  # `_new_values` as one XLA kernel (graphs outside XLA)


def _zeros_like_variable(tf_var, name: str):
    """A non-trainable zeros variable shaped like `tf_var`, created in its strategy's scope
    (mirrored under MirroredStrategy/TPUStrategy) and colocated with it."""
    strategy = (tf.distribute.get_strategy() if tf.distribute.has_strategy() else
                getattr(tf_var, "distribute_strategy", None) or tf.distribute.get_strategy())
    shape, dtype = tf_var.shape, tf_var.dtype
    with strategy.scope(), strategy.extended.colocate_vars_with(tf_var):
        return tf.Variable(lambda: tf.zeros(shape, dtype), trainable=False, name=name)


LrMultipliers = Union[Mapping[Any, float], Iterable[Tuple[Any, float]], None]


# --------------------------------------------------------------------------- optimizers

class _AdamFamily(tf.Module):
    """Shared state and distribution plumbing of AdamW and LAMB. A subclass sets its
    `NAME` and the default of `bias_correction` (`BIAS_CORRECTION`)."""
    NAME: str
    BIAS_CORRECTION: bool

    def __init__(self, learning_rate_fn: Union[Callable, float], weight_decay: float = 0.01,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
                 bias_correction: Optional[bool] = None,
                 exclude_from_weight_decay: Optional[Sequence[str]] =
                 DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY, name: Optional[str] = None):
        super().__init__(name=name or self.NAME)
        if callable(learning_rate_fn):
            self.learning_rate_fn = learning_rate_fn
        else:
            constant = float(learning_rate_fn)
            self.learning_rate_fn = lambda step: tf.constant(constant, tf.float32)
        self.hyper = update.Hyper(
            self.KIND, float(weight_decay), float(beta_1), float(beta_2), float(epsilon),
            bool(self.BIAS_CORRECTION if bias_correction is None else bias_correction),
            tuple(exclude_from_weight_decay or ()))
        self._state = _State()
        # Slots keyed by their TF1 names; tracked, so tf.train.Checkpoint saves them.
        self.adam_m: Dict[str, tf.Variable] = {}
        self.adam_v: Dict[str, tf.Variable] = {}

    # ------------------------------------------------------------------ build

    def build(self, variables: Iterable) -> "_AdamFamily":
        """Creates zero slots for each variable not built yet (a task head can come later)
        and fixes its weight-decay flag from its name. Call eagerly, under the variables'
        strategy scope."""
        state = self._state
        for variable in variables:
            tf_var = _tf_variable(variable)
            if id(tf_var) in state.by_id:
                continue
            name = variable_name(variable)
            if name in state.by_name:
                raise ValueError(f"two different variables are both named {name!r}; slot names "
                                 "must be unique")
            excluded = self.hyper.is_excluded(name)
            m = _zeros_like_variable(tf_var, f"{name}/adam_m")
            v = _zeros_like_variable(tf_var, f"{name}/adam_v")
            self.adam_m[f"{name}/adam_m"] = m
            self.adam_v[f"{name}/adam_v"] = v
            state.by_id[id(tf_var)] = len(state.entries)
            state.by_name[name] = len(state.entries)
            state.entries.append(_Entry(tf_var, name, excluded,
                                        decay=self.hyper.decays(name), m=m, v=v))
        return self

    @property
    def built(self) -> bool:
        return bool(self._state.entries)

    def slot_variables(self) -> Dict[str, tf.Variable]:
        """{'<var>/adam_m': m, '<var>/adam_v': v} in build order (the TF1 checkpoint names)."""
        return {name: slot for e in self._state.entries
                for name, slot in ((f"{e.name}/adam_m", e.m), (f"{e.name}/adam_v", e.v))}

    def _resolve_multipliers(self, lr_multipliers: LrMultipliers) -> Dict[int, float]:
        """{entry index: multiplier} of `apply_gradients`' `lr_multipliers`."""
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
                        lr_multipliers: LrMultipliers = None, should_update=None,
                        grad_scale=None):
        """Updates the variables (and m, v) in place from gradients already aggregated over
        replicas (None skipped). `step`: updates applied so far (lr = learning_rate_fn(step),
        bias correction t = step + 1). `lr_multipliers`: {variable | var.ref() | name: float}
        or (variable, float) pairs. `should_update`: a boolean scalar; where False nothing
        changes (selects, not a branch). `grad_scale`: a float32 scalar the gradients are
        multiplied by first (`clip_scale`'s; a non-finite gradient needs should_update=False).
        Eager, in a tf.function or under `strategy.run`."""
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
        if grad_scale is not None:
            scalars["grad_scale"] = tf.cast(grad_scale, tf.float32)
        # Multipliers travel as tensors through merge_call (never as closures over tensors),
        # one constant per distinct value.
        consts = {m: tf.constant(m, tf.float32) for m in set(multipliers.values())}
        mults = [consts[multipliers[i]] if i in multipliers else None for i in indices]
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
        # The hyper-parameters as float32 constants once a step, not once per variable.
        scalars = {k: tf.constant(v, tf.float32) for k, v in self.hyper.constants().items()}
        scalars["lr"] = self.learning_rate(step)
        scalars.update(update.bias_corrections(self.hyper, step))
        return scalars

    def _update_variable(self, entry: _Entry, var, grad, mult, scalars):
        """Runs once per device copy of `var` (m and v resolve to the same device's copy)."""
        new_values = self._new_values
        if compat.xla_kernels_apply():  # one pass over the variable, not ~20 ops
            new_values = self._state.kernel = self._state.kernel or tf.function(
                self._new_values, jit_compile=True, autograph=False)
        param, m, v = new_values(tf.convert_to_tensor(var), tf.convert_to_tensor(entry.m),
                                 tf.convert_to_tensor(entry.v), grad, mult, scalars,
                                 entry.decay, entry.excluded)
        entry.m.assign(m)
        entry.v.assign(v)
        var.assign(param)

    def _new_values(self, param, m_old, v_old, grad, mult, scalars, decay, excluded):
        """`update.new_values` with this step's scalars (the learning rate is
        scalars["lr"] times `mult`, None: 1)."""
        lr = scalars["lr"] if mult is None else scalars["lr"] * mult
        # float32 variables take the step's constants; another dtype converts the Python
        # floats directly (not through float32: the same rounding as always).
        c = scalars if param.dtype == tf.float32 else dict(scalars, **self.hyper.constants())
        return update.new_values(self.hyper, param, m_old, v_old, grad, lr, c, decay=decay,
                                 excluded=excluded, grad_scale=scalars.get("grad_scale"),
                                 ok=scalars.get("should_update"))


class AdamW(_AdamFamily):
    """The official ELECTRA `AdamWeightDecayOptimizer` (`update.py`'s rule, no bias
    correction by default)."""
    NAME = KIND = "adamw"
    BIAS_CORRECTION = False


class LAMB(_AdamFamily):
    """LAMB (You et al. 2019, Algorithm 2; `update.py`'s rule): AdamW's direction with bias
    correction, scaled per variable by the trust ratio ||param|| / ||update||."""
    NAME = KIND = "lamb"
    BIAS_CORRECTION = True


# --------------------------------------------------------------------------- gradients

def all_reduce_gradients(grads: Sequence) -> List:
    """Sums gradients over replicas (nothing to sum outside `strategy.run` or with one
    replica); IndexedSlices are always densified, so that the global norm is the summed
    gradient's, with repeated rows added first (and XLA-friendly)."""
    ctx = tf.distribute.get_replica_context()
    grads = [None if g is None else _dense(g) for g in grads]
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return grads
    present = [i for i, g in enumerate(grads) if g is not None]
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
    for i, g in zip(present, reduced):
        grads[i] = g
    return grads


# --------------------------------------------------------------------------- factory

def make_optimizer(config, total_steps: int) -> _AdamFamily:
    """AdamW or LAMB from an `OptimizerConfig`, with the warmup + polynomial decay schedule.
    `config.bias_correction` applies to AdamW (official: off); LAMB always corrects (paper)."""
    schedule = WarmupPolynomialDecay(config.learning_rate, total_steps, config.warmup_steps,
                                     config.end_learning_rate, config.lr_decay_power)
    # The run's length read from a variable, not baked into the compiled step: runs that
    # differ only in --num_train_steps or the warmup's length share one XLA program.
    schedule.make_tf_lengths()
    common = dict(weight_decay=config.weight_decay, beta_1=config.beta_1, beta_2=config.beta_2,
                  epsilon=config.epsilon)
    hyper = update.Hyper.of(config)
    kind = {"adamw": AdamW, "lamb": LAMB}[hyper.kind]
    return kind(schedule, bias_correction=hyper.bias_correction, **common)


def update_loss_scale(scale: tf.Variable, good_steps: tf.Variable, finite,
                      growth_interval: int = update.GROWTH_INTERVAL):
    """`update.update_loss_scale` on the runtime's variables, in place."""
    new_scale, good = update.update_loss_scale(scale, good_steps, finite, growth_interval)
    scale.assign(new_scale)
    good_steps.assign(good)
