"""Multi-process JAX on this CPU: several processes of several host devices each train as
one job (`--strategy=multi_worker`, `jax.distributed` on localhost, the cluster in
TF_CONFIG as a TensorFlow job gives it), survive a preempted or a lost process, resume on
another shape (fine-tuning on several processes: `test_finetune_notf.py`). Every process
runs with TensorFlow unimportable (conftest.without_tensorflow), as on a TPU VM or a GPU
node with JAX alone; the first test runs in CI's JAX leg too (the README's JAX install).

Each job here is the tiny preset at a global batch of 8 on 2 processes x 2 host devices
(`--xla_force_host_platform_device_count`). The weights are compared through the
checkpoints' tensors (`bundle.Reader`, no TensorFlow), held to 1e-5 of the array's own size
(`array_errors`)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from electra_tf import compat, fileio
from electra_tf.bundle import Reader
from electra_tf.training import checkpoints, preemption
from electra_tf.training.jax_runtime import guard

from array_errors import errors
from conftest import REPO, free_ports, without_tensorflow

pytestmark = [pytest.mark.skipif(not compat.module_exists("jax"),
                                 reason="the jax extra is not installed"),
              pytest.mark.jax]

STEPS = 8
OVERRIDES = ("train_batch_size=8,steps_per_loop=1,log_every_steps=1,warmup_steps=2,"
             "save_checkpoints_steps={save}")


def _env(devices, **extra):
    return {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", **extra}


def _args(model_dir, data, steps, save, *extra):
    return ["run_pretraining.py", "--backend=jax", f"--model_dir={model_dir}",
            f"--train_data={data}", f"--num_train_steps={steps}",
            f"--params_override={OVERRIDES.format(save=save)}", *extra]


def _start(argv, env, stderr=None):
    """`python ARGV` with TensorFlow unimportable, from the repository's root."""
    return subprocess.Popen([sys.executable, *without_tensorflow(argv)], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stderr=stderr, text=True)


def _run(argv, env, timeout=300):
    """-> (exit code, stderr) of `python ARGV` with TensorFlow unimportable."""
    proc = _start(argv, env, subprocess.PIPE)
    try:
        err = proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


