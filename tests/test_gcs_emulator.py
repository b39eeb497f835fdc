"""TensorFlow's built-in gs:// filesystem against a local Cloud Storage emulator.

See tests/gcs_emulator.py for how the hard-coded Google endpoints are reached on
127.0.0.1. TensorFlow runs in another process because it reads its GCS settings at import: the
commands fork from a server started with the emulator's settings (tests/forked_cli.py).
Skipped when gcp-storage-emulator (or cryptography) is not installed.
"""

import json
import os
import subprocess

import pytest

import forked_cli

from gcs_emulator import gcs_emulator  # noqa: F401  (pytest fixture)

BUCKET = "electra-test"

WORKLOAD = r'''
import json, sys
import numpy as np
import tensorflow as tf

root = sys.argv[1]
g = tf.io.gfile
out = {}

# Buckets, directories, small files.
out["bucket_exists"] = g.exists("gs://%s" % root.split("/")[2])
out["missing_exists"] = g.exists(root + "/no/such/file")
g.makedirs(root + "/files")
with g.GFile(root + "/files/a.txt", "w") as f:
    f.write("alpha\n")
with g.GFile(root + "/files/b.txt", "w") as f:
    f.write("beta\n" * 1000)
out["read_a"] = g.GFile(root + "/files/a.txt").read()
out["size_b"] = g.stat(root + "/files/b.txt").length
out["isdir"] = g.isdir(root + "/files")
out["listdir"] = sorted(g.listdir(root + "/files"))
out["glob"] = sorted(g.glob(root + "/files/*.txt"))
g.rename(root + "/files/a.txt", root + "/files/c.txt")
g.copy(root + "/files/b.txt", root + "/files/d.txt")
g.remove(root + "/files/b.txt")
out["after_rename"] = sorted(g.glob(root + "/files/*"))
out["read_c"] = g.GFile(root + "/files/c.txt").read()
out["read_d_len"] = len(g.GFile(root + "/files/d.txt", "rb").read())
try:
    g.GFile(root + "/files/missing.txt").read()
    out["missing_read"] = "no error"
except tf.errors.NotFoundError:
    out["missing_read"] = "NotFoundError"

# TFRecord shards (about 2 MB in all) read back with tf.data.
rng = np.random.default_rng(0)
rows = [rng.integers(0, 30000, size=128) for _ in range(2000)]
for shard in range(2):
    with tf.io.TFRecordWriter(root + "/data/part-%05d.tfrecord" % shard) as w:
        for ids in rows[shard::2]:
            ex = tf.train.Example(features=tf.train.Features(feature={
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids))}))
            w.write(ex.SerializeToString())
files = tf.data.Dataset.list_files(root + "/data/part-*.tfrecord", shuffle=False)
ds = tf.data.TFRecordDataset(files).map(lambda s: tf.io.parse_single_example(
    s, {"input_ids": tf.io.FixedLenFeature([128], tf.int64)})["input_ids"])
back = [x for x in ds.as_numpy_iterator()]
want = rows[0::2] + rows[1::2]
out["tfrecord_count"] = len(back)
out["tfrecord_equal"] = bool(len(back) == len(want) and
                             all(np.array_equal(a, b) for a, b in zip(back, want)))

# tf.train.Checkpoint save / restore (writes temp files, then renames them).
v = tf.Variable(tf.random.stateless_normal([512, 600], seed=[1, 2]))
step = tf.Variable(7, dtype=tf.int64)
ckpt = tf.train.Checkpoint(v=v, step=step)
manager = tf.train.CheckpointManager(ckpt, root + "/ckpt", max_to_keep=2)
saved = manager.save()
expected = v.numpy().copy()
v.assign(tf.zeros_like(v))
step.assign(0)
status = ckpt.restore(tf.train.latest_checkpoint(root + "/ckpt"))
status.assert_consumed()
out["ckpt_path"] = saved
out["ckpt_latest"] = tf.train.latest_checkpoint(root + "/ckpt")
out["ckpt_restored"] = bool(np.array_equal(v.numpy(), expected) and int(step) == 7)

# tf.summary event files.
writer = tf.summary.create_file_writer(root + "/logs")
with writer.as_default():
    for i in range(3):
        tf.summary.scalar("loss", 1.0 / (i + 1), step=i)
writer.flush()
writer.close()
events = g.glob(root + "/logs/events.out.tfevents.*")
scalars = []
for e in tf.compat.v1.train.summary_iterator(events[0]):
    for val in e.summary.value:
        scalars.append((e.step, float(tf.make_ndarray(val.tensor))))
out["summary_scalars"] = scalars

# Recursive delete.
g.rmtree(root + "/files")
out["after_rmtree"] = g.exists(root + "/files/c.txt")
print("RESULT " + json.dumps(out))
'''


