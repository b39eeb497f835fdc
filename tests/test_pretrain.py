"""The pre-training run: resume, learning, checkpoints and logs, bad flags, FLOP/s and
MFU (logs, scalars, returned metrics) and the --profile_steps trace."""

import glob
import json
import logging
import math
import os
import re
import uuid

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.configs import load_config
from electra_tf.pretraining import flops, pretrain
from electra_tf.training.tf_runtime.trainer import TfRuntime
from electra_tf.training import checkpoints, hardware, loop
from electra_tf.training.loop import RunError, parse_profile_steps
from electra_tf.training.options import PretrainingOptions

import forked_cli
from conftest import REPO, free_ports


def _options(model_dir, data, **kw):
    """Run options on the CPU; no XLA unless asked for (a graph compiles in about half
    the time, and the learning runs below cover XLA through the whole run)."""
    kw.setdefault("jit_compile", False)
    return PretrainingOptions(model_dir=str(model_dir), train_data=data, strategy="cpu", **kw)


def _cfg(**overrides):
    base = {"train_batch_size": 8, "num_train_steps": 6, "save_checkpoints_steps": 3,
            "steps_per_loop": 3, "log_every_steps": 3, "warmup_steps": 2}
    base.update(overrides)
    return load_config("tiny", {k: str(v) for k, v in base.items()})


def _final_weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    names = sorted(n for n, _ in tf.train.list_variables(str(model_dir))
                   if n.startswith("model/") and "OPTIMIZER" not in n)
    return {n: reader.get_tensor(n) for n in names}


def test_schedule_of_a_train_config():
    """Pre-training logs every log_every_steps; fine-tuning gives its own step count and
    logs after every host loop (loops then end at steps_per_loop multiples)."""
    tc = _cfg(num_train_steps=10, steps_per_loop=4, log_every_steps=8,
              save_checkpoints_steps=6, on_nan="stop").train
    assert loop.Schedule.of(tc) == loop.Schedule(10, 8, 4, 8, 6, "stop", False)
    assert loop.Schedule.of(tc, 30, log_each_loop=True) == \
        loop.Schedule(30, 8, 4, 4, 6, "stop", True)


@pytest.mark.parametrize("asked, resolved", [("auto", "float32"), ("bfloat16", "bfloat16")])
def test_setup_resolves_and_sets_the_precision(tmp_path, asked, resolved):
    from electra_tf.training import backends, runtime
    try:
        devices, cfg, chief = backends.setup(_options(tmp_path, None), _cfg(precision=asked))
        assert chief and devices.platform == "CPU" and devices.backend == "tensorflow"
        assert cfg.train.precision == runtime.active_precision() == resolved
        assert cfg.model == _cfg().model
    finally:
        runtime.set_precision("float32")


def test_write_results_sorts_keys_and_checks_the_lease_first(tmp_path):
    from electra_tf.training.lease import LeaseError

    class Taken:
        def check(self):
            raise LeaseError("taken")
    path = str(tmp_path / "results.json")
    with pytest.raises(LeaseError):
        loop.write_results(path, {"b": 1}, Taken())
    assert os.listdir(tmp_path) == []
    loop.write_results(path, {"b": 1, "a": 0.5})
    assert open(path).read() == '{\n  "a": 0.5,\n  "b": 1\n}\n'


