"""A run directory carries its vocabulary and casing (`text.record_run_vocab`, written when a
pre-training run starts, from its data's manifest), and every consumer reads them by
default: `convert export-hf` writes the tokenizer files `AutoTokenizer` reads (tokenising
as our model was trained), `convert export-keras-hub` needs no --vocab_file, fine-tuning
takes the run's vocabulary, and a keras-hub preset directory is an --init_checkpoint."""

import hashlib
import json
import os

import numpy as np
import pytest

from electra_tf import text
from electra_tf.configs import load_config
from electra_tf.pretraining import pretrain
from electra_tf.training.options import PretrainingOptions

import forked_cli
from conftest import REPO, VOCAB


def _manifest(vocab_path, lower=True, name=None):
    data = open(vocab_path, "rb").read()
    return {"tokenizer": {"kind": "wordpiece", "vocab_file": name or os.path.basename(
        vocab_path), "vocab_size": data.count(b"\n"), "do_lower_case": lower,
        "vocab_sha256": hashlib.sha256(data).hexdigest(), "special_token_ids": {"[PAD]": 0}}}


def test_a_run_records_the_builds_vocabulary_and_finds_it_from_any_checkpoint(tmp_path):
    build, run = tmp_path / "build", tmp_path / "run"
    build.mkdir()
    run.mkdir()
    (build / "my_vocab.txt").write_bytes(open(VOCAB, "rb").read())
    manifest = _manifest(build / "my_vocab.txt", lower=False)
    (build / "my_vocab.txt").rename(build / "vocab.txt")  # the builder's copy of it
    assert text.record_run_vocab(str(run), manifest, str(build)) is None
    record = json.loads((run / text.VOCAB_JSON).read_text())
    assert record["vocab_file"] == "vocab.txt" and record["built_from"] == "my_vocab.txt"
    assert record["vocab_sha256"] == manifest["tokenizer"]["vocab_sha256"]
    assert (run / "vocab.txt").read_bytes() == open(VOCAB, "rb").read()
    (run / "discriminator").mkdir()
    for where in (run, run / "ckpt-6", run / "discriminator" / "model.ckpt"):
        found = text.find_run_vocab(str(where))
        assert found == text.RunVocab(str(run / "vocab.txt"), "wordpiece", False), where
    assert found.flags() == {"vocab_file": str(run / "vocab.txt"), "spm_model": None,
                             "do_lower_case": False}
    assert text.find_run_vocab(str(tmp_path / "elsewhere" / "x")) is None


def test_an_older_build_without_the_file_finds_it_by_sha256_or_says_why(tmp_path):
    build, run = tmp_path / "build", tmp_path / "run"
    build.mkdir()
    run.mkdir()
    manifest = _manifest(VOCAB)
    assert text.record_run_vocab(str(run), manifest, str(build),
                                 search=[os.path.dirname(VOCAB)]) is None
    assert (run / "vocab.txt").read_bytes() == open(VOCAB, "rb").read()
    other = _manifest(VOCAB)
    other["tokenizer"]["vocab_sha256"] = "0" * 64  # a vocabulary of that name, not this one
    why = text.record_run_vocab(str(tmp_path / "run2"), other, str(build),
                                search=[os.path.dirname(VOCAB)])
    assert why.startswith(f"{os.path.basename(VOCAB)} (sha256 000000000000...) is neither "
                          f"in {build} nor in {os.path.dirname(VOCAB)}"), why
    assert text.record_run_vocab(str(run), None, str(build)) == (
        "the training data has no manifest.json naming its vocabulary")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, sample_build):
    """A 2-step run on the sample build (the builder put its vocabulary beside it)."""
    assert os.path.isfile(os.path.join(sample_build[0], "vocab.txt"))
    run = tmp_path_factory.mktemp("vocab_run") / "run"
    cfg = load_config("tiny", {"train_batch_size": "4", "num_train_steps": "2",
                               "save_checkpoints_steps": "2"})
    pretrain.run(cfg, PretrainingOptions(model_dir=str(run), train_data=sample_build[0],
                                         strategy="cpu", jit_compile=False))
    return run


@pytest.mark.subprocess
@pytest.mark.e2e
def test_exports_of_a_run_carry_its_tokenizer(tmp_path, run_dir):
    """export-hf: AutoTokenizer on the export gives our TextEncoder's ids (not a 5-token
    tokenizer); export-keras-hub with no --vocab_file; the keras-hub preset is an
    --init_checkpoint whose encoder fine-tuning loads, with the preset's vocabulary."""
    assert (run_dir / "vocab.txt").exists() and (run_dir / text.VOCAB_JSON).exists()
    hf = forked_cli.run(["-m", "electra_tf.conversion.convert", "export-hf", str(run_dir),
                         str(tmp_path / "hf")], cwd=REPO, timeout=300)
    assert hf.returncode == 0, hf.stderr[-2000:]
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf" /
                                                               "discriminator"))
    sentence = "The quick brown fox, Héllo WORLD"
    ours = text.TextEncoder(VOCAB, True).encode_numpy([sentence], None, 16)["input_ids"][0]
    theirs = tokenizer(sentence)["input_ids"]
    assert len(set(theirs)) > 5
    assert list(ours[:len(theirs)]) == theirs

    pytest.importorskip("keras_hub")
    kh = forked_cli.run(["-m", "electra_tf.conversion.convert", "export-keras-hub",
                         str(run_dir), str(tmp_path / "kh")], cwd=REPO, timeout=300)
    assert kh.returncode == 0, kh.stderr[-2000:]
    from electra_tf.conversion import source
    preset, run = source.resolve(str(tmp_path / "kh")), source.resolve(str(run_dir))
    assert preset.kind == "keras_hub"
    name = "electra/encoder/layer_0/attention/self/query/kernel"
    np.testing.assert_allclose(preset.read(name), run.read(name), rtol=1e-6)
    assert text.find_run_vocab(str(tmp_path / "kh")).do_lower_case
