"""The JAX path on a machine without TensorFlow: what CI's JAX leg runs in the README's
`.[jax]` install (no TensorFlow there at all), and leg 1 runs with TensorFlow made
unimportable in every process (a sitecustomize that blocks it, inherited by the builder's
and the CLIs' child processes). This file imports no TensorFlow (tests/conftest.py: a leg
without TensorFlow collects only files of JAX-leg tests)."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import NO_TENSORFLOW, REPO, TENSORFLOW_INSTALLED, VOCAB, WIKI, sigterm_after

jax_installed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("jax") is None, reason="jax is not installed")
JAX_ENV = {"JAX_PLATFORMS": "cpu"}
STEP_LINE = re.compile(r"\] step (\d+)/(\d+) \| loss (\d+\.\d+)")

@pytest.fixture(scope="module")
def no_tf_env(tmp_path_factory):
    """The environment of a process without TensorFlow: JAX on the CPU, and where
    TensorFlow is installed (leg 1) the blocker on PYTHONPATH. No KERAS_BACKEND: without
    TensorFlow, Keras runs on JAX by default (`backend.set_default`), for the commands
    that take no --backend (convert, check_install's import)."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(JAX_ENV)
    if TENSORFLOW_INSTALLED:
        site = tmp_path_factory.mktemp("no_tensorflow")
        (site / "sitecustomize.py").write_text(NO_TENSORFLOW)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), REPO,
                                                          env.get("PYTHONPATH")]))
    return env


def _run(args, env, timeout=600):
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, (args, done.stderr[-4000:])
    return done


def test_the_blocker_blocks(no_tf_env):
    done = _run(["-c", "import importlib, sys\n"
                 "try:\n    import tensorflow\nexcept ImportError:\n    print('blocked')\n"],
                no_tf_env)
    assert done.stdout.strip() == "blocked"


JAX_ONLY = r"""
import sys
import numpy as np
import electra_tf
from electra_tf import kernels
from electra_tf.configs import load_config
from electra_tf.model.modeling import ElectraPretrainingModel, tf1_variables
from electra_tf.pretraining import losses, objectives  # the objective functions import too
from electra_tf.finetune.model import FinetuningModel, make_head
assert kernels.BACKEND == "jax"
cfg = load_config("tiny")
model = ElectraPretrainingModel(cfg.model)
ids = np.full((2, 16), 1000, np.int32)
ids[:, 0], ids[:, -1] = 101, 102
batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": 0 * ids}
logits = model.discriminator(batch["input_ids"], batch["input_mask"], batch["segment_ids"])
classifier = FinetuningModel(cfg.model, make_head("classification", cfg.model, 2))
from electra_tf import rng
# Folds and dropout are integer hashing in keras.ops: TensorFlow's numbers (test_rng.py).
fold = np.asarray(rng.fold([1, 2], 1)).tolist()
drop = np.asarray(rng.dropout_uniform([2, 3], [1, 2]))
assert fold == [1909209740, 290893547, 0], fold
assert drop.tolist() == np.float32([[0.5528677, 0.54613405, 0.42981207],
                                    [0.96852523, 0.4798724, 0.2893684]]).tolist(), drop
print(type(logits).__module__, tuple(logits.shape), len(tf1_variables(model)),
      tuple(classifier(batch)["logits"].shape), objectives.build_objective(cfg).name,
      sys.modules.get("tensorflow") is not None)
"""


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
@pytest.mark.every_leg
def test_model_runs_on_jax_without_tensorflow(no_tf_env):
    out = _run(["-c", JAX_ONLY], no_tf_env).stdout.split()
    assert out[0].startswith("jax") and out[1:3] == ["(2,", "16)"]
    assert out[3] == "80"  # the tiny preset's variables under their TF1 names
    assert out[4:6] == ["(2,", "2)"] and out[6:] == ["electra", "False"]


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
@pytest.mark.every_leg
def test_check_install_runs_a_compiled_step_on_jaxs_devices(no_tf_env):
    done = _run(["-m", "electra_tf.check_install", "--backend=jax"], no_tf_env)
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "OK"
    assert lines[-3].startswith("JAX ") and "1 CPU device(s)" in lines[-3], lines
    assert lines[-2].startswith("one compiled train step of a 1-layer ELECTRA, batch 2 split "
                                "over 1 device(s): loss ") and "applied (global step 1)" in \
        lines[-2], lines