@pytest.fixture(scope="module")
def straight(tmp_path_factory, sample_build):
    """A 6-step run of _cfg() straight through (ckpt-3, ckpt-6), made once for the resume
    tests, which compare against its weights or work on a copy of it."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    pretrain.run(_cfg(), _options(run_dir, sample_build[0]))
    return run_dir


@pytest.mark.every_leg
@pytest.mark.e2e
def test_resume_gives_identical_weights(tmp_path, sample_build, straight, monkeypatch):
    """6 steps straight == 3 steps, a crash right after the checkpoint, then a rerun of
    the same command: same weights, bit for bit (data position and RNG are restored)."""
    data = sample_build[0]

    resumed = tmp_path / "resumed"
    real_save = tf.train.CheckpointManager.save

    def save_then_crash(self, *args, **kwargs):
        path = real_save(self, *args, **kwargs)
        raise KeyboardInterrupt("simulated crash after " + path)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        pretrain.run(_cfg(), _options(resumed, data))
    monkeypatch.setattr(tf.train.CheckpointManager, "save", real_save)
    assert tf.train.latest_checkpoint(str(resumed)).endswith("ckpt-3")
    pretrain.run(_cfg(), _options(resumed, data))

    a, b = _final_weights(straight), _final_weights(resumed)
    assert tf.train.latest_checkpoint(str(resumed)).endswith("ckpt-6")
    assert a.keys() == b.keys() and len(a) > 20
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.e2e
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_ends_the_same(
        tmp_path, sample_build, straight, caplog):
    """The newest checkpoint truncated (a torn copy): the rerun names it, moves it to
    damaged_checkpoints/, resumes from the one before and ends bit-identical to an
    uninterrupted run; with every checkpoint damaged it stops, changing nothing."""
    import shutil
    caplog.set_level("INFO", logger="absl")
    data = sample_build[0]
    run = tmp_path / "run"
    shutil.copytree(straight, run)  # a finished 6-step run of the same command
    newest = run / "ckpt-6.data-00000-of-00001"
    size = newest.stat().st_size
    with open(newest, "r+b") as f:
        f.truncate(size // 2)
    pretrain.run(_cfg(), _options(run, data))
    assert f"the checkpoint {run}/ckpt-6 is damaged (ckpt-6.data-00000-of-00001 has " \
        f"{size // 2} of its " in caplog.text
    assert f"Resumed from {run}/ckpt-3 (step 3)" in caplog.text
    aside = list((run / checkpoints.DAMAGED_DIR).iterdir())
    assert len(aside) == 1 and (aside[0] / newest.name).stat().st_size == size // 2
    a, b = _final_weights(straight), _final_weights(run)
    assert a.keys() == b.keys() and len(a) > 20
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)

    for prefix in ("ckpt-3", "ckpt-6"):
        os.remove(run / f"{prefix}.index")
    before = sorted(os.listdir(run))
    with pytest.raises(checkpoints.CheckpointError, match=f"^no complete checkpoint in {run}: "
                       "ckpt-6 \\(no ckpt-6.index\\); ckpt-3 \\(no ckpt-3.index\\)"):
        pretrain.run(_cfg(num_train_steps=9), _options(run, data))
    assert sorted(os.listdir(run)) == before


@pytest.mark.e2e
def test_a_second_run_on_the_same_model_dir_stops_before_writing(tmp_path, sample_build):
    from electra_tf.training import lease
    run = tmp_path / "run"
    with lease.RunLease(str(run)):  # another process's run, as its lease says
        with pytest.raises(lease.LeaseError, match=f"^{run} is in use by another run: pid "
                           f"{os.getpid()} on host "):
            pretrain.run(_cfg(), _options(run, sample_build[0]))
        assert sorted(os.listdir(run)) == [lease.LEASE_FILE]  # not even config.json


@pytest.mark.e2e
def test_outputs_of_a_run(tmp_path, sample_build):
    out = tmp_path / "run"
    metrics = pretrain.run(_cfg(), _options(out, sample_build[0], do_eval=True,
                                          eval_data=sample_build[0]))
    assert json.load(open(out / "config.json"))["model"]["hidden_size"] == 128
    assert os.path.exists(out / "eval_results.json")
    assert json.load(open(out / "eval_results.json"))["step"] == 6
    assert set(metrics) >= {"masked_lm_loss", "disc_loss", "disc_auc", "loss"}
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(out / "train"))
    # The discriminator-only checkpoint uses the released TF1 names and nothing else.
    names = dict(tf.train.list_variables(str(out / "discriminator")))
    assert "electra/encoder/layer_1/output/dense/kernel" in names
    assert "discriminator_predictions/dense_1/kernel" in names
    assert not [n for n in names if n.startswith("generator")]


def _learn(tmp_path, data, steps, **overrides):
    """Eval metrics after `steps` steps of batch 32 (20 held-in batches), under XLA (the
    default on the CPU). The metrics at initialisation are known: an MLM loss of ln V and
    a discriminator loss near ln 2 (test_pretraining_trainer.test_losses_at_initialisation; on
    these 20 batches 10.36 and 0.72, measured), a sampled-original rate near 1/V."""
    cfg = _cfg(train_batch_size=32, num_train_steps=steps, save_checkpoints_steps=steps,
               steps_per_loop=40, log_every_steps=40, **overrides)
    return pretrain.run(cfg, _options(tmp_path / "learn", data, do_eval=True, eval_data=data,
                                   jit_compile=None))


@pytest.mark.every_leg
@pytest.mark.e2e
def test_learning_on_the_bundled_sample(tmp_path, sample_build):
    """ELECTRA on the tiny preset: within 60 steps the generator's MLM loss falls by
    several nats, it starts sampling the original token, and the discriminator's loss
    falls far below its initial ln 2 region. (Measured on an AMD EPYC: after 50 steps MLM
    loss 7.41, accuracy 0.054, discriminator loss 0.418, sampled-original rate 0.012.)"""
    after = _learn(tmp_path, sample_build[0], 60, warmup_steps=10, learning_rate=2e-3)
    assert after["masked_lm_loss"] < math.log(30522) - 2.5
    assert after["masked_lm_accuracy"] > 0.03
    assert after["disc_loss"] < 0.65 * math.log(2)
    # A generator that learns samples the original more often (such a sample counts as
    # "real"), where the near-uniform generator at initialisation almost never does.
    assert after["sampled_masked_lm_accuracy"] > 0.005


@pytest.mark.e2e
def test_discriminator_learns_to_detect_replacements(tmp_path, sample_build):
    """With uniform replacements the discriminator must read the context: within 80 steps
    it beats the all-"original" baseline clearly and ranks replaced tokens first. (Measured
    on an AMD EPYC after 80 steps: accuracy 0.899 against the baseline's 0.852, AUC 0.93,
    recall 0.57, precision 0.69.)"""
    after = _learn(tmp_path, sample_build[0], 80, warmup_steps=20, learning_rate=5e-4,
                   generator="uniform")
    baseline = 1.0 - after["replaced_fraction"]
    assert after["disc_accuracy"] > baseline + 0.02, (after, baseline)
    assert after["disc_auc"] > 0.8
    assert after["disc_recall"] > 0.1 and after["disc_precision"] > 0.5


def _cli(*args, cwd=REPO):
    return forked_cli.run(["run_pretraining.py", *args], cwd=cwd, timeout=300)


@pytest.mark.parametrize("args, needle", [
    (["--params_override=hidden_sise=64"], "unknown config key 'hidden_sise'"),
    (["--max_seq_length=1024"], "exceeds the model's max_position_embeddings=128"),
    (["--params_override=vocab_size=1000"], "vocab_size=1000"),
    (["--train_data=/no/such/data*"], "/no/such/data*"),
    (["--config=huge"], "presets:"),
    (["--grad_accum_steps=3", "--train_batch_size=32"], "not a multiple"),
])
@pytest.mark.subprocess
def test_bad_flags_are_one_line_errors(tmp_path, sample_build, args, needle):
    data = [] if any(a.startswith("--train_data") for a in args) else \
        [f"--train_data={sample_build[0]}"]
    done = _cli(f"--model_dir={tmp_path / 'm'}", "--num_train_steps=1", *data, *args)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("run_pretraining: error:") and needle in last, last


WORKER_SCRIPT = """
import sys
from absl import logging
from electra_tf.pretraining import pretrain
from electra_tf.training import preemption
from electra_tf.configs import load_config
from electra_tf.training.options import PretrainingOptions
cfg = load_config("tiny", sys.argv[3])
logging.set_verbosity(logging.INFO)
pretrain.run(cfg, PretrainingOptions(model_dir=sys.argv[1], train_data=sys.argv[2],
                          strategy="multi_worker"))
