"""conversion.keras_hub and keras_hub_classifier: keras-hub ELECTRA presets both ways, parity
with our encoder (GELU's tanh approximation apart), the tokenizer, a fine-tuned classifier,
keras-hub's TextClassifier, and bad presets."""

import json
import os
import shutil
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

keras_hub = pytest.importorskip("keras_hub")

from electra_tf.configs import ModelConfig  # noqa: E402
from electra_tf.conversion import convert  # noqa: E402
from electra_tf.conversion import keras_hub as kh  # noqa: E402
from electra_tf.model.modeling import (ElectraPretrainingModel,  # noqa: E402
                                       build_discriminator_encoder, released_arrays)
from electra_tf.text import TextEncoder  # noqa: E402
from electra_tf.training import checkpoints  # noqa: E402

from conftest import NEWS, REPO, VOCAB, WIKI, finetune_tiny_model  # noqa: E402

TINY = ModelConfig(vocab_size=30522, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                   generator_hidden_size=0.5, initializer_range=0.2)
# initializer_range 0.2: activations of a trained model's size, where the GELU forms differ.


def _lines(path, n=None):
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:n] if n else lines


def _export(tmp, arrays, config, name, *extra):
    src = tmp / f"{name}_src"
    checkpoints.write_tf1(arrays, str(src / "model.ckpt"))
    shutil.copy(VOCAB, src / "vocab.txt")
    out = str(tmp / name)
    args = ["export-keras-hub", str(src), out, "--num_heads", str(config.num_attention_heads)]
    assert convert.main(args + list(extra)) == 0
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kh")
    arrays = released_arrays(ElectraPretrainingModel(TINY))
    return tmp, arrays, _export(tmp, arrays, TINY, "disc"), _export(
        tmp, arrays, TINY, "gen", "--part", "generator")


