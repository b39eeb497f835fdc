"""The TensorFlow runtime (electra_tf.training.tf_runtime.trainer) on a toy linear model (toy_trainer.py): the step tail
(all-reduce, unscale, clip, a non-finite step skipped and counted, the update), gradient
accumulation, the host loop, checkpoints and reinitialize, against numpy's arithmetic."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.compat import xla_cpu_available
from electra_tf.training.loop import summarize
from electra_tf.training.tf_runtime.trainer import default_jit
from toy_trainer import W0, NumpyAdamW, ToyTrainer, batch, distributed

ROWS = 8


def _loop(trainer, batches, n):
    return summarize(trainer.make_train_loop()(distributed(trainer, batches), tf.constant(n)))


@pytest.mark.parametrize("clip_norm", [1e9, 0.5])
def test_steps_equal_numpy_adamw(clip_norm):
    """Five steps over two batches: weights, the mean loss and the mean gradient norm are
    numpy's, without clipping and with a clip_norm below every step's norm."""
    batches = [batch(ROWS, 0), batch(ROWS, 1)]
    trainer = ToyTrainer(ROWS, clip_norm=clip_norm)
    ref = NumpyAdamW(clip_norm)
    losses, norms = zip(*[ref.step(batches[i % 2], ROWS) for i in range(5)])
    assert clip_norm > 1e3 or min(norms) > clip_norm  # 0.5 clips every step
    out = _loop(trainer, batches, 5)
    np.testing.assert_allclose(trainer.weights(), ref.w, rtol=1e-5)
    assert out.loss == pytest.approx(np.mean(losses), rel=1e-5)
    assert out.grad_norm == pytest.approx(np.mean(norms), rel=1e-5)
    assert out.skipped_steps == 0 and int(trainer.global_step.numpy()) == 5


def test_the_jobs_metric_sums_pass_through_the_loop():
    b = batch(ROWS)
    out = _loop(ToyTrainer(ROWS), [b], 1)
    want = np.abs(b["input_ids"].astype(np.float64) @ W0 - b["y"]).sum()
    assert out.metrics == {"abs_err_sum": pytest.approx(want, rel=1e-5)}


def test_a_non_finite_batch_is_skipped_and_counted():
    """A NaN label makes the gradient NaN: the step changes no weight and no optimizer
    slot, does not count as a global step, reports a zero norm, and is counted skipped;
    the next finite batch updates as if it had never been."""
    good, bad = batch(ROWS, 0), batch(ROWS, 1, nan=True)
    trainer = ToyTrainer(ROWS)
    out = _loop(trainer, [bad], 1)
    assert out.skipped_steps == 1 and out.grad_norm == 0.0
    assert int(trainer.global_step.numpy()) == 0
    np.testing.assert_array_equal(trainer.weights(), W0)
    assert all(not np.any(s.numpy()) for s in trainer.optimizer.slot_variables().values())
    out = _loop(trainer, [good, bad, good], 3)
    assert out.skipped_steps == 1 and int(trainer.global_step.numpy()) == 2
    ref = NumpyAdamW()
    ref.step(good, ROWS), ref.step(good, ROWS)
    np.testing.assert_allclose(trainer.weights(), ref.w, rtol=1e-5)


def test_gradient_accumulation_equals_one_big_batch():
    """grad_accum_steps=4 runs four micro-batches of 2 rows and applies their summed
    gradient: the same update as the 8-row batch in one go."""
    batches = [batch(ROWS, 0), batch(ROWS, 1)]
    one, four = ToyTrainer(ROWS), ToyTrainer(ROWS, grad_accum_steps=4)
    a, b = _loop(one, batches, 3), _loop(four, batches, 3)
    assert b.loss == pytest.approx(a.loss, rel=1e-6)
    np.testing.assert_allclose(four.weights(), one.weights(), rtol=1e-6)
    assert b.metrics["abs_err_sum"] == pytest.approx(a.metrics["abs_err_sum"], rel=1e-6)


def test_host_loop_runs_exactly_num_steps():
    """The host loop (a tf.while_loop, no autograph) runs `num_steps` steps, whatever
    integer type the count comes in, sums their metrics, and traces once."""
    trainer = ToyTrainer(ROWS)
    loop, iterator = trainer.make_train_loop(), distributed(trainer, [batch(ROWS)])
    for n, dtype in ((1, tf.int32), (3, tf.int64), (2, tf.int32)):
        before = int(trainer.global_step.numpy())
        sums = loop(iterator, tf.constant(n, dtype))
        assert int(trainer.global_step.numpy()) - before == n
        assert float(sums["steps"]) == n
    assert trainer.trace_count == 1


@pytest.fixture
def precision():
    """Sets a run precision (the global Keras policy) and restores float32 afterwards."""
    from electra_tf.training import runtime
    yield runtime.set_precision
    runtime.set_precision("float32")


def test_float16_overflow_skips_the_step_and_halves_the_scale(precision):
    precision("float16")
    trainer = ToyTrainer(ROWS)
    assert trainer.float16 and float(trainer.loss_scale.numpy()) == 2.0 ** 15
    trainer.loss_scale.assign(3e38)  # the scaled loss overflows float32: inf gradients
    out = _loop(trainer, [batch(ROWS)], 1)
    assert out.skipped_steps == 1
    assert int(trainer.global_step.numpy()) == 0
    assert float(trainer.loss_scale.numpy()) == pytest.approx(1.5e38)
    np.testing.assert_array_equal(trainer.weights(), W0.astype(np.float32))
    # At a finite scale the gradients are unscaled: the step is float32's (to float16's
    # precision of the forward pass).
    trainer.loss_scale.assign(2.0 ** 10)
    _loop(trainer, [batch(ROWS)], 1)
    ref = NumpyAdamW()
    ref.step(batch(ROWS), ROWS)
    np.testing.assert_allclose(trainer.weights(), ref.w, rtol=2e-3)


def test_checkpoint_round_trip(tmp_path):
    """The checkpoint holds the weights, the optimizer slots, the step and the data
    position."""
    trainer = ToyTrainer(ROWS)
    _loop(trainer, [batch(ROWS)], 3)
    trainer.data_batches.assign(4)
    path = trainer.checkpoint().save(str(tmp_path / "ckpt"))
    other = ToyTrainer(ROWS)
    other.restore(path)
    np.testing.assert_array_equal(other.weights(), trainer.weights())
    for name, slot in trainer.optimizer.slot_variables().items():
        np.testing.assert_array_equal(other.optimizer.slot_variables()[name].numpy(),
                                      slot.numpy())
    assert int(other.global_step.numpy()) == 3 and int(other.data_batches.numpy()) == 4


def test_a_checkpoint_without_the_data_position_resumes_at_global_step(tmp_path):
    """A checkpoint written before `data_batches` existed restores, and the input resumes
    at global_step (the data position a run without skipped steps had)."""
    trainer = ToyTrainer(ROWS)
    _loop(trainer, [batch(ROWS)], 3)
    old = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer,
                              global_step=trainer.global_step, loss_scale=trainer.loss_scale,
                              loss_scale_good_steps=trainer.good_steps)
    path = old.save(str(tmp_path / "ckpt"))
    other = ToyTrainer(ROWS)
    other.data_batches.assign(7)
    other.restore(path)
    np.testing.assert_array_equal(other.weights(), trainer.weights())
    assert int(other.global_step.numpy()) == 3 and int(other.data_batches.numpy()) == 3


def test_reinitialize_starts_over_without_a_new_trace():
    trainer = ToyTrainer(ROWS)
    first = _loop(trainer, [batch(ROWS)], 2)
    trainer.reinitialize(0)
    np.testing.assert_array_equal(trainer.weights(), W0)
    assert all(not np.any(s.numpy()) for s in trainer.optimizer.slot_variables().values())
    assert [int(c.numpy()) for c in (trainer.global_step, trainer.data_batches)] == [0, 0]
    again = _loop(trainer, [batch(ROWS)], 2)
    assert again.loss == first.loss and trainer.trace_count == 1


def test_default_jit_choice():
    """On a CPU each job takes its measured choice: XLA for pre-training, graph execution
    for fine-tuning (README, Benchmarks)."""
    from electra_tf.finetune.trainer import FinetuningJob
    from electra_tf.pretraining.trainer import PretrainingJob
    cpu = tf.distribute.OneDeviceStrategy("/cpu:0")
    # The TPU build has no XLA:CPU: there every CPU-only step runs as a graph.
    assert default_jit(cpu) is xla_cpu_available() and default_jit(cpu, on_cpu=False) is False
    assert PretrainingJob.xla_on_cpu is True and FinetuningJob.xla_on_cpu is False


def test_jit_compile_on_a_cpu_without_xla_cpu_is_one_line(monkeypatch):
    """The TPU build cannot XLA-compile for the CPU: --jit_compile=true there is refused in
    one line (what StrategyError reaches the CLIs as), not a NotFoundError from the step;
    left to the default, the step runs as a graph."""
    from electra_tf import compat
    from electra_tf.training.runtime import StrategyError
    monkeypatch.setattr(compat, "xla_cpu_available", lambda: False)
    with pytest.raises(StrategyError, match=r"^--jit_compile=true: this TensorFlow build "
                                            r"cannot XLA-compile for the CPU"):
        ToyTrainer(ROWS, jit_compile=True)
    assert ToyTrainer(ROWS, jit_compile=None).jit_compile is False