"""

# As run_pretraining.py: a preemption exits with PREEMPTED_EXIT_CODE.
PREEMPTIBLE_WORKER_SCRIPT = WORKER_SCRIPT.replace("pretrain.run(", "try:\n  pretrain.run(").replace(
    'strategy="multi_worker"))', 'strategy="multi_worker"))\n'
    'except preemption.Preempted as e:\n  print(e, file=sys.stderr)\n'
    '  sys.exit(preemption.PREEMPTED_EXIT_CODE)')

NO_DROPOUT = {"hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0}


def _start_workers(script, model_dir, data, overrides, stdout=forked_cli.PIPE):
    """Two worker processes of one MultiWorkerMirroredStrategy job on localhost."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    return [forked_cli.start(
        ["-c", script, str(model_dir), data, overrides], cwd=REPO,
        stdout=stdout, stderr=forked_cli.PIPE,
        env=dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}})))
        for i in range(2)]


def _finish(procs, timeout=420):
    """The workers' stderr once they exit (killed if they outlive `timeout`)."""
    try:
        return [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize("on_nan, needle", [("stop", "on_nan=stop"),
                                            ("skip", "in a row, the run cannot recover")])
@pytest.mark.e2e
def test_non_finite_steps_never_reach_a_checkpoint(tmp_path, sample_build, monkeypatch,
                                                   on_nan, needle):
    """A learning rate of 1e30 blows the weights up after one step; the next step's loss
    is NaN. It is never applied, and the run stops naming the step and the last good
    checkpoint (at once with on_nan=stop, after MAX_CONSECUTIVE_SKIPS with skip)."""
    monkeypatch.setattr(loop, "MAX_CONSECUTIVE_SKIPS", 4)
    cfg = _cfg(learning_rate=1e30, warmup_steps=0, num_train_steps=20, steps_per_loop=1,
               save_checkpoints_steps=1, log_every_steps=1, on_nan=on_nan)
    out = tmp_path / on_nan
    with pytest.raises(RunError, match=needle) as error:
        pretrain.run(cfg, _options(out, sample_build[0]))
    assert "at step 2 " in str(error.value) and str(out / "ckpt-1") in str(error.value)
    latest = tf.train.latest_checkpoint(str(out))
    assert latest.endswith("ckpt-1")
    weights = _final_weights(out)
    assert all(np.all(np.isfinite(w)) for w in weights.values())


@pytest.mark.e2e
def test_full_disk_when_saving_stops_with_the_last_good_checkpoint(tmp_path, sample_build,
                                                                    monkeypatch):
    """A checkpoint write that fails (here: ENOSPC from the second save on) stops the run
    with one line naming the directory and the last good checkpoint, which stays the
    newest one a rerun would load."""
    real_save = tf.train.CheckpointManager.save
    calls = []

    def failing_save(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", failing_save)
    run_dir = tmp_path / "run"
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"could not write the step-6 checkpoint to "
                       rf"{run_dir} \(No space left on device\); last good checkpoint: "
                       rf"{run_dir}/ckpt-3; free space"):
        pretrain.run(_cfg(), _options(run_dir, sample_build[0]))
    assert tf.train.latest_checkpoint(str(run_dir)).endswith("ckpt-3")


def _one_process_weights(cfg, data, steps, path):
    """The weights one process on one device reaches over `steps` of the two-worker job's
    global batches (worker 0's rows, then worker 1's), saved at `path`; and how far they
    moved from the initial ones."""
    from electra_tf.data.dataset import make_dataset
    from electra_tf.data.files import resolve_files
    from runtimes import tf_pretrainer

    one = tf_pretrainer(cfg, tf.distribute.OneDeviceStrategy("/cpu:0"))  # seeds, as run() does
    start = [w.copy() for w in one.model.get_weights()]
    icfg = pretrain.input_config(resolve_files(data), cfg, cfg.train.train_batch_size, True)
    halves = [make_dataset(icfg, tf.distribute.InputContext(2, w, 2)) for w in range(2)]
    global_batches = tf.data.Dataset.zip(tuple(halves)).map(
        lambda a, b: {k: tf.concat([a[k], b[k]], 0) for k in a})
    one.make_train_loop()(iter(one.strategy.distribute_datasets_from_function(
        lambda ctx: global_batches)), tf.constant(steps))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(start, one.model.get_weights()))
    return tf.train.Checkpoint(model=one.model).save(path), moved