class Job:
    """The processes of one multi-process run, started at once, their stderr read by
    threads (line by line, so a test can wait for a line of one while the others go on)."""

    def __init__(self, argv, processes=2, devices=2, **env):
        cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(processes)]}
        self.procs = [_start(
            [*argv, "--strategy=multi_worker"], stderr=subprocess.PIPE,
            env=_env(devices, TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": i}}), **env))
            for i in range(processes)]
        self.lines = [[] for _ in self.procs]
        self.readers = [threading.Thread(target=self._read, args=(i,), daemon=True)
                        for i in range(processes)]
        for reader in self.readers:
            reader.start()

    def _read(self, i):
        for line in self.procs[i].stderr:
            self.lines[i].append(line)

    def wait_for(self, i, needle, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(needle in line for line in self.lines[i]):
                return
            if self.procs[i].poll() is not None:
                self.readers[i].join(timeout=30)  # its last lines: why it ended
                break
            time.sleep(0.1)
        raise AssertionError(f"no {needle!r} from process {i}: {''.join(self.lines[i])[-3000:]}")

    def finish(self, timeout=300):
        """-> (exit codes, stderr of each)."""
        try:
            for p in self.procs:
                p.wait(timeout=timeout)
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
        for reader in self.readers:
            reader.join(timeout=30)
        return [p.returncode for p in self.procs], ["".join(lines) for lines in self.lines]


def _steps(log, total):
    return [int(s) for s in re.findall(rf"\] step (\d+)/{total} \|", log)]


def _tensors(prefix):
    reader = Reader(str(prefix), fileio.read_bytes)
    return reader.get_tensors(list(reader.get_variable_to_shape_map()))


def _latest(model_dir):
    return checkpoints.read_checkpoint_state(str(model_dir)).model_checkpoint_path


def _shards_read(log, index, processes=2):
    line = [ln for ln in log.splitlines() if f"Input pipeline {index} of {processes}:" in ln]
    assert line, log[-3000:]
    return set(line[0].split("file(s), ")[1].split(", "))


# One process of 4 host devices fed the global batches the two-process job assembles
# (process 0's rows, then process 1's: each reads its own half of the shards through the
# NumPy pipeline), writing its step-N checkpoint. No TensorFlow.
FOUR_DEVICES_SCRIPT = """
import sys
from electra_tf.configs import load_config
from electra_tf.data.dataset import InputContext, make_batches
from electra_tf.pretraining import pretrain
from electra_tf.pretraining.trainer import make_pretrainer
from electra_tf.training.jax_runtime.devices import jax_devices
from electra_tf.training.options import PretrainingOptions
out, data, overrides, steps = sys.argv[1:5]
cfg = load_config("tiny", overrides)
files, _, manifest = pretrain.resolve_data(PretrainingOptions(out, train_data=data), cfg)
special, counts = pretrain.special_ids_and_counts(manifest, files, cfg)
devices = jax_devices("cpu")
assert devices.num_replicas == 4, devices.describe()
trainer = make_pretrainer(cfg, devices, special, counts)
icfg = pretrain.input_config(files, cfg, cfg.train.train_batch_size, True)
import numpy as np
first, second = [make_batches(icfg, InputContext(2, w, 2)) for w in range(2)]
batches = []
for _ in range(int(steps)):
    a, b = next(first), next(second)
    batches.append({k: np.concatenate([a[k], b[k]]) for k in list(a)})
trainer.make_train_loop()(iter(batches), int(steps))
trainer.advance_data(int(steps))
trainer.checkpoint_manager(out, 1).save(int(steps))
"""


@pytest.mark.subprocess
@pytest.mark.e2e
@pytest.mark.jax
@pytest.mark.every_leg
def test_two_processes_train_as_one_and_a_preempted_one_stops_both(tmp_path, sample_build):
    """2 processes x 2 devices. SIGTERM to process 1 at step 3: both save at one agreed
    step (process 0 writes it) and exit 75; the rerun resumes there and ends with the
    weights and Adam slots of 1 process x 4 devices fed the same global batches. Process 1
    read its own shards and logged no step line; nothing but process 0 wrote model_dir."""
    data = sample_build[0]
    model_dir = tmp_path / "two"
    argv = _args(model_dir, data, STEPS, 4)
    # The job's own compilation cache (compile_cache.py: bounded, locked), shared by both
    # processes and then by the rerun's.
    cache = {"ELECTRA_TF_COMPILATION_CACHE": str(tmp_path / "jax_cache"),
             "JAX_COMPILATION_CACHE_DIR": ""}
    job = Job(argv, **cache)
    job.wait_for(0, f"] step 3/{STEPS} ")
    job.procs[1].send_signal(signal.SIGTERM)
    codes, logs = job.finish()
    assert codes == [preemption.PREEMPTED_EXIT_CODE] * 2, logs[0][-3000:] + logs[1][-3000:]
    at = int(re.search(r"SIGTERM at step (\d+): saved", logs[1]).group(1))
    assert 3 <= at < STEPS
    saved = f"saved {model_dir}/ckpt-{at}; rerun the same command to resume"
    assert logs[1].strip().splitlines()[-1] == f"run_pretraining: SIGTERM at step {at}: {saved}"
    assert logs[0].strip().splitlines()[-1] == (
        f"run_pretraining: a preemption notice to another worker at step {at}: {saved}")
    assert _latest(model_dir).endswith(f"ckpt-{at}")
    # One log line per step, from process 0; process 1 says so and logs none.
    assert _steps(logs[0], STEPS) == list(range(1, at + 1)), logs[0][-3000:]
    assert "Worker 1: the chief logs the steps and checkpoints of the run" in logs[1]
    assert _steps(logs[1], STEPS) == [] and "Saved checkpoint" not in logs[1]
    assert ": 4 CPU device(s) (cpu), 2 process(es)" in logs[0]
    mine = [_shards_read(logs[i], i) for i in range(2)]
    assert mine[0] and mine[1] and not mine[0] & mine[1]

    again = Job(argv, **cache)
    codes, logs = again.finish()
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert f"Resumed from {model_dir}/ckpt-{at} (step {at})" in logs[0]
    assert _steps(logs[0], STEPS) == list(range(at + 1, STEPS + 1))
    # The rerun's step came from the cache both processes wrote, locked; its weights
    # below are still those of 1 x 4.
    assert f"JAX compilation cache: {tmp_path / 'jax_cache'} (" in logs[0]
    assert "entries locked for several processes)" in logs[0]
    first_loop = re.search(r"First host loop \(\d+ steps?\): [\d.]+ s \(compiling [\d.]+ s; "
                           r"persistent cache: (\d+) hits?, \d+ miss", logs[0])
    assert first_loop and int(first_loop.group(1)) >= 1, logs[0][-3000:]
    assert _steps(logs[1], STEPS) == [] and "Traceback" not in logs[1]
    assert not os.path.exists(model_dir / ".workers")
    assert os.path.exists(model_dir / "discriminator" / "checkpoint")

    code, log = _run(["-c", FOUR_DEVICES_SCRIPT, tmp_path / "one", data,
                      OVERRIDES.format(save=4) + f",num_train_steps={STEPS}", STEPS], _env(4))
    assert code == 0, log[-3000:]
    want, got = _tensors(tmp_path / "one" / f"ckpt-{STEPS}"), _tensors(_latest(model_dir))
    assert int(got["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == STEPS
    for kind in ("model/", "optimizer/adam_m/", "optimizer/adam_v/"):
        names = [n for n in want if n.startswith(kind)]
        assert len(names) > 20, (kind, sorted(want)[:5])
        found = errors({n: want[n] for n in names}, {n: got[n] for n in names})
        worst = max(found.items(), key=lambda kv: kv[1])
        assert worst[1] <= 1e-5, worst


@pytest.mark.subprocess
@pytest.mark.e2e
def test_a_lost_process_stops_the_other_in_one_line_and_the_run_resumes_on_other_shapes(
        tmp_path, sample_build):
    """SIGKILL to process 1 of 2 (x 2 devices): process 0 stops within JAX's heartbeat
    timeout (20 s here) plus a margin, exit 69, its last line naming the lost process, no
    crash dump. The run then resumes from its last checkpoint on 1 process x 4 devices, on
    1 x 2, and back on 2 x 2, each continuing the step count and the data position."""
    data = sample_build[0]
    model_dir = tmp_path / "run"
    # JAX's heartbeat timeout at 20 s (100 s by default): short enough for the test, long
    # enough that a process starved of CPU by a loaded machine is not declared lost.
    job = Job(_args(model_dir, data, 40, 2), ELECTRA_TF_HEARTBEAT_TIMEOUT="20")
    job.wait_for(0, f"Saved checkpoint {model_dir}/ckpt-2")
    job.procs[1].kill()
    killed = time.monotonic()
    codes, logs = job.finish(timeout=120)
    took = time.monotonic() - killed
    assert codes[0] == guard.LOST_PROCESS_EXIT_CODE, logs[0][-3000:]
    assert logs[0].strip().splitlines()[-1] == (
        "run_pretraining: error: lost process 1 of 2: it stopped sending heartbeats to the JAX "
        "coordination service (killed, out of memory or its host gone); process 0 stopped. "
        "Rerun every process to resume from the last checkpoint"), logs[0][-3000:]
    for dump in ("Traceback", "Check failure", "Fatal Python error", "coordination_service"):
        assert dump not in logs[0], dump
    assert took < 60, took
    last = int(_latest(model_dir).rsplit("-", 1)[1])
    assert last >= 2

    def resume(steps, devices, processes):
        argv = _args(model_dir, data, steps, 2)
        if processes > 1:
            done = Job(argv, processes, devices)
            codes, logs = done.finish()
            assert codes == [0] * processes, logs[0][-3000:]
            log = logs[0]
        else:
            code, log = _run(argv, _env(devices))
            assert code == 0, log[-3000:]
        assert f": {devices * processes} CPU device(s) (cpu), {processes} process(es)" in log
        return log

    for steps, devices, processes in ((last + 2, 4, 1), (last + 4, 2, 1), (last + 6, 2, 2)):
        log = resume(steps, devices, processes)
        assert f"Resumed from {model_dir}/ckpt-{steps - 2} (step {steps - 2})" in log, log[-3000:]
        assert _steps(log, steps) == [steps - 1, steps]
        state = _tensors(_latest(model_dir))
        assert int(state["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == steps
        assert int(state["data_batches/.ATTRIBUTES/VARIABLE_VALUE"]) == steps


# Fine-tuning on 2 processes against 1: tests/test_finetune_notf.py.


# What JAX 0.10.2 printed in a survivor when process 1 was SIGKILLed (heartbeat verdict) and
# when process 0 was (its coordination service gone), shortened.
HEARTBEAT_VERDICT = b"""E1202 18:28:49.532294    2165 coordination_service.cc:1549] [117] Use error polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error.
E1202 18:28:49.532850    2176 coordination_service_agent.cc:289] Polled an error from coordination service (this can be an error from this or another task).
F1202 18:28:49.532984    2176 client.h:80] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died; see the other task logs for more details. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1
The tasks have crashed.
*** Check failure stack trace: ***
    @     0x7f5f8da40634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
"""
LEADER_VERDICT = b"""E1202 18:30:26.016704    4746 coordination_service_agent.cc:289] Polled an error from coordination service (this can be an error from this or another task).
F1202 18:30:26.016981    4746 client.h:80] Terminating process because the JAX distributed service detected fatal errors. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted unexpectedly or this task is experiencing network issues.
"""


def test_the_guard_relays_lines_and_turns_jax_verdict_into_one():
    import io
    import signal as sig
    step = b"I1202 18:28:40.1 1 loop.py:347] step 4/40 | loss 41.2031\n"
    traceback = (b"Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                 b"jax.errors.JaxRuntimeError: UNKNOWN: Gloo AllGather failed\n")
    aborted = sig.SIGABRT  # a wait status of a process killed by it
    for dump, victim, me, who in ((HEARTBEAT_VERDICT, "1", 0, "lost process 1 of 3: it stopped"),
                                  (LEADER_VERDICT, "0", 2, "lost process 0 of 3 (the "
                                                           "coordinator)")):
        out = io.BytesIO()
        relay = guard.Relay(me, 3, "run_pretraining", out)
        for line in (step + traceback + dump).splitlines(keepends=True):
            relay.feed(line)
        assert relay.finish(aborted) == guard.LOST_PROCESS_EXIT_CODE
        lines = out.getvalue().decode().splitlines()
        assert lines[0] == step.decode().strip() and len(lines) == 2, lines
        assert lines[1].startswith(f"run_pretraining: error: {who}"), (victim, lines[1])
        assert lines[1].endswith(f"process {me} stopped. Rerun every process to resume from "
                                 "the last checkpoint")
    # No verdict: every line comes through, in order, and the child's own exit code.
    out = io.BytesIO()
    relay = guard.Relay(1, 2, "run_pretraining", out)
    held = b"E1202 18:00:00.0 1 coordination_service_agent.cc:1] a passing complaint\n"
    for line in (step, held, step, traceback):
        relay.feed(line)
    assert relay.finish(1 << 8) == 1  # exit(1)
    assert out.getvalue() == step + held + step + traceback
    assert guard.Relay(None, None, "run_finetuning").finish(sig.SIGKILL) == 128 + sig.SIGKILL