def _steps(stderr):
    return [(int(m.group(1)), float(m.group(3))) for m in STEP_LINE.finditer(stderr)]


@jax_installed
@pytest.mark.subprocess
@pytest.mark.e2e
@pytest.mark.jax
@pytest.mark.every_leg
def test_the_jax_main_job_without_tensorflow(tmp_path, no_tf_env):
    """Without TensorFlow, end to end: the builder makes TFRecords of a slice of the
    bundled corpus; JAX pre-trains on them (checkpoints, TensorBoard events, the
    discriminator export); a run stopped by SIGTERM saves and exits 75, and its rerun
    resumes; fine-tuning on JAX starts from the run; `convert export-hf` writes a Hugging
    Face model from it."""
    corpus = tmp_path / "corpus.txt"
    with open(WIKI, encoding="utf-8") as f:
        corpus.write_text("".join(line for _, line in zip(range(400), f)), encoding="utf-8")
    build = tmp_path / "build"
    _run(["-m", "tfrecord_builder", f"--input={corpus}", f"--output_dir={build}",
          f"--vocab_file={VOCAB}", "--max_seq_length=64", "--num_shards=4",
          "--num_workers=1"], no_tf_env)
    manifest = json.loads((build / "manifest.json").read_text())
    assert manifest["examples"] > 40 and len(manifest["shards"]) == 4

    run = tmp_path / "run"
    args = ["run_pretraining.py", "--backend=jax", f"--train_data={build}",
            f"--model_dir={run}", "--train_batch_size=8", "--max_seq_length=64",
            "--save_checkpoints_steps=3", "--steps_per_loop=1", "--peak_flops=1e11",
            "--params_override=log_every_steps=1,warmup_steps=2"]
    first = _run([*args, "--num_train_steps=6"], no_tf_env)
    steps = _steps(first.stderr)
    assert [s for s, _ in steps] == [1, 2, 3, 4, 5, 6], first.stderr[-3000:]
    assert all(loss > 0 for _, loss in steps)
    assert (run / "checkpoint").exists() and glob.glob(str(run / "ckpt-6.index"))
    assert glob.glob(str(run / "train" / "events.out.tfevents.*"))
    assert (run / "discriminator" / "model.ckpt.index").exists()
    # A preemption notice (SIGTERM) mid-run: a checkpoint, exit 75; the rerun goes on.
    proc = subprocess.Popen([sys.executable, *args, "--num_train_steps=40"], cwd=REPO,
                            env=no_tf_env, stderr=subprocess.PIPE, text=True)
    before, rest = sigterm_after(proc, lambda line: STEP_LINE.search(line) and
                                 int(STEP_LINE.search(line).group(1)) >= 8, timeout=300)
    assert proc.returncode == 75, (before + rest)[-3000:]
    saved = max(int(p.split("ckpt-")[1].split(".")[0])
                for p in glob.glob(str(run / "ckpt-*.index")))
    assert saved >= 8 and not (run / "lease.json").exists(), rest[-2000:]
    resumed = _run([*args, f"--num_train_steps={saved + 2}"], no_tf_env)
    assert [s for s, _ in _steps(resumed.stderr)] == [saved + 1, saved + 2], \
        resumed.stderr[-3000:]

    data = tmp_path / "tsv" / "mine"
    data.mkdir(parents=True)
    for split, n in (("train", 24), ("dev", 8)):
        rows = [(f"a good film {i}", "pos") if i % 2 else (f"a bad film {i}", "neg")
                for i in range(n)]
        (data / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
    _run(["run_finetuning.py", "--backend=jax", "--task=mine", f"--data_dir={data.parent}",
          "--text_columns=sentence", "--label_column=label", f"--init_checkpoint={run}",
          f"--model_dir={tmp_path / 'ft'}", "--max_seq_length=16", "--train_batch_size=8",
          "--eval_batch_size=8", "--num_train_epochs=1", "--num_trials=1"], no_tf_env)
    results = json.loads((tmp_path / "ft" / "results.json").read_text())
    assert results["labels"] == ["neg", "pos"] and 0 <= results["trials"][0]["accuracy"] <= 1

    hf = tmp_path / "hf"
    _run(["-m", "electra_tf.conversion.convert", "export-hf", str(run), str(hf)], no_tf_env)
    for part in ("discriminator", "generator"):
        config = json.loads((hf / part / "config.json").read_text())
        assert config["model_type"] == "electra" and (hf / part / "model.safetensors").exists()