@pytest.mark.subprocess
@pytest.mark.e2e
def test_a_preempted_two_worker_job_resumes_and_equals_one_process(tmp_path, sample_build):
    """Two worker processes on localhost under MultiWorkerMirroredStrategy, each reading
    its own file shards. SIGTERM to worker 1: the workers' notice flags, summed after each
    host loop, make both save at the same step and exit 75, and only the chief writes
    model_dir; the same command then finishes the run, and its weights are those of one
    process that trains on the same global batches (worker 0's rows, then worker 1's)
    straight through."""
    import signal
    import threading

    data = sample_build[0]
    steps = 12
    overrides = dict(NO_DROPOUT, train_batch_size=8, num_train_steps=steps,
                     save_checkpoints_steps=steps, steps_per_loop=2, log_every_steps=2,
                     warmup_steps=2)
    override_text = ",".join(f"{k}={v}" for k, v in overrides.items())
    model_dir = tmp_path / "mw"

    def start():
        return _start_workers(PREEMPTIBLE_WORKER_SCRIPT, model_dir, data, override_text,
                              stdout=forked_cli.DEVNULL)

    procs = start()
    # Drain the chief's stderr so that it never blocks on a full pipe.
    chief_log, worker_log = [], []
    reader = threading.Thread(target=lambda: chief_log.append(procs[0].stderr.read()),
                              daemon=True)
    reader.start()
    try:
        for line in procs[1].stderr:  # worker 1 under way: preempt it
            worker_log.append(line)
            if f"step 4/{steps}" in line:
                procs[1].send_signal(signal.SIGTERM)
                break
        procs[0].wait(timeout=240)
        reader.join(timeout=30)
    finally:
        rest = _finish(procs, timeout=240)[1]
    assert [p.returncode for p in procs] == [75, 75], rest[-2000:]
    # The chief saved at the agreed step, between the periodic saves.
    stopped = int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])
    assert 4 <= stopped < steps
    assert f"SIGTERM at step {stopped}: saved " in rest, rest[-2000:]
    assert f"a preemption notice to another worker at step {stopped}: saved " \
        f"{model_dir}/ckpt-{stopped}" in "".join(chief_log), "".join(chief_log)[-2000:]

    # Each worker's input pipeline read its own half of the shards.
    read = []
    for index, err in enumerate(("".join(chief_log), "".join(worker_log))):
        line = [ln for ln in err.splitlines() if f"Input pipeline {index} of 2:" in ln][0]
        read.append(set(line.split("file(s), ")[1].split(", ")))
    assert read[0] and read[1] and not read[0] & read[1]

    procs = start()
    logs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], logs[0][-2000:]
    assert f"(step {stopped})" in logs[0]  # resumed where the preemption saved
    # The chief alone wrote the run's outputs; the other worker's scratch copies are gone.
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{steps}")
    assert not os.path.exists(model_dir / ".workers" / "worker_1")
    assert os.path.exists(model_dir / "discriminator" / "checkpoint")

    # One process, one device, the same global batches, no stop.
    cfg = load_config("tiny", {k: str(v) for k, v in overrides.items()})
    reference, moved = _one_process_weights(cfg, data, steps, str(tmp_path / "one" / "ckpt"))
    assert moved > 1e-4
    got, want = tf.train.load_checkpoint(str(model_dir)), tf.train.load_checkpoint(reference)
    names = [n for n, _ in tf.train.list_variables(reference) if n.startswith("model/")]
    assert len(names) > 20
    for name in names:
        np.testing.assert_allclose(got.get_tensor(name), want.get_tensor(name), atol=1e-5,
                                   err_msg=name)


