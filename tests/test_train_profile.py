"""The pre-training run's FLOP/s and MFU (logs, scalars, returned metrics) and its
--profile_steps trace."""

import glob
import logging
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from electra_tf.training.options import PretrainingOptions
from electra_tf.training.loop import RunError
from electra_tf.training.loop import parse_profile_steps
from electra_tf.pretraining import flops, pretrain
from electra_tf.training import hardware
from electra_tf.pretraining.trainer import Pretrainer

from conftest import REPO
from test_pretrain import _cfg as train_cfg


def _cfg():
    """test_pretrain's tiny run, 4 steps with one log line and one checkpoint at the end."""
    return train_cfg(num_train_steps=4, save_checkpoints_steps=4, log_every_steps=4)


def _scalars(logdir):
    values = {}
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                values[(v.tag, event.step)] = float(tf.make_ndarray(v.tensor))
    return values


@pytest.mark.e2e
def test_profile_steps_trace_and_mfu(tmp_path, sample_build, monkeypatch, caplog):
    """--profile_steps=1,3 with steps_per_loop 3: host loops of 1, 2 and 1 steps, the
    middle one traced into train/plugins/profile; the log line, the scalars and the
    returned metrics carry the same FLOP/s and an MFU between 0 and 100%."""
    loop_steps = []
    make_loop = Pretrainer.make_train_loop

    def recording(self, phase=0):
        loop = make_loop(self, phase)

        def run(iterator, num_steps):
            loop_steps.append(int(num_steps))
            return loop(iterator, num_steps)
        return run

    monkeypatch.setattr(Pretrainer, "make_train_loop", recording)
    caplog.set_level(logging.INFO, logger="absl")
    cfg = _cfg()
    out = tmp_path / "run"
    metrics = pretrain.run(cfg, PretrainingOptions(model_dir=str(out), train_data=sample_build[0],
                                              strategy="cpu", profile_steps="1,3",
                                              jit_compile=False))  # compiles in half the time
    assert loop_steps == [1, 2, 1]

    traces = glob.glob(str(out / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(traces) == 1 and os.path.getsize(traces[0]) > 1000, traces

    # The log line: "... | 123.4 seq/s | 1.23 GFLOP/s MFU 4.5% | ETA ..."
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 4/4")]
    assert len(line) == 1, [r.getMessage() for r in caplog.records]
    match = re.search(r"\| ([0-9.]+) seq/s \| ([0-9.]+) ([GTMP]?)FLOP/s MFU ([0-9.]+)% \|",
                      line[0])
    assert match, line[0]
    mfu_percent = float(match.group(4))
    assert 0 < mfu_percent < 100
    assert metrics["perf/mfu"] * 100 == pytest.approx(mfu_percent, abs=0.05)

    scale = {"": 1, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}[match.group(3)]
    assert metrics["perf/flops_per_second"] == pytest.approx(
        float(match.group(2)) * scale, rel=5e-3)  # printed to 3 significant digits

    # FLOP/s = sequences/s x hardware-convention train FLOPs per sequence (5.56e9 per
    # step of 8 for the tiny preset); MFU divides it by the CPU's peak, which the run
    # measured (cached, so this call returns the same number at once).
    per_step = flops.count_config(cfg, flops.HARDWARE).train_per_step()["total"]
    assert per_step == pytest.approx(5.561e9, rel=1e-3)
    scalars = _scalars(str(out / "train"))
    assert metrics["perf/flops_per_second"] == pytest.approx(
        scalars[("sequences_per_second", 4)] / 8 * per_step, rel=1e-6)
    peak = hardware.measure_matmul_flops(hardware.RUN_MATMUL_SIZE, "float32")
    assert metrics["perf/flops_per_second"] / metrics["perf/mfu"] == pytest.approx(peak)
    assert scalars[("perf/mfu", 4)] == pytest.approx(metrics["perf/mfu"], rel=1e-6)
    assert scalars[("perf/flops_per_second", 4)] == pytest.approx(
        metrics["perf/flops_per_second"], rel=1e-6)


@pytest.mark.parametrize("value", ["3,1", "2,2", "-1,3", "1", "1,2,3", "a,b", (5, 4)])
def test_bad_profile_steps(value):
    with pytest.raises(RunError, match=r"^--profile_steps=.*0 <= START < END"):
        parse_profile_steps(value)


def test_profile_steps_parse():
    assert parse_profile_steps("0,10") == (0, 10)
    assert parse_profile_steps(" 5 , 7 ") == (5, 7)
    assert parse_profile_steps((1, 3)) == (1, 3)
    assert parse_profile_steps(None) is None and parse_profile_steps("") is None


def test_bad_peak_flops_is_a_run_error(tmp_path):
    with pytest.raises(RunError, match=r"^--peak_flops=-5: expected a positive "):
        pretrain.run(_cfg(), PretrainingOptions(model_dir=str(tmp_path), strategy="cpu",
                                           peak_flops="-5"))


@pytest.mark.subprocess
def test_bad_profile_steps_flag_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, "run_pretraining.py", f"--model_dir={tmp_path}",
                           "--profile_steps=10,5"], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("run_pretraining: error: --profile_steps=10,5: expected START,END global "
                    "steps with 0 <= START < END, e.g. 100,110"), last