def _tf_env(emulator):
    """The commands' environment (one command server for all of them)."""
    env = emulator.tf_env()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.subprocess
def test_tf_gcs_filesystem_on_emulator(gcs_emulator, tmp_path):  # noqa: F811
    root = f"gs://{BUCKET}/run"
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    proc = forked_cli.run([str(script), root], env=_tf_env(gcs_emulator), cwd=tmp_path,
                          timeout=420)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n"
        f"{proc.stderr[-6000:]}\nemulator:\n{gcs_emulator.stderr_tail()}")
    out = json.loads(lines[-1][len("RESULT "):])

    assert out["bucket_exists"] is True
    assert out["missing_exists"] is False
    assert out["read_a"] == "alpha\n"
    assert out["size_b"] == 5000
    assert out["isdir"] is True
    assert out["listdir"] == ["a.txt", "b.txt"]
    assert out["glob"] == [f"{root}/files/a.txt", f"{root}/files/b.txt"]
    assert out["after_rename"] == [f"{root}/files/c.txt", f"{root}/files/d.txt"]
    assert out["read_c"] == "alpha\n"
    assert out["read_d_len"] == 5000
    assert out["missing_read"] == "NotFoundError"
    assert out["tfrecord_count"] == 2000 and out["tfrecord_equal"] is True
    assert out["ckpt_path"] == f"{root}/ckpt/ckpt-1"
    assert out["ckpt_latest"] == out["ckpt_path"]
    assert out["ckpt_restored"] is True
    assert [s for s, _ in out["summary_scalars"]] == [0, 1, 2]
    assert [round(x, 4) for _, x in out["summary_scalars"]] == [1.0, 0.5, 0.3333]
    assert out["after_rmtree"] is False

    # The objects really are in the emulator, not on a local disk.
    names = gcs_emulator.list_objects(BUCKET, "run/")
    assert "run/data/part-00000.tfrecord" in names
    assert "run/ckpt/checkpoint" in names
    assert any(n.startswith("run/ckpt/ckpt-1.data-") for n in names)
    assert not any(n.startswith("run/files/") and not n.endswith("/") for n in names)
    assert not os.path.exists(os.path.join(str(tmp_path), "gs:"))


def test_proxy_refuses_other_hosts(gcs_emulator):  # noqa: F811
    """The tunnel only serves the two emulated Google hosts."""
    import socket
    with socket.create_connection(("127.0.0.1", gcs_emulator.proxy_port), timeout=10) as s:
        s.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        reply = s.recv(1024)
    assert reply.startswith(b"HTTP/1.1 403")


# ----------------------------------------------------------------------------- issue 15
# The README's Cloud TPU quickstart, command line for command line, against the emulator:
# build -> pre-train -> resume -> fine-tune with export -> convert, every path gs://.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_BYTES = 200_000
CLI_TIMEOUT = 600  # seconds per command (each pays ~10-20 s of TensorFlow import)

VERIFY = r'''
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the export's ops; README: a client imports it)

root, must_exist = sys.argv[1], json.loads(sys.argv[2])
g = tf.io.gfile
out = {"missing": [p for p in must_exist if not g.exists(root + "/" + p)]}
results = json.loads(g.GFile(root + "/finetune/polarity/results.json").read())
out["results"] = {k: results.get(k) for k in ("metric", "scores", "num_train_steps",
                                               "init_checkpoint", "export")}
out["task_exports"] = sorted(g.glob(root + "/exports/polarity/*/saved_model.pb"))
out["latest_pretrain"] = tf.train.latest_checkpoint(root + "/models/tiny")
reader = tf.train.load_checkpoint(out["latest_pretrain"])
out["global_step"] = [int(reader.get_tensor(n)) for n in reader.get_variable_to_shape_map()
                      if n.startswith("global_step")]
out["pretrain_config"] = json.loads(g.GFile(root + "/models/tiny/config.json").read())
out["hf_config"] = json.loads(g.GFile(root + "/hf/discriminator/config.json").read())
served = tf.saved_model.load(results["export"]["task"]).signatures["serving_default"]
answer = served(sentence=tf.constant(["a gripping , beautifully acted film ."]))
out["probabilities"] = answer["probabilities"].numpy().tolist()
print("RESULT " + json.dumps(out))
'''