def test_round_trip_gives_every_encoder_array_back_exactly(exported, capsys):
    tmp, arrays, disc, gen = exported
    assert sorted(os.listdir(disc)) == ["assets", "config.json", "metadata.json",
                                        "model.weights.h5", "tokenizer.json"]
    with open(os.path.join(disc, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["registered_name"] == "keras_hub>ElectraBackbone"
    assert {k: cfg["config"][k] for k in ("hidden_dim", "embedding_dim", "num_layers",
                                          "num_heads", "intermediate_dim")} == \
        {"hidden_dim": 32, "embedding_dim": 16, "num_layers": 2, "num_heads": 2,
         "intermediate_dim": 64}
    assert convert.main(["import-keras-hub", disc, str(tmp / "back")]) == 0
    assert "--init_checkpoint=" in capsys.readouterr().out
    back = checkpoints.read_tf1(str(tmp / "back" / "model.ckpt"))
    encoder = [n for n in arrays if n.startswith("electra/")]
    assert sorted(back) == sorted(encoder) and len(encoder) == 39
    for name in encoder:
        np.testing.assert_array_equal(back[name], arrays[name], name)
    # The generator's encoder (tied embeddings: `electra/embeddings/...`), 16 wide.
    config, gen_arrays, lower = kh.import_keras_hub(gen)
    assert (config.hidden_size, config.embedding_size, lower) == (16, 16, True)
    names = kh.encoder_names(TINY, "generator")
    assert sum(n.startswith("generator/encoder/") for n in names.values()) == 32
    for key, name in names.items():
        np.testing.assert_array_equal(gen_arrays[kh.encoder_names(config, "discriminator")[key]],
                                      arrays[name], name)
    # A TF1 directory that fine-tuning and import-tf1 take.
    assert (tmp / "back" / "vocab.txt").read_bytes() == open(VOCAB, "rb").read()


def _ours_and_theirs(arrays, config, preset, tanh):
    """(our sequence output, keras-hub's, mask) on real sentences of both corpora."""
    encoder = build_discriminator_encoder(config)
    checkpoints.assign_arrays(encoder, {k: v for k, v in arrays.items()
                                        if k.startswith("electra/")})
    if tanh:  # keras-hub's GELU, for the parity test only
        for block in encoder.blocks:
            block.intermediate.activation = lambda x: tf.nn.gelu(x, approximate=True)
    batch = TextEncoder(VOCAB).encode_numpy(_lines(WIKI, 24) + _lines(NEWS, 24),
                                            max_seq_length=config.max_position_embeddings)
    ours = encoder(batch["input_ids"], batch["input_mask"], batch["segment_ids"]).numpy()
    backbone = keras_hub.models.ElectraBackbone.from_preset(preset)
    theirs = backbone({"token_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
                       "padding_mask": batch["input_mask"]})
    return ours, theirs, batch["input_mask"].astype(bool)


def test_sequence_outputs_match_but_for_the_gelu_approximation(exported):
    tmp, arrays, disc, _ = exported
    diffs = {}
    for tanh in (False, True):
        ours, theirs, mask = _ours_and_theirs(arrays, TINY, disc, tanh)
        diffs[tanh] = np.abs(ours - theirs["sequence_output"].numpy())[mask].max()
    print(f"max |ours - keras-hub|: exact GELU {diffs[False]:.3g}, tanh GELU {diffs[True]:.3g}")
    assert diffs[True] < 1e-5  # everything but GELU: float32 round-off
    assert diffs[True] * 5 < diffs[False] < 1e-2
    # The pooler is the identity: pooled_output = tanh([CLS]).
    np.testing.assert_allclose(theirs["pooled_output"].numpy(), np.tanh(ours[:, 0]), atol=1e-5)


def _strip_accents(text):
    return "".join(c for c in unicodedata.normalize("NFD", text)
                   if unicodedata.category(c) != "Mn")


def _case_folds_differently(line):
    """keras-hub strips accents, then lower-cases by NFKC case folding ('…' -> '...',
    '²' -> '2', 'ß' -> 'ss', final 'ς' -> 'σ', Hangul jamo recomposed); BERT (and we)
    lower-case plainly, then strip accents."""
    return unicodedata.normalize("NFKC", _strip_accents(line)).casefold() != \
        _strip_accents(line.lower())


def test_exported_tokenizer_gives_our_ids_but_where_keras_hub_case_folds(exported):
    """Every line of both corpora: the same ids, except on the lines (36 of 19,748 of the
    Wikipedia sample, none of the news) where keras-hub's case folding departs from BERT's
    lower-casing, which no ElectraTokenizer setting avoids."""
    tokenizer = keras_hub.models.ElectraTokenizer.from_preset(exported[2])
    ours = TextEncoder(VOCAB)
    for path, expected in ((WIKI, 36), (NEWS, 0)):
        lines = _lines(path)
        theirs = [[int(i) for i in row] for row in tokenizer(lines)]
        mine = ours.tokenize_lists(lines)
        bad = [line for line, a, b in zip(lines, mine, theirs) if a != b]
        assert len(theirs) == len(lines) > 2000 and len(bad) == expected, (path, bad[:3])
        assert all(map(_case_folds_differently, bad))


def test_fine_tuned_classifier_predicts_the_same_through_keras_hub(tmp_path):
    from electra_tf.finetune.tasks import get_task
    from electra_tf.configs import FinetuneConfig, apply_overrides
    from electra_tf.finetune.trainer import predict, train_trial
    from runtimes import tf_finetuner
    config, task, encoder = finetune_tiny_model(), get_task("polarity"), TextEncoder(VOCAB)
    data = os.path.join(REPO, "data")
    cfg = apply_overrides(FinetuneConfig(), dict(
        learning_rate=3e-3, num_train_epochs=4, train_batch_size=16, eval_batch_size=8,
        max_seq_length=32, steps_per_loop=10, save_checkpoints_steps=1000)
    ).resolved(config, task).check()
    train = task.train_split(data, encoder, 32)
    dev = task.eval_splits(data, encoder, 32)[0]
    ft = tf_finetuner(task, config, cfg, tf.distribute.get_strategy(), 40, None, 1)
    train_trial(ft, train, str(tmp_path / "trial"), 1)
    ours = predict(ft, dev)["logits"]
    arrays = released_arrays(ft.model, ft.model.electra.trainable_variables)
    preset = _export(tmp_path, arrays, config, "ft")
    backbone = keras_hub.models.ElectraBackbone.from_preset(preset)
    n = dev.num_examples
    cls = backbone({"token_ids": dev.arrays["input_ids"][:n],
                    "segment_ids": dev.arrays["segment_ids"][:n],
                    "padding_mask": dev.arrays["input_mask"][:n]})["sequence_output"][:, 0]
    head = ft.model.head.classifier
    theirs = cls.numpy() @ head.kernel.numpy() + head.bias.numpy()
    agree = np.mean(np.argmax(ours, -1) == np.argmax(theirs, -1))
    print(f"dev {n}: labels agree {agree:.4f}, max logit diff {np.abs(ours - theirs).max():.3g}")
    assert n == 40 and agree >= 0.99


@pytest.mark.slow
def test_text_classifier_from_preset_fine_tunes(exported):
    import keras
    from electra_tf.conversion.keras_hub_classifier import ElectraTextClassifier
    keras.utils.set_random_seed(1)
    classifier = keras_hub.models.TextClassifier.from_preset(exported[2], num_classes=2)
    assert isinstance(classifier, ElectraTextClassifier)
    assert classifier.preprocessor.sequence_length == TINY.max_position_embeddings
    classifier.compile(optimizer=keras.optimizers.Adam(3e-3),
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = ["a great film", "an awful plot", "superb and nice", "dull and poor"] * 2
    y = np.array([1, 0, 1, 0] * 2)
    # Judged without dropout (evaluate), before and after: fit's per-epoch loss is noisy.
    before = classifier.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)["loss"]
    classifier.fit(x, y, batch_size=8, epochs=10, verbose=0)
    after = classifier.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)["loss"]
    assert after < 0.9 * before, (before, after)


def _bad(tmp_path, capsys, argv):
    out = tmp_path / "out"
    assert convert.main(argv + [str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".keras")]
    assert err.count("\n") == 0, err
    return err


def test_bad_sources_are_one_line_and_write_nothing(exported, tmp_path, capsys):
    tmp, arrays, disc, _ = exported
    bert = tmp_path / "bert"
    shutil.copytree(disc, bert)
    with open(bert / "config.json") as f:
        cfg = json.load(f)
    cfg["registered_name"] = "keras_hub>BertBackbone"
    (bert / "config.json").write_text(json.dumps(cfg))
    err = _bad(tmp_path, capsys, ["import-keras-hub", str(bert)])
    assert "config.json" in err and "keras_hub>BertBackbone" in err and "not an ELECTRA" in err
    err = _bad(tmp_path, capsys, ["import-keras-hub", VOCAB])
    assert "config.json" in err and "not a keras-hub preset" in err
    no_tok = tmp_path / "no_tok"
    shutil.copytree(disc, no_tok)
    os.remove(no_tok / "tokenizer.json")
    err = _bad(tmp_path, capsys, ["import-keras-hub", str(no_tok)])
    assert f"{no_tok}/tokenizer.json: missing" in err
    no_mask = tmp_path / "no_mask"
    shutil.copytree(disc, no_mask)
    vocab = no_mask / kh.VOCAB_ASSET
    vocab.write_text(vocab.read_text().replace("[MASK]\n", "[MASKED]\n"))
    err = _bad(tmp_path, capsys, ["import-keras-hub", str(no_mask)])
    assert str(vocab) in err and "[MASK]" in err
    # Export: a vocabulary without [MASK], a Hugging Face BERT directory (not ELECTRA).
    src = tmp / "disc_src"
    err = _bad(tmp_path, capsys, ["export-keras-hub", str(src), "--vocab_file", str(vocab)])
    assert str(vocab) in err and "[MASK]" in err
    hf = tmp_path / "hf_bert"
    assert convert.main(["export-hf", str(src), str(hf)]) == 0
    cfg = json.loads((hf / "discriminator" / "config.json").read_text())
    (hf / "discriminator" / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    shutil.copy(VOCAB, hf / "discriminator" / "vocab.txt")
    err = _bad(tmp_path, capsys, ["export-keras-hub", str(hf / "discriminator")])
    assert "model_type 'bert' is not electra" in err


def test_hugging_face_to_keras_hub_through_us(exported, tmp_path):
    tmp, arrays, disc, _ = exported
    hf = tmp_path / "hf"
    assert convert.main(["export-hf", str(tmp / "disc_src"), str(hf),
                         "--num_heads", "2"]) == 0
    shutil.copy(VOCAB, hf / "discriminator" / "vocab.txt")
    out = str(tmp_path / "preset")
    assert convert.main(["export-keras-hub", str(hf / "discriminator"), out]) == 0
    _, back, _ = kh.import_keras_hub(out)
    for name, value in back.items():
        np.testing.assert_array_equal(value, arrays[name], name)


def test_without_keras_hub_the_cli_names_the_extra(exported, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "keras_hub", None)  # import fails
    err = _bad(tmp_path, capsys, ["export-keras-hub", str(exported[0] / "disc_src")])
    assert err == 'error: keras-hub is not installed: pip install -e ".[keras-hub]"'


def test_presets_on_a_remote_filesystem_go_both_ways(exported, tmp_path):
    """OUT and PRESET on TensorFlow's filesystems (ram:// here, gs:// alike): staged
    locally for keras-hub, copied with fileio, every array back."""
    from ram_paths import forget
    tmp, arrays, disc, _ = exported
    root = "ram://keras_hub_test"
    try:
        src = str(tmp / "disc_src")
        assert convert.main(["export-keras-hub", src, f"{root}/preset", "--num_heads", "2"]) == 0
        assert sorted(tf.io.gfile.listdir(f"{root}/preset")) == [
            "assets", "config.json", "metadata.json", "model.weights.h5", "tokenizer.json"]
        assert convert.main(["import-keras-hub", f"{root}/preset", f"{root}/back"]) == 0
        back = checkpoints.read_tf1(f"{root}/back/model.ckpt")
        assert len(back) == 39
        for name, value in back.items():
            np.testing.assert_array_equal(value, arrays[name], name)
    finally:
        forget(root)
