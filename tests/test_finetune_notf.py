"""Fine-tuning and `convert export-hf` without TensorFlow: the host batches equal tf.data's,
batch for batch; with TensorFlow unimportable the modules import, a JAX fine-tuning runs and
an HF export writes what the TensorFlow path writes; what is TensorFlow by nature (SavedModels,
TFDS, the in-graph QA and tagging tasks, the model_dir commands) says so in one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from electra_tf import compat
from electra_tf.finetune import batches

import forked_cli
from conftest import REPO, finetune_tiny_model

NO_TF = ("import sys; sys.modules['tensorflow'] = None; "
         "sys.modules['tensorflow_text'] = None\n")
INSTALL = 'pip install -e ".[tensorflow]"'
jax_installed = pytest.mark.skipif(not compat.module_exists("jax"),
                                   reason="the jax extra is not installed")


def _no_tf(code, *args, timeout=300, env=None):
    """Runs `code` in a Python whose TensorFlow and tensorflow-text are unimportable."""
    return subprocess.run([sys.executable, "-c", NO_TF + code, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "KERAS_BACKEND": "jax",
                               **(env or {})})


def _tf_data_batches(arrays, batch_size, seed, skip, n):
    """The TensorFlow runtime's pipeline (`FinetuningJob.train_batches`) under the global
    seed Keras sets for a trial."""
    import keras
    import tensorflow as tf
    keras.utils.set_random_seed(seed)
    rows = len(next(iter(arrays.values())))
    ds = tf.data.Dataset.from_tensor_slices(arrays)
    ds = ds.shuffle(rows, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=True).skip(skip).prefetch(2)
    return [{k: v.numpy() for k, v in b.items()} for _, b in zip(range(n), ds)]


@pytest.mark.parametrize("rows,batch_size,seed,skip", [
    (10, 3, 7, 0), (37, 8, 3, 5), (100, 32, 0, 0), (5, 2, 12345, 4), (1000, 7, 2 ** 31 + 5, 300),
    (8568, 32, 1, 0)])
def test_host_batches_are_tf_datas(rows, batch_size, seed, skip):
    """Three epochs and more (batches across epoch ends, a resumed trial's skip, the seed 0
    and one past 2**31), every array of every batch equal."""
    pytest.importorskip("tensorflow")
    arrays = {"input_ids": np.arange(rows * 3, dtype=np.int32).reshape(rows, 3),
              "weight": np.linspace(0, 1, rows).astype(np.float32)}
    n = 3 * rows // batch_size + 2
    want = _tf_data_batches(arrays, batch_size, seed, skip, n)
    got = batches.shuffled_batches(arrays, batch_size, seed, skip)
    for i, w in enumerate(want):
        g = next(got)
        assert sorted(g) == sorted(w)
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=f"batch {i}, {k}")


def test_host_batches_shuffle_each_epoch_and_resume_where_they_stopped():
    arrays = {"i": np.arange(12)}
    it = batches.shuffled_batches(arrays, 4, seed=3)
    first = [next(it)["i"] for _ in range(9)]  # three epochs
    epochs = [np.concatenate(first[3 * e:3 * e + 3]) for e in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(12))
    assert not np.array_equal(epochs[0], epochs[1])
    again = batches.shuffled_batches(arrays, 4, seed=3, skip_batches=4)
    for want in first[4:]:
        np.testing.assert_array_equal(next(again)["i"], want)


def test_the_philox_stream_is_tensorflows():
    """`PhiloxStream` against TensorFlow's stateful Philox generator (key = the seed's
    halves, counter (0, 0, seed2's halves)), across a block boundary and a refill."""
    tf = pytest.importorskip("tensorflow")
    seed, seed2 = 0x123456789A, 0x0FEDCBA987
    g = tf.random.Generator.from_state(
        [0, seed2, seed], alg="philox")
    want = g.uniform_full_int([1000], tf.uint32).numpy()
    s = batches.PhiloxStream(seed, seed2)
    got = np.concatenate([s.take(3), s.take(300), s.take(697)])
    np.testing.assert_array_equal(got, want)


def test_the_finetuning_job_feeds_the_same_batches_on_both_paths():
    """`FinetuningJob.train_batches` (tf.data) and `host_batches` (NumPy) of a task split."""
    pytest.importorskip("tensorflow")
    import keras
    from electra_tf.configs import FinetuneConfig
    from electra_tf.finetune.base_task import TaskData
    from electra_tf.finetune.tasks import POLARITY
    from electra_tf.finetune.trainer import FinetuningJob
    import dataclasses
    cfg = FinetuneConfig()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, train_batch_size=4))
    rows = 23
    data = TaskData({"input_ids": np.arange(rows * 2, dtype=np.int32).reshape(rows, 2),
                     "label": np.arange(rows, dtype=np.int32) % 2,
                     "weight": np.ones([rows], np.float32)}, rows)
    job = FinetuningJob(POLARITY, finetune_tiny_model(), cfg, 20, None, seed=9)
    keras.utils.set_random_seed(9)  # as the runtimes do for a trial
    want = [{k: v.numpy() for k, v in b.items()}
            for _, b in zip(range(20), job.train_batches(data, 9, skip_batches=2))]
    got = job.host_batches(data, 9, skip_batches=2)
    for w in want:
        g = next(got)
        for k in w:
            np.testing.assert_array_equal(g[k], w[k])