def test_torn_checkpoint_writes_are_removed_and_never_loaded(tmp_path):
    """What a kill during a save leaves (ckpt-N_temp/ staging) is deleted before the
    next run writes there; complete checkpoints and other files stay."""
    run_dir = tmp_path / "run"
    torn = run_dir / "ckpt-30_temp"
    torn.mkdir(parents=True)
    (torn / "part-00000-of-00001.data-00000-of-00001.tempstate123").write_bytes(b"x" * 1000)
    (run_dir / "ckpt-20.index").write_bytes(b"i" * 10)
    (run_dir / "checkpoint.tmp0af3c9").write_bytes(b"c" * 7)
    (run_dir / "notes_temp").mkdir()
    assert checkpoints.remove_torn_checkpoints(str(run_dir)) == 1007
    assert sorted(os.listdir(run_dir)) == ["ckpt-20.index", "notes_temp"]
    assert checkpoints.remove_torn_checkpoints(str(tmp_path / "missing")) == 0


@pytest.fixture
def ram_root():
    """A unique root on TensorFlow's in-memory filesystem (ram:// matches names by
    prefix, so every test gets its own), removed afterwards."""
    root = f"ram://train_{uuid.uuid4().hex}"
    yield root
    if tf.io.gfile.exists(root):
        tf.io.gfile.rmtree(root)


