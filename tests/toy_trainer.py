"""A toy Trainer for the training core's own tests (test_trainer.py, test_loop.py): a
linear model y = x . w with the known loss 0.5 * sum((x . w - y)^2) / global batch, so
every step can be recomputed in numpy, without the ELECTRA or fine-tuning model.

A batch is {"input_ids": x float32 [rows, DIM], "y": float32 [rows]} ("input_ids" is the
key the core reads a batch's rows from).
"""

from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from electra_tf.configs import OptimizerConfig
from electra_tf.training import runtime
from electra_tf.training.tf_runtime.devices import TfDevices
from electra_tf.training.tf_runtime.trainer import TfRuntime

DIM = 3
W0 = np.array([0.5, -1.0, 2.0], np.float32)
LR, BETA_1, BETA_2, EPSILON = 0.1, 0.9, 0.999, 1e-6


class ToyJob(runtime.Job):
    """Linear regression: AdamW without weight decay or bias correction, a constant
    learning rate LR (the schedule's end rate is its start), initial weights W0."""

    def __init__(self, global_batch: int, clip_norm: float, grad_accum_steps: int):
        self.global_batch = global_batch
        optimizer = OptimizerConfig(learning_rate=LR, end_learning_rate=LR, warmup_steps=0,
                                    weight_decay=0.0, beta_1=BETA_1, beta_2=BETA_2,
                                    epsilon=EPSILON, bias_correction=False)
        self.settings = runtime.Settings(optimizer, 1000, seed=0, seed_stream=0,
                                         clip_norm=clip_norm, grad_accum_steps=grad_accum_steps)

    def build_model(self):
        return keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(
            1, use_bias=False, kernel_initializer=keras.initializers.Constant(W0[:, None]),
            name="w")], name="toy")

    def loss(self, model, batch, seed, context, training, phase=0, step=None):
        err = tf.cast(model(batch["input_ids"])[:, 0], tf.float32) - batch["y"]
        loss = tf.reduce_sum(0.5 * tf.square(err)) / self.global_batch
        return loss, {"abs_err_sum": tf.reduce_sum(tf.abs(err))}

    def fetches(self, batch, outputs):
        return {"prediction": outputs[:, 0]}

    def log_fields(self, metrics):
        return [f"abs_err {metrics['abs_err_sum']:.3f}"]


class ToyTrainer(TfRuntime):
    """The toy job on the TensorFlow runtime (one CPU device unless a strategy is given)."""

    def __init__(self, global_batch: int, strategy=None, clip_norm: float = 1e9,
                 grad_accum_steps: int = 1, jit_compile: Optional[bool] = False):
        super().__init__(ToyJob(global_batch, clip_norm, grad_accum_steps),
                         TfDevices(strategy or tf.distribute.OneDeviceStrategy("/cpu:0")),
                         jit_compile=jit_compile)

    def weights(self) -> np.ndarray:
        return self.variables[0].numpy()[:, 0]


def batch(rows: int, seed: int = 0, nan: bool = False):
    """A fixed batch: x ~ N(0, 1), y = x . [1, 2, 3] (+ NaN in y[0] when `nan`)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, DIM)).astype(np.float32)
    y = (x @ np.array([1.0, 2.0, 3.0], np.float32)).astype(np.float32)
    if nan:
        y[0] = np.nan
    return {"input_ids": x, "y": y}


class NumpyAdamW:
    """The same optimizer and loss in float64 numpy: the reference the tests compare to."""

    def __init__(self, clip_norm: float = 1e9):
        self.w = W0.astype(np.float64)
        self.m = np.zeros(DIM)
        self.v = np.zeros(DIM)
        self.clip_norm = clip_norm

    def step(self, b, global_batch: int):
        """One update on batch `b`; -> (loss, gradient norm before clipping), or the loss
        and a non-finite norm with nothing updated, as the core skips such a step."""
        x, y = b["input_ids"].astype(np.float64), b["y"].astype(np.float64)
        err = x @ self.w - y
        loss = 0.5 * np.sum(err ** 2) / global_batch
        g = x.T @ err / global_batch
        norm = float(np.sqrt(np.sum(g ** 2)))
        if not np.isfinite(norm):
            return loss, norm
        g = g * self.clip_norm / max(norm, self.clip_norm)
        self.m = BETA_1 * self.m + (1 - BETA_1) * g
        self.v = BETA_2 * self.v + (1 - BETA_2) * g ** 2
        self.w = self.w - LR * self.m / (np.sqrt(self.v) + EPSILON)
        return loss, norm


def distributed(trainer: ToyTrainer, batches):
    """An iterator over `batches` (repeated) distributed as the jobs' input is."""
    ds = tf.data.Dataset.from_tensor_slices(
        {k: np.stack([b[k] for b in batches]) for k in batches[0]}).repeat()
    return iter(trainer.strategy.distribute_datasets_from_function(lambda ctx: ds))