def _corpus_head() -> bytes:
    """Whole documents (a blank line ends one) from the start of the Wikipedia sample,
    about CORPUS_BYTES of them."""
    with open(os.path.join(REPO, "data", "corpus", "enwiki_sample.txt"), "rb") as f:
        data = f.read()
    end = data.find(b"\n\n", CORPUS_BYTES)
    return data[:end + 2] if end >= 0 else data


@pytest.mark.subprocess
@pytest.mark.e2e
def test_cli_flow_on_gs(gcs_emulator, tmp_path):  # noqa: F811
    """Issue 15, "run the same flow against it as well": the project's own command lines
    (README, Cloud TPU quickstart, with --strategy=cpu for --tpu=local and tiny sizes), each
    a subprocess, every path under gs://electra-test/<unique>/: tfrecord_builder from a
    gzipped corpus in the bucket, run_pretraining.py 4 steps then rerun to 6 (must resume
    at step 4), run_finetuning.py from the bucket's checkpoint with --export_dir on the
    bucket, `python -m electra_tf.conversion.convert export-hf` and `export-tf1`; then a TF process
    checks what landed in the bucket and serves the exported SavedModel from gs://, and no
    local directory `gs:` may appear in the commands' working directory."""
    import gzip
    import time
    import uuid

    prefix = f"cli-{uuid.uuid4().hex[:12]}"
    root = f"gs://{BUCKET}/{prefix}"
    env = _tf_env(gcs_emulator)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    timings = {}

    def run(name, args):
        start = time.monotonic()
        try:
            proc = forked_cli.run(args, env=env, cwd=cwd, timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            tail = lambda s: (s.decode("utf-8", "replace") if isinstance(s, bytes)
                              else s or "")[-6000:]
            raise AssertionError(
                f"{name} ran past {CLI_TIMEOUT} s: {' '.join(args)}\nstdout:\n"
                f"{tail(e.stdout)}\nstderr:\n{tail(e.stderr)}\nemulator:\n"
                f"{gcs_emulator.stderr_tail()}") from None
        timings[name] = round(time.monotonic() - start, 1)
        (tmp_path / f"{name.replace(' ', '_')}.log").write_text(
            f"$ {' '.join(args)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        assert proc.returncode == 0, (
            f"{name} failed (rc={proc.returncode}): {' '.join(args)}\nstdout:\n"
            f"{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-8000:]}\nemulator:\n"
            f"{gcs_emulator.stderr_tail()}")
        return proc

    try:
        # -- 1. the inputs, uploaded through the emulator's JSON API (no TF import).
        gcs_emulator.upload(BUCKET, f"{prefix}/corpus/enwiki_head.txt.gz",
                            gzip.compress(_corpus_head(), mtime=0))
        with open(os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt"), "rb") as f:
            gcs_emulator.upload(BUCKET, f"{prefix}/vocab.txt", f.read())
        for split in ("train", "dev"):
            with open(os.path.join(REPO, "data", "polarity", f"{split}.tsv"), "rb") as f:
                gcs_emulator.upload(BUCKET, f"{prefix}/glue_data/polarity/{split}.tsv",
                                    f.read())

        # -- 2. README step 3: build the pre-training data into the bucket.
        built = run("tfrecord_builder", [
            "-m", "tfrecord_builder", f"--input={root}/corpus/*.txt.gz",
            f"--output_dir={root}/pretrain_data", f"--vocab_file={root}/vocab.txt",
            "--do_lower_case", "--max_seq_length=128", "--num_shards=2",
            "--num_workers=1"])
        assert f"2 shards in {root}/pretrain_data" in built.stdout, built.stdout

        # -- 3. README step 4: pre-train 4 steps, then the same command to 6 resumes.
        pretrain = [os.path.join(REPO, "run_pretraining.py"), "--config=tiny",
                    "--strategy=cpu", f"--train_data={root}/pretrain_data",
                    f"--model_dir={root}/models/tiny", "--steps_per_loop=2",
                    "--save_checkpoints_steps=2", "--train_batch_size=8",
                    # no XLA (compiles in half the time), a given peak (no timed matmul)
                    "--jit_compile=false", "--peak_flops=1e12"]
        first = run("pretrain to 4", pretrain + ["--num_train_steps=4"])
        assert "Resumed from" not in first.stderr, first.stderr[-3000:]
        second = run("resume to 6", pretrain + ["--num_train_steps=6"])
        resumed = [ln.split("] ", 1)[-1] for ln in second.stderr.splitlines()
                   if "Resumed from" in ln]
        assert resumed == [f"Resumed from {root}/models/tiny/ckpt-4 (step 4)"], \
            second.stderr[-3000:]

        # -- 4. README step 5: fine-tune from the bucket's checkpoint, export to the bucket.
        tuned = run("finetune", [
            os.path.join(REPO, "run_finetuning.py"), "--task=polarity",
            f"--data_dir={root}/glue_data", "--strategy=cpu",
            f"--init_checkpoint={root}/models/tiny",
            f"--model_dir={root}/finetune/polarity", "--num_trials=1",
            f"--export_dir={root}/exports", f"--vocab_file={root}/vocab.txt",
            "--num_train_epochs=0.2", "--train_batch_size=16", "--eval_batch_size=40",
            "--max_seq_length=32", "--jit_compile=false"])
        assert f"results in {root}/finetune/polarity/results.json" in tuned.stdout, \
            tuned.stdout

        # -- 5. README: the pre-trained model converts too.
        run("convert export-hf", ["-m", "electra_tf.conversion.convert", "export-hf",
                                  f"{root}/models/tiny", f"{root}/hf"])
        run("convert export-tf1", ["-m", "electra_tf.conversion.convert", "export-tf1",
                                   f"{root}/models/tiny", f"{root}/tf1/model.ckpt"])

        # -- 6. what is in the bucket, read back by TensorFlow, and the export served.
        must_exist = [
            "pretrain_data/manifest.json", "pretrain_data/token_counts.txt",
            "models/tiny/config.json", "models/tiny/checkpoint", "models/tiny/ckpt-4.index",
            "models/tiny/ckpt-6.index", "models/tiny/discriminator/model.ckpt.index",
            "finetune/polarity/results.json",
            "hf/discriminator/model.safetensors", "hf/discriminator/config.json",
            "hf/generator/model.safetensors", "hf/generator/config.json",
            "tf1/model.ckpt.index", "tf1/checkpoint"]
        script = tmp_path / "verify.py"
        script.write_text(VERIFY)
        checked = run("verify", [str(script), root, json.dumps(must_exist)])
        lines = [ln for ln in checked.stdout.splitlines() if ln.startswith("RESULT ")]
        assert lines, checked.stdout[-3000:]
        out = json.loads(lines[-1][len("RESULT "):])
    finally:
        print("timings (s):", timings, "total", round(sum(timings.values()), 1))

    assert out["missing"] == []
    assert out["latest_pretrain"] == f"{root}/models/tiny/ckpt-6"
    assert out["global_step"] == [6]
    assert out["pretrain_config"]["model"]["hidden_size"] == 128
    assert out["pretrain_config"]["train"]["num_train_steps"] == 6
    assert out["hf_config"]["hidden_size"] == 128
    results = out["results"]
    assert results["metric"] == "accuracy" and len(results["scores"]) == 1
    assert results["num_train_steps"] == 2  # ceil(160 rows * 0.2 epochs / 16)
    assert results["init_checkpoint"] == f"{root}/models/tiny"
    task_export = results["export"]["task"]
    assert task_export.startswith(f"{root}/exports/polarity/"), task_export
    assert results["export"]["encoder"].startswith(f"{root}/exports/encoder/")
    assert out["task_exports"] == [f"{task_export}/saved_model.pb"]
    probs = out["probabilities"]
    assert len(probs) == 1 and len(probs[0]) == 2
    assert abs(sum(probs[0]) - 1.0) < 1e-5, probs

    # The objects are in the emulator; nothing half-written or staged is left there.
    names = gcs_emulator.list_objects(BUCKET, prefix + "/")
    assert f"{prefix}/models/tiny/ckpt-6.index" in names
    assert f"{prefix}/hf/discriminator/model.safetensors" in names
    assert any(n.startswith(f"{prefix}/pretrain_data/pretrain_data.tfrecord-") for n in names)
    assert any(n.startswith(f"{prefix}/exports/polarity/") and n.endswith("/saved_model.pb")
               for n in names)
    assert [n for n in names if n.endswith(".tmp") or "/.building/" in n] == []
    # And no local directory was made for a gs:// path in the commands' working directory.
    local = [os.path.join(d, n) for d, dirs, files in os.walk(str(tmp_path))
             for n in dirs + files if n.startswith("gs:")]
    assert local == [], local