def test_torn_checkpoint_writes_are_removed_on_a_remote_filesystem(ram_root):
    run_dir = f"{ram_root}/run"
    tf.io.gfile.makedirs(f"{run_dir}/ckpt-30_temp")
    tf.io.gfile.makedirs(f"{run_dir}/notes_temp")
    for name, size in [("ckpt-30_temp/part-00000-of-00001.tempstate1", 1000),
                       ("ckpt-20.index", 10), ("checkpoint.tmp0af3c9", 7),
                       ("config.json.0123456789ab.tmp", 5), ("config.json", 3)]:
        with tf.io.gfile.GFile(f"{run_dir}/{name}", "wb") as f:
            f.write(b"x" * size)
    assert checkpoints.remove_torn_checkpoints(run_dir) == 1012
    assert sorted(n.rstrip("/") for n in tf.io.gfile.listdir(run_dir)) == [
        "ckpt-20.index", "config.json", "notes_temp"]
    assert checkpoints.remove_torn_checkpoints(f"{ram_root}/missing") == 0


# ----------------------------------------------------------------------------- FLOP/s, MFU and --profile_steps

def _profile_cfg():
    """The tiny run above, 4 steps with one log line and one checkpoint at the end."""
    return _cfg(num_train_steps=4, save_checkpoints_steps=4, log_every_steps=4)


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
    make_loop = TfRuntime.make_train_loop

    def recording(self, phase=0):
        loop = make_loop(self, phase)

        def run(iterator, num_steps):
            loop_steps.append(int(num_steps))
            return loop(iterator, num_steps)
        return run

    monkeypatch.setattr(TfRuntime, "make_train_loop", recording)
    caplog.set_level(logging.INFO, logger="absl")
    cfg = _profile_cfg()
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
        pretrain.run(_profile_cfg(), PretrainingOptions(model_dir=str(tmp_path), strategy="cpu",
                                           peak_flops="-5"))


@pytest.mark.subprocess
def test_bad_profile_steps_flag_is_a_one_line_error(tmp_path):
    done = _cli(f"--model_dir={tmp_path}", "--profile_steps=10,5")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("run_pretraining: error: --profile_steps=10,5: expected START,END global "
                    "steps with 0 <= START < END, e.g. 100,110"), last
