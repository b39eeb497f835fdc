"""Fault injection (bench/fault_injection.py): a pre-training run SIGKILLed while it
writes a checkpoint resumes from the previous complete one and finishes. (The harness
itself also compares the final weights with an uninterrupted run's.)"""

import importlib.util
import os
import signal

import pytest

import forked_cli
from conftest import REPO

_spec = importlib.util.spec_from_file_location(
    "fault_injection", os.path.join(REPO, "bench", "fault_injection.py"))
fi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fi)


@pytest.mark.e2e
@pytest.mark.subprocess
def test_sigkill_during_a_checkpoint_write_resumes_from_the_previous_one(tmp_path,
                                                                         sample_build,
                                                                         monkeypatch):
    # The commands fork from a process that imported TensorFlow (each in its own session,
    # as the harness kills process groups).
    monkeypatch.setattr(fi, "POPEN", forked_cli.popen)
    setup = fi.PretrainSetup(data=sample_build[0], steps=6, batch=4, save=2, loop=2, seed=7)
    model_dir = str(tmp_path / "run")
    # SIGKILL as soon as the second checkpoint (ckpt-4) is seen being written
    killed = fi.pretrain_attempt(setup, model_dir, str(tmp_path / "a0.log"),
                                 fi.Kill("sigkill_ckpt", "ckpt", min_ckpt=4))
    assert killed.killed and killed.rc == -signal.SIGKILL, killed.log_tail
    assert killed.writing == 4 and any("ckpt-4" in n for n in killed.temp_seen), \
        killed.temp_seen
    assert killed.reached == 4
    # the newest checkpoint is complete, and it is the one before the torn write
    assert fi.checkpoint_problem(model_dir) is None
    assert fi.latest_step(model_dir) == 2

    done = fi.pretrain_attempt(setup, model_dir, str(tmp_path / "a1.log"))
    assert done.rc == 0, done.log_tail
    assert done.resumed == 2 and done.resumed_from.endswith("ckpt-2")
    assert done.reached == 6 and fi.latest_step(model_dir) == 6
