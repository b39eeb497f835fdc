"""The update, written once over arrays (`keras.ops`, the way the model is): AdamW and LAMB,
their bias corrections, layer-wise rates, clipping by the global norm, float16's dynamic
loss scale, the non-finite skip and the step's reported sums. Both runtimes call these
functions inside their compiled step: the TensorFlow runtime per variable under
`tf.distribute` (`tf_runtime/optimizer.py`: slot variables, the fused per-variable kernel),
the JAX runtime over lists of arrays inside one `jax.jit` (`jax_runtime/step.py`). Neither
has a formula of its own.

The rules, with g the (unscaled, clipped) gradient and t = step + 1:

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    update = m' / (sqrt(v') + eps)      m' = m / (1 - b1^t), v' = v / (1 - b2^t) with
                                        bias correction (LAMB always; AdamW: official off)
    update += weight_decay * param      (unless the name matches the exclusions)
    param -= lr * multiplier * trust * update
    trust = ||param|| / ||update||      (LAMB on a decayed variable; 1 if either norm is 0)

Where the step is not `ok` (a non-finite global norm) nothing changes."""

import dataclasses
import re
from typing import Dict, Mapping, Optional, Sequence, Tuple

from keras import ops

from electra_tf import kernels
from electra_tf.training.schedule import DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY

# float16's dynamic loss scale: where it starts, and after how many finite steps in a row
# it doubles (it halves after a non-finite one, never below 1).
INITIAL_LOSS_SCALE = 2.0 ** 15
GROWTH_INTERVAL = 2000
KINDS = ("adamw", "lamb")


def initial_loss_scale(float16: bool) -> float:
    """The loss scale a run starts with: 2^15 under float16, else 1 (nothing to undo)."""
    return INITIAL_LOSS_SCALE if float16 else 1.0


@dataclasses.dataclass(frozen=True)
class Hyper:
    """AdamW / LAMB hyper-parameters (both runtimes' optimizers are built from this)."""
    kind: str  # "adamw" or "lamb"
    weight_decay: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    bias_correction: bool = False
    exclude_from_weight_decay: Tuple[str, ...] = DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"optimizer={self.kind!r}: expected adamw or lamb")

    @classmethod
    def of(cls, config) -> "Hyper":
        """From an `OptimizerConfig`: `bias_correction` applies to AdamW (official: off);
        LAMB always corrects (its paper)."""
        return cls(config.optimizer, float(config.weight_decay), float(config.beta_1),
                   float(config.beta_2), float(config.epsilon),
                   True if config.optimizer == "lamb" else bool(config.bias_correction))

    def constants(self) -> Dict[str, float]:
        """The hyper-parameters an update reads, by the names `new_values` takes them."""
        return {"beta_1": self.beta_1, "1-beta_1": 1.0 - self.beta_1, "beta_2": self.beta_2,
                "1-beta_2": 1.0 - self.beta_2, "epsilon": self.epsilon,
                "weight_decay": self.weight_decay}

    def is_excluded(self, name: str) -> bool:
        """Whether a variable name matches the exclusions (a regex search, as the official
        `_do_use_weight_decay`)."""
        return any(re.search(p, name) for p in self.exclude_from_weight_decay)

    def decays(self, name: str) -> bool:
        return self.weight_decay != 0.0 and not self.is_excluded(name)


def bias_corrections(hyper: Hyper, step) -> Dict:
    """{m_correction, v_correction}: 1 - b^t at t = step + 1 (float32), or {} without."""
    if not hyper.bias_correction:
        return {}
    t = ops.cast(step, "float32") + 1.0
    return {"m_correction": 1.0 - ops.power(hyper.beta_1, t),
            "v_correction": 1.0 - ops.power(hyper.beta_2, t)}


