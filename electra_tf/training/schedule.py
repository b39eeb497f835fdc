"""The learning-rate schedule and the weight-decay exclusions, shared by the TensorFlow
runtime's optimizer (`tf_runtime/optimizer.py`) and the JAX runtime's update
(`jax_runtime/step.py`); no TensorFlow at import."""

from typing import Any, Callable, Dict, List, Optional

DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


class WarmupPolynomialDecay:
    """The official ELECTRA learning rate, `step -> float32 lr`: TF1's polynomial_decay
    (lr - end) * (1 - min(step, total) / total) ** power + end, times
    min(1, step / warmup_steps) (warmup multiplies the decayed value, as officially)."""

    def __init__(self, learning_rate: float, total_steps: int, warmup_steps: int = 0,
                 end_learning_rate: float = 0.0, power: float = 1.0):
        self.learning_rate = float(learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)

    def __call__(self, step):
        import tensorflow as tf  # the TensorFlow runtime's; JAX calls `compute`
        return self.compute(tf.cast(step, tf.float32), tf.minimum, tf.pow,
                            getattr(self, "tf_lengths", None))

    def lengths(self):
        """The run-length numbers as float32 [total steps (at least 1), warmup steps]: what a
        compiled step takes as an input (`compute(..., lengths)`) instead of as constants,
        so one program serves runs of any length (a persistent compilation cache hits)."""
        import numpy as np
        return np.array([max(1, self.total_steps), self.warmup_steps], np.float32)

    def make_tf_lengths(self):
        """`lengths()` in a TensorFlow variable that `__call__` reads (made in the
        strategy's scope, beside the optimizer; not in any checkpoint: this object is not
        tracked)."""
        import tensorflow as tf
        self.tf_lengths = tf.Variable(self.lengths(), trainable=False,
                                      name="learning_rate_schedule_lengths")
        return self.tf_lengths

    def compute(self, step, minimum: Callable, power: Callable, lengths=None):
        """The rate at a float32 `step` with a backend's `minimum` and `pow` (the JAX
        runtime's step passes jax.numpy's). `lengths`: `lengths()` as a backend tensor (an
        input of the compiled step); None: the same numbers as constants. Whether there is
        a warmup at all stays a constant."""
        if lengths is None:
            total, warmup = float(max(1, self.total_steps)), float(self.warmup_steps)
        else:
            total, warmup = lengths[0], lengths[1]
        progress = minimum(step, total) / total
        lr = (self.learning_rate - self.end_learning_rate) * power(
            1.0 - progress, self.power) + self.end_learning_rate
        if self.warmup_steps > 0:
            lr = lr * minimum(1.0, step / warmup)
        return lr

    def get_config(self) -> Dict[str, Any]:
        return dict(learning_rate=self.learning_rate, total_steps=self.total_steps,
                    warmup_steps=self.warmup_steps, end_learning_rate=self.end_learning_rate,
                    power=self.power)


class Phases:
    """A trainer's phases (both runtimes): `phases()` gives the first global step of each
    (one phase by default); a host loop never crosses a phase start."""

    def phases(self) -> List[int]:
        return [0]

    def phase_at(self, step: int) -> int:
        """The phase that global step `step` (0-based, about to run) is in."""
        return sum(1 for start in self.phases()[1:] if step >= start)

    def steps_left_in_phase(self, step: int) -> Optional[int]:
        """Steps from `step` to the next phase start (None in the last phase)."""
        later = [start for start in self.phases() if start > step]
        return later[0] - step if later else None