@pytest.mark.subprocess
def test_batches_and_the_tensorflow_line_need_no_tensorflow():
    """What this module adds imports and runs with TensorFlow unimportable."""
    done = _no_tf(
        "from electra_tf import backend\n"
        "from electra_tf.finetune import batches\n"
        "print(next(batches.shuffled_batches({'i': list(range(10))}, 5, 7, 2))['i'].tolist())\n"
        "print(backend.tensorflow_missing('the SavedModel export'))\n"
        "try:\n    backend.require_tensorflow('x')\nexcept backend.BackendError as e:\n"
        "    print(e)\n".replace("list(range(10))", "__import__('numpy').arange(10)"))
    assert done.returncode == 0, done.stderr[-2000:]
    order = next(batches.shuffled_batches({"i": np.arange(10)}, 5, 7, 2))["i"].tolist()
    assert done.stdout.splitlines() == [
        str(order), f"the SavedModel export needs TensorFlow, which is not installed: {INSTALL}",
        f"x needs TensorFlow, which is not installed: {INSTALL}"]


@pytest.mark.subprocess
def test_finetuning_and_conversion_import_without_tensorflow():
    """The fine-tuning CLI body, the trainer, the TSV tasks and the converter import with
    TensorFlow unimportable; a TSV split reads and encodes to the ids TensorFlow's path gives."""
    pytest.importorskip("tensorflow")
    from electra_tf.finetune.tasks import POLARITY
    from electra_tf.text import TextEncoder
    vocab = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")
    data_dir = os.path.join(REPO, "data", "movie_snippets")
    want = POLARITY.eval_splits(data_dir, TextEncoder(vocab), 32)[0].arrays
    done = _no_tf(
        "import json, numpy as np\n"
        "from electra_tf.finetune import cli, trainer, tasks, batches\n"
        "from electra_tf.conversion import convert, formats, keras_hub\n"
        "from electra_tf.text import HostTextEncoder\n"
        "a = tasks.POLARITY.eval_splits(sys.argv[2], HostTextEncoder(sys.argv[1]), 32)[0]"
        ".arrays\n"
        "print(json.dumps({k: np.asarray(v).tolist() for k, v in a.items()}))\n"
        "assert 'tensorflow' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n",
        vocab, data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=k)