def new_values(hyper: Hyper, param, m_old, v_old, grad, lr, c: Mapping, *, decay: bool,
               excluded: bool, grad_scale=None, ok=None):
    """-> (param, m, v) after one update of one variable (the old ones where `ok` is False:
    selects, not a branch). `lr`: the float32 rate with the variable's multiplier applied;
    `c`: `Hyper.constants()` and `bias_corrections()`, as numbers or the runtime's float32
    scalars; `grad_scale`: the clip factor the gradient is multiplied by first."""
    dtype = param.dtype
    if grad_scale is not None:  # zeros where the norm is not finite (0 * inf is NaN)
        grad = grad * ops.cast(grad_scale, grad.dtype)
        if ok is not None:
            grad = ops.where(ok, grad, ops.zeros([], grad.dtype))
    grad = ops.cast(grad, dtype)
    m = c["beta_1"] * m_old + c["1-beta_1"] * grad
    v = c["beta_2"] * v_old + c["1-beta_2"] * ops.square(grad)
    if hyper.bias_correction:
        m_hat = m / ops.cast(c["m_correction"], dtype)
        v_hat = v / ops.cast(c["v_correction"], dtype)
    else:
        m_hat, v_hat = m, v
    update = m_hat / (ops.sqrt(v_hat) + c["epsilon"])
    if decay:
        update = update + c["weight_decay"] * param
    rate = ops.cast(lr, dtype)
    if hyper.kind == "lamb" and not excluded:
        rate = rate * trust_ratio(param, update)
    new_param = param - rate * update
    if ok is None:
        return new_param, m, v
    return ops.where(ok, new_param, param), ops.where(ok, m, m_old), ops.where(ok, v, v_old)


def trust_ratio(param, update):
    """||param|| / ||update|| (float32 norms), or 1 when either is 0; in param's dtype."""
    w = ops.sqrt(ops.sum(ops.square(ops.cast(param, "float32"))))
    r = ops.sqrt(ops.sum(ops.square(ops.cast(update, "float32"))))
    good = ops.logical_and(w > 0.0, r > 0.0)
    return ops.cast(ops.where(good, w / ops.where(good, r, 1.0), 1.0), param.dtype)


# --------------------------------------------------------------------------- the step tail


def global_norm(grads: Sequence):
    """sqrt(sum of squares) over all non-None gradients, in float32 (0 for none)."""
    squares = [ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads if g is not None]
    if not squares:
        return ops.zeros([], "float32")
    return ops.sqrt(kernels.add_n(squares))


def clip_scale(norm, clip_norm: Optional[float]):
    """min(1, clip_norm / norm), 1 without clipping (clip_norm <= 0 or None), and 0 for a
    non-finite norm: the factor the update multiplies the gradients by (no pass of its own)."""
    finite = ops.isfinite(norm)
    if clip_norm is None or clip_norm <= 0:
        scale = ops.ones([], "float32")
    else:
        safe = ops.where(finite, norm, 1.0)
        scale = float(clip_norm) / ops.maximum(safe, float(clip_norm))
    return ops.where(finite, scale, 0.0)


def unscale(grads: Sequence, loss_scale):
    """The gradients of the loss times `loss_scale` -> those of the loss (float16)."""
    inv = 1.0 / ops.cast(loss_scale, "float32")
    return [None if g is None else g * inv for g in grads]


def prepare(grads: Sequence, loss_scale, clip_norm: Optional[float], float16: bool):
    """The step tail before the update, on gradients summed over the global batch ->
    (gradients, their global norm, whether it is finite, the clip factor)."""
    if float16:  # float32's loss scale is 1: nothing to undo
        grads = unscale(grads, loss_scale)
    norm = global_norm(grads)
    return grads, norm, ops.isfinite(norm), clip_scale(norm, clip_norm)


def update_loss_scale(scale, good_steps, finite, growth_interval: int = GROWTH_INTERVAL):
    """float16's dynamic loss scale -> (scale, good_steps): halved after a non-finite step
    (not below 1), doubled after `growth_interval` finite steps in a row."""
    good = ops.where(finite, good_steps + 1, 0)
    grow = good >= growth_interval
    scale = ops.where(finite, ops.where(grow, scale * 2.0, scale), ops.maximum(scale / 2.0, 1.0))
    return scale, ops.where(grow, ops.zeros_like(good), good)


def step_sums(sums: Mapping, loss, norm, finite) -> Dict:
    """The job's metric sums plus what every step reports: its loss, one step, the norm of
    an applied step, and whether it was skipped (the host loop adds these over steps)."""
    out = dict(sums)
    out["loss_sum"] = loss
    out["steps"] = ops.ones([], "float32")
    out["grad_norm_sum"] = ops.where(finite, norm, 0.0)
    out["skipped"] = 1.0 - ops.cast(finite, "float32")
    return out


# Keys of the step's sums that are the same on every replica (not shares of the batch).
PER_STEP = ("steps", "grad_norm_sum", "skipped")
