"""Bad inputs to the five user tools, run as a user runs them (`python run_pretraining.py`,
`python run_finetuning.py`, `python -m tfrecord_builder`, `python -m
electra_tf.conversion.convert`, `python -m electra_tf.pretraining.score`, each a
subprocess). For every case: the exit code, stderr's last line (the one error line, no
traceback anywhere), and that nothing finished earlier was lost (checkpoints byte for
byte, builds, files that stood in the way).

One tiny build and one 6-step pre-training run (ckpt-2, ckpt-4, ckpt-6) are made once per
module; a case that damages or extends a run works on a copy of it."""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import sys
import time

import numpy as np
import pytest

import forked_cli
from conftest import NEWS, REPO, VOCAB, WIKI

_spec = importlib.util.spec_from_file_location(
    "fault_injection", os.path.join(REPO, "bench", "fault_injection.py"))
fi = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fi)

PRETRAIN = [sys.executable, "run_pretraining.py"]
FINETUNE = [sys.executable, "run_finetuning.py"]
BUILDER = [sys.executable, "-m", "tfrecord_builder"]
CONVERT = [sys.executable, "-m", "electra_tf.conversion.convert"]
SCORE = [sys.executable, "-m", "electra_tf.pretraining.score"]

# Every pre-training command of this module trains the base run's shape; --peak_flops
# spares each process the 2 s matmul that measures the CPU for the MFU column.
TRAIN_FLAGS = ["--train_batch_size=4", "--max_seq_length=32", "--nojit_compile",
               "--save_checkpoints_steps=2", "--steps_per_loop=2",
               "--params_override=log_every_steps=2", "--peak_flops=1e11"]
STEP_LINE = re.compile(r"\] step (\d+)/(\d+) \|")
TRUNCATED = 1000  # bytes a truncated checkpoint data file keeps


def _run(cmd, *args, timeout=300, env=None):
    """`cmd args` run to the end (a process forked from one that has TensorFlow imported:
    tests/forked_cli.py)."""
    assert cmd[0] == sys.executable
    return forked_cli.run([*cmd[1:], *args], timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def _tail(done):
    return f"rc={done.returncode}\n--- stderr tail:\n{done.stderr[-3000:]}"


def _last_line(done, code, prefix):
    """stderr's last line, after checking the exit code, that no traceback was printed,
    and that the error is that one line: the only line that starts with `prefix`."""
    assert done.returncode == code, _tail(done)
    assert "Traceback" not in done.stderr, _tail(done)
    lines = done.stderr.rstrip("\n").splitlines()
    assert lines, _tail(done)
    assert lines[-1].startswith(prefix), _tail(done)
    assert [l for l in lines if l.startswith(prefix)] == [lines[-1]], _tail(done)
    return lines[-1]


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _checkpoint_files(directory):
    """{name: sha256} of the checkpoint files at the top of a run directory."""
    return {name: sha for name, sha in fi.dir_digest(directory).items()
            if name.startswith("ckpt-") or name == "checkpoint"}


def _tree(directory):
    """{relative path: size} of every file under `directory`."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = os.path.getsize(path)
    return out


def _copy_run(base, tmp_path, name="run"):
    return shutil.copytree(base["dir"], str(tmp_path / name))


def _pretrain(model_dir, data, steps, *extra, timeout=300, env=None):
    return _run(PRETRAIN, f"--model_dir={model_dir}", f"--train_data={data}",
                f"--num_train_steps={steps}", *TRAIN_FLAGS, *extra, timeout=timeout, env=env)


# The runtimes a command-line error is checked under: the JAX backend's (--backend=jax)
# errors are the same lines.
BACKENDS = [pytest.param("tensorflow", id="tf"),
            pytest.param("jax", id="jax", marks=[pytest.mark.jax, pytest.mark.skipif(
                importlib.util.find_spec("jax") is None, reason="jax not installed")])]


def _backend_args(backend):
    """-> (extra flags, environment) of a command on `backend`."""
    if backend == "jax":
        return ["--backend=jax"], {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    return [], None


def _steps(stderr):
    return [(int(a), int(b)) for a, b in STEP_LINE.findall(stderr)]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The Wikipedia sample at length 32 in 4 shards, built by the CLI."""
    out = str(tmp_path_factory.mktemp("bad_inputs") / "data")
    done = _run(BUILDER, f"--input={WIKI}", f"--vocab_file={VOCAB}", f"--output_dir={out}",
                "--max_seq_length=32", "--num_shards=4", "--num_workers=1")
    assert done.returncode == 0, _tail(done)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory, data):
    """A finished 6-step tiny run with ckpt-2, ckpt-4 and ckpt-6; read-only for the tests
    (`sha`: its checkpoint files' sha256, to compare copies against)."""
    model_dir = str(tmp_path_factory.mktemp("bad_inputs") / "base")
    done = _pretrain(model_dir, data, 6)
    assert done.returncode == 0, _tail(done)
    assert _steps(done.stderr) == [(2, 6), (4, 6), (6, 6)]
    sha = _checkpoint_files(model_dir)
    assert {n for n in sha if n.endswith(".index")} == {"ckpt-2.index", "ckpt-4.index",
                                                        "ckpt-6.index"}
    return {"dir": model_dir, "sha": sha,
            "data_bytes": os.path.getsize(os.path.join(model_dir,
                                                       "ckpt-6.data-00000-of-00001"))}