@pytest.mark.subprocess
def test_what_is_tensorflow_by_nature_says_so_in_one_line(tmp_path):
    """Without TensorFlow: the QA and tagging tasks, TFDS, --export_dir, saved_model_cli,
    the model_dir commands of `convert` and the builder's learn_vocab each end in one line
    naming TensorFlow's install."""
    code = (
        "from electra_tf import backend\n"
        "from electra_tf.finetune import tasks\n"
        "for name in ('squad_v1', 'ner'):\n"
        "    try:\n        tasks.get_task(name)\n"
        "    except backend.BackendError as e:\n        print(e)\n"
        "from electra_tf.conversion import convert\n"
        "print(convert.main(['export-tf1', sys.argv[1], sys.argv[1] + '/out/model.ckpt']))\n")
    done = _no_tf(code, str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        f"--task=squad_v1 (its windows are made in-graph) needs TensorFlow, which is not "
        f"installed: {INSTALL}",
        f"--task=ner (its words are packed in-graph) needs TensorFlow, which is not "
        f"installed: {INSTALL}",
        "1"]
    assert done.stderr.strip() == (f"error: convert export-tf1 needs TensorFlow, which is not "
                                    f"installed: {INSTALL}")
    cli = _no_tf("from electra_tf.conversion import saved_model_cli\nsaved_model_cli.main()")
    assert cli.returncode == 1 and cli.stderr.strip() == (
        "saved_model_cli: error: saved_model_cli (SavedModels are TensorFlow graphs) needs "
        f"TensorFlow, which is not installed: {INSTALL}")
    learn = _no_tf("sys.argv = ['tfrecord_builder', 'learn_vocab', '--vocab_output=' + "
                   "sys.argv[1] + '/v.txt']\nfrom tfrecord_builder import cli\ncli.run()",
                   str(tmp_path))
    assert learn.returncode == 1 and learn.stderr.strip() == (
        "tfrecord_builder: error: learn_vocab needs TensorFlow and tensorflow-text, which are "
        f"not installed: {INSTALL} (building TFRecords from an existing vocabulary does not)")


def _tsv_task(root):
    data = root / "data"
    (data / "mine").mkdir(parents=True)
    for split, n in (("train", 24), ("dev", 8)):
        rows = [(f"a good film {i}" if i % 2 else f"a bad film {i}", "pos" if i % 2 else "neg")
                for i in range(n)]
        (data / "mine" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
    from electra_tf.conversion import formats
    config = root / "config.json"
    config.write_text(json.dumps(formats.pretraining_config(finetune_tiny_model()).to_json()))
    return data, config


def _finetune_args(data, config, model_dir, *extra):
    return ["--backend=jax", "--task=mine", f"--data_dir={data}", "--text_columns=sentence",
            "--label_column=label", "--init_checkpoint=none", f"--config={config}",
            f"--model_dir={model_dir}", "--max_seq_length=16", "--train_batch_size=8",
            "--eval_batch_size=8", "--num_train_epochs=2", *extra]


RUN_FINETUNING = ("import runpy; sys.argv = ['run_finetuning.py', *sys.argv[1:]]\n"
                  "runpy.run_path('run_finetuning.py', run_name='__main__')\n")


@jax_installed
@pytest.mark.subprocess
@pytest.mark.e2e
@pytest.mark.jax
def test_a_jax_finetuning_without_tensorflow_scores_as_one_with_it(tmp_path):
    """The same fine-tuning on JAX (two trials) with TensorFlow unimportable and with it
    installed: the same dev metrics and loss to the digit (the same batches); on 2
    processes (`jax.distributed`, each sending its share of every global batch) the same
    trials within 1e-5, both processes reporting them, process 0 alone logging the steps
    and writing the results; --export_dir without TensorFlow is one line before any
    training."""
    import re
    from test_jax_multiprocess import Job
    data, config = _tsv_task(tmp_path)
    env = {"KERAS_BACKEND": "jax"}
    # With TensorFlow first: the run without it then takes the programs from the
    # compilation cache (it once aborted at exit only then: a reader thread stopped by the
    # interpreter while holding placed batches).
    with_tf = forked_cli.run(["run_finetuning.py", *_finetune_args(
        data, config, tmp_path / "tf", "--num_trials=2")], cwd=REPO, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env})
    assert with_tf.returncode == 0, with_tf.stderr[-3000:]
    without = _no_tf(RUN_FINETUNING, *_finetune_args(data, config, tmp_path / "no_tf",
                                                     "--num_trials=2"), env=env)
    assert without.returncode == 0, without.stderr[-3000:]
    assert "persistent cache: 2 hits, 0 misses" in without.stderr
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("no_tf", "tf"))
    assert a["trials"] == b["trials"] and a["labels"] == ["neg", "pos"]
    assert [t["seed"] for t in a["trials"]] == [1, 2]

    codes, logs = Job(["run_finetuning.py", *_finetune_args(
        data, config, tmp_path / "two", "--num_trials=2")], processes=2, devices=1).finish()
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert len(two["trials"]) == 2 and two["median_trial"] == b["median_trial"]
    for want, got in zip(b["trials"], two["trials"]):
        assert want.keys() == got.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-5), key
    trial_lines = lambda log: re.findall(r"Trial \d \(seed \d\) dev: [^\n]*", log)  # noqa: E731
    assert len(trial_lines(logs[0])) == 2 and trial_lines(logs[1]) == trial_lines(logs[0])
    steps = lambda log: re.findall(r"\] step \d+/6 ", log)  # noqa: E731
    assert len(steps(logs[0])) == 2 and steps(logs[1]) == []  # each trial's last step
    assert not (tmp_path / "two" / ".workers").exists()
    export = _no_tf(RUN_FINETUNING, *_finetune_args(data, config, tmp_path / "x",
                                                    f"--export_dir={tmp_path / 'e'}"), env=env)
    assert export.returncode == 1 and export.stderr.strip().splitlines()[-1] == (
        "run_finetuning: error: --export_dir (a SavedModel export) needs TensorFlow, which is "
        f"not installed: {INSTALL}")
    assert not (tmp_path / "x" / "trial_0").exists()


