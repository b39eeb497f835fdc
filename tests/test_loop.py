"""electra_tf.training.loop on the toy linear model (toy_trainer.py): host loops to the
end, the log line's fields, checkpoints and the resume position, and on_nan."""

import logging
import os

import numpy as np
import pytest

from electra_tf.training import loop
from toy_trainer import LR, NumpyAdamW, ToyTrainer, batch, distributed

ROWS = 8
GOOD = [batch(ROWS, 0), batch(ROWS, 1)]


def _train(trainer, directory, batches, total, skip=0, **kw):
    manager = loop.open_checkpoints(trainer, str(directory))
    iterator = distributed(trainer, batches[skip:] + batches[:skip])
    schedule = loop.Schedule(num_train_steps=total, batch_size=ROWS, steps_per_loop=2,
                             log_every_steps=3, save_checkpoints_steps=2, **kw)
    out = loop.train(trainer, iterator, manager, schedule,
                     writer=loop.summary_writer(str(directory), chief=False))
    return out, manager


def test_train_runs_to_the_end_and_logs_each_interval(tmp_path, caplog):
    """Host loops stop at every log (3) and checkpoint (2) boundary; each log line has the
    loss averaged over the steps since the last one and the job's own fields."""
    trainer = ToyTrainer(ROWS)
    with caplog.at_level(logging.INFO, logger="absl"):
        out, manager = _train(trainer, tmp_path, GOOD, 6)
    ref = NumpyAdamW()
    losses = [ref.step(GOOD[i % 2], ROWS)[0] for i in range(6)]
    np.testing.assert_allclose(trainer.weights(), ref.w, rtol=1e-5)
    assert int(trainer.global_step.numpy()) == int(trainer.data_batches.numpy()) == 6
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(" | ")[:2] for line in lines] == [
        ["step 3/6", f"loss {np.mean(losses[:3]):.4f}"],
        ["step 6/6", f"loss {np.mean(losses[3:]):.4f}"]]
    assert all(line.split(" | ")[2].startswith("abs_err ") for line in lines)
    assert all(line.split(" | ")[3] == f"lr {LR:.3g}" for line in lines)
    assert out["loss"] == pytest.approx(np.mean(losses[3:]), rel=1e-5)
    saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Saved ")]
    assert [os.path.basename(m) for m in saved] == ["ckpt-2", "ckpt-4", "ckpt-6"]
    assert manager.latest_checkpoint.endswith("ckpt-6")


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    """Stopped at step 4 and resumed (a new trainer restores the newest checkpoint and the
    input skips the data_batches it records), the run ends with the same weights, bit for
    bit, as one that ran through."""
    straight = ToyTrainer(ROWS)
    _train(straight, tmp_path / "straight", GOOD, 6)
    first = ToyTrainer(ROWS)
    _train(first, tmp_path / "resumed", GOOD, 4)
    second = ToyTrainer(ROWS)
    manager = loop.open_checkpoints(second, str(tmp_path / "resumed"))
    position = int(second.data_batches.numpy())
    assert position == int(second.global_step.numpy()) == 4
    del manager
    _train(second, tmp_path / "resumed", GOOD, 6, skip=position % len(GOOD))
    np.testing.assert_array_equal(second.weights(), straight.weights())


BAD = batch(ROWS, 2, nan=True)


def test_on_nan_skip_goes_on_and_the_data_position_runs_ahead(tmp_path, caplog):
    trainer = ToyTrainer(ROWS)
    with caplog.at_level(logging.INFO, logger="absl"):
        _train(trainer, tmp_path, [GOOD[0], GOOD[1], BAD] + GOOD * 3, 6, on_nan="skip")
    assert int(trainer.global_step.numpy()) == 6
    assert int(trainer.data_batches.numpy()) == 7  # one batch more: the skipped one
    ref = NumpyAdamW()
    for b in [GOOD[0], GOOD[1]] + GOOD * 2:
        ref.step(b, ROWS)
    np.testing.assert_allclose(trainer.weights(), ref.w, rtol=1e-5)
    assert any(r.getMessage().endswith("skipped 1 non-finite step(s)") for r in caplog.records)


def test_on_nan_stop_names_the_step_and_the_last_good_checkpoint(tmp_path):
    trainer = ToyTrainer(ROWS)
    with pytest.raises(loop.RunError) as e:
        _train(trainer, tmp_path, [GOOD[0], GOOD[1], BAD] + GOOD, 6, on_nan="stop")
    assert str(e.value) == (
        "non-finite loss or gradients at step 3 (on_nan=stop; no such step is applied); "
        f"last good checkpoint: {tmp_path / 'ckpt-2'}")
    assert int(trainer.global_step.numpy()) == 2