@pytest.fixture(scope="module")
def truncated_run(tmp_path_factory, base):
    """A copy of the base run whose newest checkpoint's data file lost all but its first
    TRUNCATED bytes (a torn copy); only read by the tests that use it."""
    d = shutil.copytree(base["dir"], str(tmp_path_factory.mktemp("bad_inputs") / "torn"))
    os.truncate(os.path.join(d, "ckpt-6.data-00000-of-00001"), TRUNCATED)
    return d


def _write_task(root, train_rows, dev_rows, name="mine"):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    for split, rows in (("train", train_rows), ("dev", dev_rows)):
        with open(os.path.join(root, name, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n" + "".join(r + "\n" for r in rows))
    return root


def _rows(n):
    return [f"a good film {i}\tpos" if i % 2 else f"a bad film {i}\tneg" for i in range(n)]


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    """A user TSV task `mine`: 16 training rows (2 steps of 8), 8 dev rows."""
    return _write_task(str(tmp_path_factory.mktemp("bad_inputs") / "tsv"), _rows(16),
                       _rows(8))


def _finetune_flags(data_dir, init, model_dir):
    return ["--task=mine", f"--data_dir={data_dir}", "--text_columns=sentence",
            "--label_column=label", f"--init_checkpoint={init}", f"--model_dir={model_dir}",
            "--max_seq_length=16", "--train_batch_size=8", "--eval_batch_size=8",
            "--num_train_epochs=1"]


def _no_checkpoint_under(directory):
    return not any(n.endswith(".index") for n in _tree(directory)) \
        if os.path.isdir(directory) else True


# ----------------------------------------------- 1. a damaged newest checkpoint at resume


# How the newest checkpoint (ckpt-6) is damaged, and how the warning must say it.
DAMAGE = {
    "index_deleted": (lambda d: os.remove(os.path.join(d, "ckpt-6.index")),
                      "no ckpt-6.index"),
    "data_truncated": (lambda d: os.truncate(os.path.join(d, "ckpt-6.data-00000-of-00001"),
                                             TRUNCATED),
                       "ckpt-6.data-00000-of-00001 has {truncated} of its {size} bytes"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.subprocess
@pytest.mark.e2e
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_before_it(
        tmp_path, base, data, damage):
    """The newest checkpoint of a finished run damaged, the same command with more steps:
    one warning naming it, its files moved (not deleted) into damaged_checkpoints/<time>/,
    the run resumes from ckpt-4 (never from step 0), writes ckpt-6 and ckpt-8 again, and
    ckpt-2 and ckpt-4 stay byte for byte."""
    d = _copy_run(base, tmp_path)
    apply, problem = DAMAGE[damage]
    apply(d)
    problem = problem.format(truncated=TRUNCATED, size=base["data_bytes"])
    left = sorted(n for n in os.listdir(d) if n.startswith("ckpt-6."))
    left_sha = {n: _sha(os.path.join(d, n)) for n in left}

    done = _pretrain(d, data, 8)
    assert done.returncode == 0, _tail(done)
    assert "Traceback" not in done.stderr
    warning = re.search(rf"\] the checkpoint {re.escape(d)}/ckpt-6 is damaged \((.*)\); "
                        rf"moved to {re.escape(d)}/damaged_checkpoints/(\S+); using ckpt-4\n",
                        done.stderr)
    assert warning, _tail(done)
    assert warning.group(1) == problem
    assert len(re.findall(r" is damaged ", done.stderr)) == 1
    stamp = warning.group(2)
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z", stamp), stamp
    assert f"Resumed from {d}/ckpt-4 (step 4)\n" in done.stderr, _tail(done)
    assert _steps(done.stderr) == [(6, 8), (8, 8)]  # never from step 0

    # What was left of ckpt-6 is in the folder the warning names, unchanged.
    aside = os.path.join(d, "damaged_checkpoints")
    assert os.listdir(aside) == [stamp]
    assert {n: _sha(os.path.join(aside, stamp, n))
            for n in os.listdir(os.path.join(aside, stamp))} == left_sha
    after = _checkpoint_files(d)
    for name, sha in base["sha"].items():
        if name.startswith(("ckpt-2.", "ckpt-4.")):
            assert after.get(name) == sha, name
    assert {n for n in after if n.endswith(".index")} == {
        "ckpt-2.index", "ckpt-4.index", "ckpt-6.index", "ckpt-8.index"}
    assert fi.latest_step(d) == 8 and fi.checkpoint_problem(d) is None


@pytest.mark.subprocess
def test_no_complete_checkpoint_stops_the_run_and_changes_nothing(tmp_path, base, data):
    """Every checkpoint damaged: exit 1, one line listing each and what is wrong; no file
    moved, deleted or added among the checkpoints, nothing trained."""
    d = _copy_run(base, tmp_path)
    os.remove(os.path.join(d, "ckpt-6.index"))
    for step in (2, 4):
        os.truncate(os.path.join(d, f"ckpt-{step}.data-00000-of-00001"), TRUNCATED)
    before_ckpts, before_tree = _checkpoint_files(d), _tree(d)

    done = _pretrain(d, data, 8)
    last = _last_line(done, 1, "run_pretraining: error: ")
    n = base["data_bytes"]
    assert last == (
        f"run_pretraining: error: no complete checkpoint in {d}: ckpt-6 (no ckpt-6.index); "
        f"ckpt-4 (ckpt-4.data-00000-of-00001 has {TRUNCATED} of its {n} bytes); "
        f"ckpt-2 (ckpt-2.data-00000-of-00001 has {TRUNCATED} of its {n} bytes). Nothing was "
        "changed; restore the missing files, or move them away to start this run over")
    assert _checkpoint_files(d) == before_ckpts
    assert not os.path.exists(os.path.join(d, "damaged_checkpoints"))
    assert not os.path.exists(os.path.join(d, "lease.json"))
    assert _steps(done.stderr) == []
    # The same files at the same sizes, config.json included (it is written only once the
    # checkpoints are resolved).
    assert _tree(d) == before_tree


# ------------------------------- 2. fine-tuning and conversion from a damaged run directory


@pytest.mark.subprocess
@pytest.mark.e2e
def test_finetuning_from_a_run_dir_uses_the_checkpoint_before_a_damaged_newest(
        tmp_path, base, truncated_run, tsv):
    d = truncated_run
    before = _checkpoint_files(d)
    model_dir = str(tmp_path / "ft")
    done = _run(FINETUNE, *_finetune_flags(tsv, d, model_dir))
    assert done.returncode == 0, _tail(done)
    assert "Traceback" not in done.stderr
    warnings = re.findall(r"\] (--init_checkpoint: the checkpoint .*)\n", done.stderr)
    assert warnings == [
        f"--init_checkpoint: the checkpoint {d}/ckpt-6 is damaged (ckpt-6.data-00000-of-00001 "
        f"has {TRUNCATED} of its {base['data_bytes']} bytes); using ckpt-4"], _tail(done)
    assert re.fullmatch(r"mine dev accuracy: median [01]\.\d{4} over 1 trial\(s\) "
                        rf"\([01]\.\d{{4}}\); results in {re.escape(model_dir)}/results\.json\n",
                        done.stdout), done.stdout
    with open(os.path.join(model_dir, "results.json")) as f:
        results = json.load(f)
    assert results["labels"] == ["neg", "pos"] and results["num_train_steps"] == 2
    assert os.path.exists(os.path.join(model_dir, "trial_0", "ckpt-2.index"))
    # A reader of the run directory sets nothing aside: that is the owning run's job.
    assert _checkpoint_files(d) == before
    assert not os.path.exists(os.path.join(d, "damaged_checkpoints"))


@pytest.mark.subprocess
def test_export_hf_from_a_run_dir_uses_the_checkpoint_before_a_damaged_newest(
        tmp_path, base, truncated_run):
    import tensorflow as tf
    from safetensors.numpy import load_file
    d = truncated_run
    before = _checkpoint_files(d)
    out = str(tmp_path / "hf")
    done = _run(CONVERT, "export-hf", d, out)
    assert done.returncode == 0, _tail(done)
    assert "Traceback" not in done.stderr
    assert (f"WARNING:absl:the checkpoint {d}/ckpt-6 is damaged (ckpt-6.data-00000-of-00001 "
            f"has {TRUNCATED} of its {base['data_bytes']} bytes); using ckpt-4\n"
            in done.stderr), _tail(done)
    assert done.stdout == f"{out}/discriminator\n{out}/generator\n"
    exported = load_file(os.path.join(out, "discriminator", "model.safetensors"))
    table = exported["electra.embeddings.word_embeddings.weight"]
    name = "model/embeddings/word_embeddings/.ATTRIBUTES/VARIABLE_VALUE"
    at = {s: tf.train.load_checkpoint(os.path.join(base["dir"], f"ckpt-{s}")).get_tensor(name)
          for s in (4, 6)}
    assert np.array_equal(table, at[4]) and not np.array_equal(table, at[6])
    assert _checkpoint_files(d) == before
    assert not os.path.exists(os.path.join(d, "damaged_checkpoints"))


# --------------------------------------------------------- 3. two runs on one model_dir


def _start(cmd, log_path, nice=0):
    """A command with its stderr in a file (no pipe to fill while the test waits)."""
    log = open(log_path, "w")
    try:
        assert cmd[0] == sys.executable
        return forked_cli.start(cmd[1:], cwd=REPO, stdout=forked_cli.DEVNULL, stderr=log,
                                nice=nice)
    finally:
        log.close()


def _wait_for(proc, log_path, pattern, timeout=180):
    """Waits until the log matches `pattern` (returns the match); fails if the process
    exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path) as f:
            match = re.search(pattern, f.read())
        if match:
            return match
        if proc.poll() is not None:
            with open(log_path) as f:
                pytest.fail(f"exited {proc.returncode} before {pattern!r}:\n{f.read()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {pattern!r} within {timeout} s")


def _stop(proc, sig, log_path, timeout=120):
    """Sends `sig`, waits for the exit, returns (exit code, stderr)."""
    try:
        proc.send_signal(sig)
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(log_path) as f:
        return proc.returncode, f.read()


def _long_run(d, data):
    """A pre-training command that would train far longer than a test waits; it saves only
    when stopped."""
    return [*PRETRAIN, f"--model_dir={d}", f"--train_data={data}", "--num_train_steps=5000",
            *TRAIN_FLAGS, "--save_checkpoints_steps=100000"]


def _stopped_at(last, d, reason):
    match = re.fullmatch(rf"run_pretraining: {reason} at step (\d+): saved {re.escape(d)}/"
                         r"ckpt-(\d+); rerun the same command to resume", last)
    assert match and match.group(1) == match.group(2), last
    return int(match.group(1))


@pytest.mark.subprocess
@pytest.mark.e2e
def test_a_second_run_on_a_busy_model_dir_stops_and_the_first_saves_on_sigterm(
        tmp_path, base, data):
    """A second run on a directory a live run trains into: exit 1, one line naming the
    holder's pid, nothing trained. The first goes on, saves on SIGTERM and exits 75 with
    the earlier checkpoints intact and its lease released; a rerun resumes there and
    trains on."""
    d = _copy_run(base, tmp_path)
    log = str(tmp_path / "first.log")
    # Niced: a training process takes every core it finds, and the second run, which
    # only has to start and be refused, would take three times as long beside it.
    first = _start(_long_run(d, data), log, nice=10)
    try:
        _wait_for(first, log, r"\] step \d+/5000 \|")
        second = _run(_long_run(d, data))
        assert first.poll() is None, "the first run ended while the second ran"
    finally:
        code, first_err = _stop(first, signal.SIGTERM, log)
    last = _last_line(second, 1, "run_pretraining: error: ")
    # The holder's start time, heartbeat age and the wait left vary from run to run.
    assert re.fullmatch(
        rf"run_pretraining: error: {re.escape(d)} is in use by another run: pid {first.pid} "
        rf"on host {re.escape(socket.gethostname())} \(run_pretraining\.py\), started "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, last heartbeat \d+ s ago\. Give this run "
        rf"another --model_dir, or, if that process is gone, delete {re.escape(d)}/lease\.json "
        r"\(or wait \d+ s for its lease to go stale\) and rerun", last), last
    assert _steps(second.stderr) == []

    assert code == 75, first_err[-3000:]
    assert "Traceback" not in first_err
    step = _stopped_at(first_err.rstrip("\n").splitlines()[-1], d, "SIGTERM")
    assert step > 6
    after = _checkpoint_files(d)
    assert {n: after.get(n) for n in base["sha"] if n != "checkpoint"} == \
        {n: s for n, s in base["sha"].items() if n != "checkpoint"}
    assert fi.latest_step(d) == step and fi.checkpoint_problem(d) is None
    assert not os.path.exists(os.path.join(d, "lease.json"))  # released on the way out

    # Two steps longer: the rerun restores the SIGTERM checkpoint and trains on from it
    # (the Ctrl-C test below reruns the same length: nothing left to train).
    done = _pretrain(d, data, step + 2)
    assert done.returncode == 0, _tail(done)
    assert f"Resumed from {d}/ckpt-{step} (step {step})\n" in done.stderr, _tail(done)
    assert _steps(done.stderr) == [(step + 2, step + 2)]
    assert fi.latest_step(d) == step + 2 and fi.checkpoint_problem(d) is None


@pytest.mark.subprocess
@pytest.mark.e2e
def test_a_lease_left_by_a_sigkilled_run_is_taken_over_at_once(tmp_path, base, data):
    """lease.json of a run SIGKILLed on this host does not block the rerun (no waiting for
    it to go stale): a warning naming the dead pid, then the usual resume."""
    d = _copy_run(base, tmp_path)
    log = str(tmp_path / "killed.log")
    killed = _start([*PRETRAIN, f"--model_dir={d}", f"--train_data={data}",
                     "--num_train_steps=6", *TRAIN_FLAGS], log)
    _wait_for(killed, log, r"Holding the lease on ")
    code, _ = _stop(killed, signal.SIGKILL, log)
    assert code == -signal.SIGKILL
    with open(os.path.join(d, "lease.json")) as f:
        assert json.load(f)["pid"] == killed.pid  # what the killed run left

    done = _pretrain(d, data, 6)
    assert done.returncode == 0, _tail(done)
    assert "Traceback" not in done.stderr
    assert re.search(rf"\] Taking over the lease on {re.escape(d)} from pid {killed.pid} on "
                     rf"host {re.escape(socket.gethostname())} \(run_pretraining\.py\), "
                     rf"started .*: pid {killed.pid} is no longer running on this host\n",
                     done.stderr), _tail(done)
    assert f"Resumed from {d}/ckpt-6 (step 6)\n" in done.stderr
    assert _checkpoint_files(d) == base["sha"]
    assert not os.path.exists(os.path.join(d, "lease.json"))


@pytest.mark.subprocess
@pytest.mark.e2e
def test_ctrl_c_saves_a_checkpoint_exits_130_and_the_rerun_resumes(tmp_path, base, data):
    """SIGINT while training: a checkpoint at the step reached, exit 130 and a last line
    saying where it saved; the rerun resumes from exactly that checkpoint."""
    d = _copy_run(base, tmp_path)
    log = str(tmp_path / "interrupted.log")
    proc = _start(_long_run(d, data), log)
    _wait_for(proc, log, r"\] step \d+/5000 \|")
    code, err = _stop(proc, signal.SIGINT, log)
    assert code == 130, err[-3000:]
    assert "Traceback" not in err
    step = _stopped_at(err.rstrip("\n").splitlines()[-1], d, "SIGINT")
    assert step > 6
    assert "Ctrl-C: saving a checkpoint after the current host loop, then stopping" in err
    assert fi.latest_step(d) == step and fi.checkpoint_problem(d) is None
    after = _checkpoint_files(d)
    assert {n: after.get(n) for n in base["sha"] if n != "checkpoint"} == \
        {n: s for n, s in base["sha"].items() if n != "checkpoint"}

    done = _pretrain(d, data, step)  # the same length: resumes and has nothing left
    assert done.returncode == 0, _tail(done)
    assert f"Resumed from {d}/ckpt-{step} (step {step})\n" in done.stderr, _tail(done)
    assert f"Already at step {step} of {step}: nothing to train" in done.stderr


# ------------------------------------------------------------------- 4. the builder


def _build(corpus, out, num_shards):
    """A one-worker build that must succeed -> (the process, its manifest)."""
    done = _run(BUILDER, f"--input={corpus}", f"--vocab_file={VOCAB}", f"--output_dir={out}",
                f"--num_shards={num_shards}", "--num_workers=1")
    assert done.returncode == 0, _tail(done)
    assert "Traceback" not in done.stderr
    with open(os.path.join(out, "manifest.json")) as f:
        return done, json.load(f)


@pytest.mark.subprocess
def test_builder_with_more_shards_than_examples_writes_every_shard(tmp_path):
    out = str(tmp_path / "b")
    done, manifest = _build(NEWS, out, 1000)
    shards = manifest["shards"]
    names = [f"pretrain_data.tfrecord-{i:05d}-of-01000" for i in range(1000)]
    assert [s["name"] for s in shards] == names
    assert sorted(n for n in os.listdir(out) if n.startswith("pretrain_data")) == names
    n, empty = manifest["examples"], sum(1 for s in shards if s["examples"] == 0)
    assert (n, empty) == (756, 244) and sum(s["examples"] for s in shards) == n
    # The empty shards are the files with no bytes.
    assert all((os.path.getsize(os.path.join(out, s["name"])) == 0) == (s["examples"] == 0)
               for s in shards)
    assert ("] 244 of the 1000 shards (--num_shards) hold no example (the build has 756 "
            "examples): written as empty files, listed with 0 examples in manifest.json; "
            "--num_shards=756 or fewer gives no empty shard\n") in done.stderr
    assert done.stdout == (f"756 examples, 73180 of 73180 corpus tokens kept (retention "
                           f"100.00%), 1000 shards (244 empty) in {out}\n")


MIXED = (b"The first line is text.\nA second line of text here.\n\x00\x00\x00 nul bytes "
         b"line\n\xff\xfe bad utf8 line\nback to good text again.\n\nanother document "
         b"starts.\n")


@pytest.mark.parametrize("kind", ["text_and_bytes", "executable"])
@pytest.mark.subprocess
def test_builder_on_binary_input_says_how_many_lines_it_skipped_and_why(tmp_path, kind):
    path = str(tmp_path / "corpus.txt")
    if kind == "executable":
        shutil.copy("/bin/ls", path)
    else:
        with open(path, "wb") as f:
            f.write(MIXED)
    out = str(tmp_path / "b")
    done, manifest = _build(path, out, 2)
    counted = manifest["skipped_lines"]
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    if kind == "text_and_bytes":
        assert counted == {"invalid_utf8": 1, "nul_bytes": 1} and manifest["lines"] == 7
        assert manifest["skipped_line_examples"] == [f"{path}:3: nul_bytes",
                                                     f"{path}:4: invalid_utf8"]
        assert lines == [
            f"2 examples, 23 of 23 corpus tokens kept (retention 100.00%), 2 shards in {out}",
            f"2 of 7 input lines skipped (1 with invalid UTF-8, 1 with NUL bytes); file:line "
            f"examples in {out}/manifest.json"]
    else:  # the counts depend on this machine's /bin/ls: they must agree with the manifest
        match = re.fullmatch(r"(\d+) of (\d+) input lines skipped \((.*)\); file:line "
                             rf"examples in {re.escape(out)}/manifest\.json", lines[1])
        assert match, lines[1]
        key = {"with NUL bytes": "nul_bytes", "with invalid UTF-8": "invalid_utf8"}
        reasons = [why.split(" ", 1) for why in match.group(3).split(", ")]
        assert {key[why]: int(n) for n, why in reasons} == counted
        assert int(match.group(1)) == sum(counted.values()) > 0
        assert int(match.group(2)) == manifest["lines"]


# --------------------------------------------------------- 5. user TSV rows and labels


@pytest.mark.subprocess
def test_a_user_tsv_row_with_three_columns_names_file_and_line(tmp_path, base):
    rows = _rows(8)
    rows.insert(2, "a stray\ttab\tpos")  # line 4, after the header and two rows
    data_dir = _write_task(str(tmp_path / "tsv"), rows, _rows(8))
    model_dir = str(tmp_path / "ft")
    done = _run(FINETUNE, *_finetune_flags(data_dir, base["dir"], model_dir))
    last = _last_line(done, 1, "run_finetuning: error: ")
    assert last == (f"run_finetuning: error: {data_dir}/mine/train.tsv:4: expected 2 "
                    "tab-separated columns as the header (line 1) has, found 3")
    assert _no_checkpoint_under(model_dir)


@pytest.mark.subprocess
def test_a_dev_label_unseen_in_training_names_file_line_and_label(tmp_path, base):
    data_dir = _write_task(str(tmp_path / "tsv"), _rows(8), _rows(8) + ["what a film\tmaybe"])
    model_dir = str(tmp_path / "ft")
    done = _run(FINETUNE, *_finetune_flags(data_dir, base["dir"], model_dir))
    last = _last_line(done, 1, "run_finetuning: error: ")
    assert last == (f"run_finetuning: error: {data_dir}/mine/dev.tsv:10: label 'maybe' does "
                    f"not occur in {data_dir}/mine/train.tsv, whose labels are neg, pos; fix "
                    "the row, or list every label with --labels")
    assert _no_checkpoint_under(model_dir)


# -------------------------------------------- 6. a manifest that under-counts an open shard


@pytest.mark.subprocess
@pytest.mark.e2e
def test_a_manifest_that_undercounts_an_open_shard_stops_the_resume(tmp_path, base, data):
    """The base run's data with shard 1's count in manifest.json lowered by 6: the resume
    at ckpt-6 (24 records in, every one of the 4 shards open with cycle_length 8) reads
    the open shards through and stops naming the wrong count; nothing is trained."""
    edited = shutil.copytree(data, str(tmp_path / "data"))
    path = os.path.join(edited, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    shard = manifest["shards"][1]
    held = shard["examples"]
    shard["examples"] = held - 6
    with open(path, "w") as f:
        json.dump(manifest, f, indent=2)
    d = _copy_run(base, tmp_path)

    done = _pretrain(d, edited, 8)
    last = _last_line(done, 1, "run_pretraining: error: ")
    assert last == (
        f"run_pretraining: error: {edited}/{shard['name']}: holds {held} records but "
        f"manifest.json says {held - 6}; the resume position is computed from manifest.json's "
        "counts, so this run would continue on other data than it would have uninterrupted: "
        "rebuild the data, or start a new --model_dir")
    assert f"Resumed from {d}/ckpt-6 (step 6)" in done.stderr
    assert _steps(done.stderr) == []
    assert _checkpoint_files(d) == base["sha"]


# --------------------------------------------------------- 7 and 8. one-line errors


@pytest.fixture
def afile(tmp_path):
    """A file where a directory is expected: it must come through untouched."""
    path = tmp_path / "afile"
    path.write_text("not a directory\n")
    return str(path)


# (flags, expected message after "run_pretraining: error: "). Each command is a rerun of a
# copy of the finished base run, whose checkpoints must survive; a --model_dir among the
# flags comes later on the command line and wins. {afile}: a file, to survive as well.
PRETRAIN_ERRORS = [
    pytest.param(["--model_dir={afile}"],
                 "--model_dir={afile}: cannot write there: it is a file, not a directory",
                 id="model_dir_is_a_file"),
    pytest.param(["--model_dir={afile}/run"],
                 "--model_dir={afile}/run: cannot write there: {afile} is not a directory",
                 id="model_dir_under_a_file"),
    pytest.param(["--params_override=hidden_size=-64"],
                 "model.hidden_size=-64 must be at least 1", id="negative_hidden_size"),
    pytest.param(["--params_override=model.num_hidden_layers=-1"],
                 "model.num_hidden_layers=-1 must be at least 1", id="negative_layers"),
    pytest.param(["--max_seq_length=0"],
                 "--max_seq_length=0 must be at least 5 ([CLS] A [SEP] B [SEP])",
                 id="max_seq_length_0"),
    # before the fixes too
    pytest.param(["--params_override=hidden_sise=64"],
                 "unknown config key 'hidden_sise'; valid keys: model.vocab_size, ",
                 id="unknown_config_key"),
    pytest.param(["--train_data=/no/such/data*"], "no TFRecord files match '/no/such/data*'",
                 id="train_data_matches_nothing"),
    pytest.param(["--max_seq_length=1024"],
                 "--max_seq_length=1024 exceeds the model's max_position_embeddings=128 (the "
                 "longest input it has position embeddings for)",
                 id="max_seq_length_above_positions"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flags, message", PRETRAIN_ERRORS)
@pytest.mark.subprocess
def test_pretraining_bad_flags_are_one_line_errors(tmp_path, base, data, afile, flags,
                                                   message, backend):
    d = _copy_run(base, tmp_path)
    extra, env = _backend_args(backend)
    done = _pretrain(d, data, 8, *(f.format(afile=afile) for f in flags), *extra, env=env)
    last = _last_line(done, 1, "run_pretraining: error: ")
    expected = "run_pretraining: error: " + message.format(afile=afile)
    if message.endswith(", "):  # the unknown key's message goes on to list every key
        assert last.startswith(expected), last
    else:
        assert last == expected
    # The max_seq_length check must not send the user to rebuild the data at length 0.
    assert "rebuild" not in last
    assert _steps(done.stderr) == []
    assert _checkpoint_files(d) == base["sha"]
    with open(afile) as f:
        assert f.read() == "not a directory\n"


FINETUNE_ERRORS = [
    pytest.param({"model_dir": "{afile}"},
                 "--model_dir={afile}: cannot write there: it is a file, not a directory",
                 id="model_dir_is_a_file"),
    pytest.param({"model_dir": "{afile}/ft"},
                 "--model_dir={afile}/ft: cannot write there: {afile} is not a directory",
                 id="model_dir_under_a_file"),
    pytest.param({"export_dir": "{afile}/export"},
                 "--export_dir={afile}/export: cannot write there: {afile} is not a directory",
                 id="export_dir_under_a_file"),
    pytest.param({"max_seq_length": "256"},
                 "--max_seq_length=256 exceeds the model's max_position_embeddings=128 (the "
                 "longest input it has position embeddings for)", id="max_seq_length_256"),
    pytest.param({"config": "small"},
                 r"--init_checkpoint {run} does not fit the model config: electra/\S+ is "
                 r"\[[\d, ]+\] in the checkpoint but \[[\d, ]+\] in the model "
                 r"\(hidden_size=256, embedding_size=128, num_hidden_layers=12\); "
                 r"--config=small is not the size the checkpoint was pre-trained with: drop "
                 r"--config \(the run's config.json beside the checkpoint gives the size\) or "
                 r"give the config it was trained with", id="small_config_tiny_checkpoint"),
    pytest.param({"init_checkpoint": "{tmp}/nonexistent"},
                 "--init_checkpoint={tmp}/nonexistent does not exist (neither a directory nor "
                 "a checkpoint prefix with {tmp}/nonexistent.index)",
                 id="nonexistent_init_checkpoint"),
    pytest.param({"init_checkpoint": "{torn}/ckpt-6"},
                 "--init_checkpoint={torn}/ckpt-6: the checkpoint is damaged "
                 "(ckpt-6.data-00000-of-00001 has 1000 of its {bytes} bytes)",
                 id="damaged_checkpoint_prefix"),
    # before the fixes too
    pytest.param({"task": "nosuch", "text_columns": "", "label_column": None},
                 "--task=nosuch is not a known task (cola, mnli, mrpc, qnli, qqp, rte, sst2, "
                 "stsb, polarity, squad_v1, squad_v2, chunk, ner); a TSV task of your own "
                 "needs --text_columns and --label_column", id="unknown_task"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change, message", FINETUNE_ERRORS)
@pytest.mark.subprocess
def test_finetuning_bad_flags_are_one_line_errors(tmp_path, base, truncated_run, tsv, afile,
                                                  change, message, backend):
    as_regex = "config" in change  # the first mismatching variable is not pinned down
    quote = re.escape if as_regex else str
    fill = lambda s: s.format(afile=quote(afile), run=quote(base["dir"]),
                              tmp=quote(str(tmp_path)), torn=quote(truncated_run),
                              bytes=base["data_bytes"])
    model_dir = str(tmp_path / "ft")
    values = {"task": "mine", "data_dir": tsv, "text_columns": "sentence",
              "label_column": "label", "init_checkpoint": base["dir"], "model_dir": model_dir,
              "max_seq_length": "16", "train_batch_size": "8", "eval_batch_size": "8",
              "num_train_epochs": "1"}
    values.update({k: v if v is None else v.format(afile=afile, tmp=tmp_path,
                                                    torn=truncated_run)
                   for k, v in change.items()})
    args = [f"--{k}={v}" for k, v in values.items() if v is not None]
    torn_before = _checkpoint_files(truncated_run)

    extra, env = _backend_args(backend)
    done = _run(FINETUNE, *args, *extra, env=env)
    last = _last_line(done, 1, "run_finetuning: error: ")
    expected = "run_finetuning: error: " + fill(message)
    if as_regex:
        assert re.fullmatch(expected, last), last
    else:
        assert last == expected
    if change.get("init_checkpoint", "").endswith("nonexistent"):
        assert "config.json" not in last
    # Refused before training: no trial checkpoint anywhere.
    assert _no_checkpoint_under(values["model_dir"]) and _no_checkpoint_under(model_dir)
    assert _checkpoint_files(base["dir"]) == base["sha"]
    assert _checkpoint_files(truncated_run) == torn_before
    with open(afile) as f:
        assert f.read() == "not a directory\n"


@pytest.mark.subprocess
def test_export_hf_into_a_file_is_one_line(tmp_path, base, afile):
    done = _run(CONVERT, "export-hf", base["dir"], afile)
    last = _last_line(done, 1, "error: ")
    assert last == f"error: OUT_DIR {afile}: cannot write there (it is a file, not a directory)"
    with open(afile) as f:
        assert f.read() == "not a directory\n"
    assert _checkpoint_files(base["dir"]) == base["sha"]


@pytest.mark.subprocess
def test_export_hf_from_a_damaged_prefix_is_one_line(tmp_path, base, truncated_run):
    out = str(tmp_path / "hf")
    done = _run(CONVERT, "export-hf", f"{truncated_run}/ckpt-6", out)
    last = _last_line(done, 1, "error: ")
    assert last == (f"error: {truncated_run}/ckpt-6: the checkpoint is damaged "
                    f"(ckpt-6.data-00000-of-00001 has {TRUNCATED} of its {base['data_bytes']} "
                    "bytes)")
    assert not os.path.exists(os.path.join(out, "discriminator"))


@pytest.mark.subprocess
def test_builder_with_a_missing_vocab_file_is_one_line(tmp_path):
    out, vocab = str(tmp_path / "b"), str(tmp_path / "no_vocab.txt")
    done = _run(BUILDER, f"--input={NEWS}", f"--vocab_file={vocab}", f"--output_dir={out}",
                "--num_workers=1")
    last = _last_line(done, 1, "tfrecord_builder: error: ")
    assert last == (f"tfrecord_builder: error: --vocab_file: cannot read {vocab}: No such "
                    "file or directory")
    assert not os.path.exists(os.path.join(out, "manifest.json"))


@pytest.mark.subprocess
def test_score_refuses_a_run_that_is_not_electric_in_one_line(tmp_path, base):
    text = tmp_path / "texts.txt"
    text.write_text("a sentence to score .\n")
    done = _run(SCORE, f"--model_dir={base['dir']}", f"--input={text}")
    last = _last_line(done, 1, "error: ")
    assert last == f"error: {base['dir']}/config.json: objective electra, not electric"
    assert done.stdout == ""
    assert _checkpoint_files(base["dir"]) == base["sha"]