def _discriminator_run(tmp_path):
    """A pre-training run's config.json and discriminator/ export (TF1 layout)."""
    tf = pytest.importorskip("tensorflow")
    from electra_tf.conversion import formats
    from electra_tf.model.modeling import ElectraPretrainingModel, discriminator_variables
    from electra_tf.training.checkpoints import save_tf1_checkpoint
    run = tmp_path / "run"
    run.mkdir()
    tf.keras.utils.set_random_seed(5)
    model = ElectraPretrainingModel(finetune_tiny_model())
    (run / "config.json").write_text(
        json.dumps(formats.pretraining_config(finetune_tiny_model()).to_json()))
    save_tf1_checkpoint(model, str(run / "discriminator" / "model.ckpt"),
                        discriminator_variables(model))
    return run


def _convert_both_ways(tmp_path, command):
    """`convert COMMAND run OUT` in this process (TensorFlow loaded) into `with`, and with
    TensorFlow unimportable into `without`."""
    from electra_tf.conversion import convert
    run = _discriminator_run(tmp_path)
    vocab = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")
    assert convert.main([command, str(run), str(tmp_path / "with"),
                         f"--vocab_file={vocab}"]) == 0
    done = _no_tf("from electra_tf.conversion import convert\n"
                  "sys.exit(convert.main(sys.argv[1:]))",
                  command, str(run), str(tmp_path / "without"), f"--vocab_file={vocab}")
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.subprocess
def test_export_hf_without_tensorflow_writes_what_it_writes_with_it(tmp_path):
    """`convert export-hf` of a pre-training run's discriminator export with TensorFlow
    unimportable: the same safetensors arrays and config.json as in a TensorFlow process."""
    from safetensors.numpy import load_file
    _convert_both_ways(tmp_path, "export-hf")
    with_tf, without = tmp_path / "with" / "discriminator", tmp_path / "without" / "discriminator"
    a, b = (load_file(str(d / "model.safetensors")) for d in (with_tf, without))
    assert a and sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for name in ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        assert (with_tf / name).read_bytes() == (without / name).read_bytes(), name


@pytest.mark.subprocess
def test_export_keras_hub_without_tensorflow_writes_what_it_writes_with_it(tmp_path):
    """`convert export-keras-hub` with TensorFlow unimportable: the same weights, config and
    tokenizer files as in a TensorFlow process (metadata.json differs by its date only)."""
    pytest.importorskip("keras_hub")
    import h5py
    _convert_both_ways(tmp_path, "export-keras-hub")

    def weights(path):
        out = {}
        with h5py.File(path) as f:
            f.visititems(lambda name, o: out.__setitem__(name, o[()])
                         if isinstance(o, h5py.Dataset) else None)
        return out
    a, b = (weights(tmp_path / d / "model.weights.h5") for d in ("with", "without"))
    assert a and sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    for name in ("config.json", "tokenizer.json", "assets/tokenizer/vocabulary.txt"):
        assert (tmp_path / "with" / name).read_bytes() == \
            (tmp_path / "without" / name).read_bytes(), name
