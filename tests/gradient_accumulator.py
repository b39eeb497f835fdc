"""Gradients accumulated over micro-batches, for tests/test_optimization.py.

Test-only: the train step accumulates its micro-batches itself
(`training.tf_runtime.trainer.TfRuntime._accumulated_grads`). This one checks that AdamW and LAMB need
nothing but the mean gradient, on one device and under MirroredStrategy, where the
accumulators are replica-local (`ON_READ`), so accumulating needs no communication.
"""

import tensorflow as tf

from electra_tf.training.tf_runtime.optimizer import variable_name


class GradientAccumulator:
    """The mean gradient of `steps` micro-batches: inside one step
    (`accumulate_microbatches`, a tf.while_loop) or across calls (`accumulate` each
    micro-step, `gradients` once `ready`, then `reset`)."""

    def __init__(self, steps: int):
        self.steps = int(steps)
        self.accumulators = []
        self.counter = None

    def build(self, variables) -> "GradientAccumulator":
        """One zeros accumulator per variable (call eagerly, under the strategy scope the
        variables were created in)."""
        strategy = tf.distribute.get_strategy()
        for v in variables:
            with strategy.scope(), strategy.extended.colocate_vars_with(v):
                self.accumulators.append(tf.Variable(
                    lambda v=v: tf.zeros(v.shape, v.dtype), trainable=False,
                    name=f"{variable_name(v)}/grad_accum",
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM))
        with strategy.scope():
            self.counter = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="grad_accum_counter",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        return self

    def accumulate(self, grads):
        """Adds gradients (in the order of `build`) to the accumulators."""
        for acc, g in zip(self.accumulators, grads):
            acc.assign_add(tf.cast(tf.convert_to_tensor(g), acc.dtype))
        self.counter.assign_add(1)

    def gradients(self):
        """The mean accumulated gradient: sum / steps (replica-local in replica context)."""
        return [tf.convert_to_tensor(acc) / float(self.steps) for acc in self.accumulators]

    def ready(self):
        return tf.convert_to_tensor(self.counter) >= self.steps

    def reset(self):
        for acc in self.accumulators:
            acc.assign(tf.zeros(acc.shape, acc.dtype))
        self.counter.assign(0)

    def accumulate_microbatches(self, grad_fn, batch):
        """(mean gradient, mean loss) over `steps` equal slices of `batch` (nested
        tensors); grad_fn(micro_batch) -> (grads in the order of `build`, float32 loss)
        must not synchronise replicas. Resets the accumulators first."""
        k = self.steps
        self.reset()
        stacked = tf.nest.map_structure(
            lambda t: tf.reshape(t, [k, -1] + list(t.shape[1:])), batch)

        def body(i, loss_sum):
            grads, loss = grad_fn(tf.nest.map_structure(lambda t: t[i], stacked))
            self.accumulate(grads)
            return i + 1, loss_sum + loss

        _, loss_sum = tf.while_loop(lambda i, _: i < k, body, (tf.constant(0), 0.0),
                                    maximum_iterations=k, parallel_iterations=1)
        return self.gradients(), loss_sum / k
