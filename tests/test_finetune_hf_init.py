"""--init_checkpoint from Hugging Face `transformers` directories: BERT and ELECTRA."""

import json
import logging as py_logging
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from electra_tf.conversion import formats, source
from electra_tf.conversion.formats import ConvertError
from electra_tf.training import checkpoints
from electra_tf.configs import ModelConfig
from electra_tf.finetune.cli import find_config
from electra_tf.finetune.model import FinetuningModel, InitError, init_encoder, make_head
from electra_tf.model.modeling import ElectraPretrainingModel, tf1_variables

H, L, I, V, P, T = 32, 2, 48, 40, 20, 2
BERT_CONFIG = {"architectures": ["BertForPreTraining"], "model_type": "bert",
               "vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
               "num_attention_heads": 2, "intermediate_size": I, "hidden_act": "gelu",
               "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
               "max_position_embeddings": P, "type_vocab_size": T,
               "initializer_range": 0.02, "layer_norm_eps": 1e-12}
HEADS = ["bert.pooler.dense.weight", "bert.pooler.dense.bias",
         "cls.predictions.bias", "cls.predictions.transform.dense.weight",
         "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
         "cls.predictions.transform.LayerNorm.bias", "cls.predictions.decoder.weight",
         "cls.seq_relationship.weight", "cls.seq_relationship.bias"]


def bert_tensors(prefix="bert.", old_ln=False, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    w, b = ("gamma", "beta") if old_ln else ("weight", "bias")
    t = {f"{prefix}embeddings.word_embeddings.weight": r(V, H),
         f"{prefix}embeddings.position_embeddings.weight": r(P, H),
         f"{prefix}embeddings.token_type_embeddings.weight": r(T, H),
         f"{prefix}embeddings.LayerNorm.{w}": r(H), f"{prefix}embeddings.LayerNorm.{b}": r(H)}
    for i in range(L):
        p = f"{prefix}encoder.layer.{i}."
        for d in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense"):
            t[p + d + ".weight"], t[p + d + ".bias"] = r(H, H), r(H)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(I, H), r(I)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(H, I), r(H)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[f"{p}{ln}.{w}"], t[f"{p}{ln}.{b}"] = r(H), r(H)
    if prefix:
        t["bert.pooler.dense.weight"], t["bert.pooler.dense.bias"] = r(H, H), r(H)
        t["cls.predictions.bias"] = r(V)
        t["cls.predictions.transform.dense.weight"] = r(H, H)
        t["cls.predictions.transform.dense.bias"] = r(H)
        t["cls.predictions.transform.LayerNorm.weight"] = r(H)
        t["cls.predictions.transform.LayerNorm.bias"] = r(H)
        t["cls.predictions.decoder.weight"] = t[f"{prefix}embeddings.word_embeddings.weight"]
        t["cls.seq_relationship.weight"], t["cls.seq_relationship.bias"] = r(2, H), r(2)
    return t


def write_hf(d, tensors, config=BERT_CONFIG):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(d, "model.safetensors"))
    return str(d)


def tf1_to_bert(name: str, prefix="bert.") -> str:
    """Independent of formats.py: the expected BERT name of one of our TF1 names."""
    rest = name.split("/", 1)[1]
    rest = rest.replace("/gamma", "/weight").replace("/beta", "/bias").replace(
        "/kernel", "/weight")
    if rest.endswith("_embeddings"):
        rest += "/weight"
    rest = rest.replace("encoder/layer_", "encoder/layer/")
    return prefix + rest.replace("/", ".")


def encoder_arrays(ft):
    return {name: v.numpy() for name, v in tf1_variables(ft.electra).items()}


@pytest.mark.parametrize("prefix,old_ln", [("bert.", False), ("bert.", True), ("", False)])
def test_bert_dir_initialises_every_encoder_weight(tmp_path, prefix, old_ln, caplog):
    tensors = bert_tensors(prefix, old_ln)
    d = write_hf(tmp_path / "bert", tensors)
    config = find_config(d, None)  # no --config needed
    assert (config.hidden_size, config.embedding_size, config.num_hidden_layers,
            config.num_attention_heads, config.intermediate_size, config.vocab_size,
            config.max_position_embeddings, config.type_vocab_size) == (H, H, L, 2, I, V, P, T)
    ft = FinetuningModel(config, make_head("classification", config, 3))
    assert ft.electra.embeddings_project is None
    with caplog.at_level(py_logging.INFO):
        assert init_encoder(ft.electra, d) == d
    ignored = source.resolve(d).ignored
    got = encoder_arrays(ft)
    assert len(got) == 5 + 16 * L
    for name, value in got.items():
        key = tf1_to_bert(name, prefix)
        if old_ln:
            key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta")
        src = tensors[key]
        np.testing.assert_array_equal(value, src.T if name.endswith("/kernel") else src)
    assert ignored == sorted(HEADS if prefix else [])
    if prefix:
        assert "bert.pooler.dense.weight" in caplog.text and "cls.seq_relationship" in caplog.text


def test_bert_dir_errors_are_one_line(tmp_path):
    tensors = bert_tensors()
    config = formats.hf_model_config(BERT_CONFIG)
    ft = FinetuningModel(config, make_head("classification", config, 2))
    bad_act = write_hf(tmp_path / "relu", tensors, {**BERT_CONFIG, "hidden_act": "relu"})
    for call in (lambda: find_config(bad_act, None), lambda: init_encoder(ft.electra, bad_act)):
        with pytest.raises(ConvertError, match="hidden_act 'relu' is not supported") as e:
            call()
        assert "\n" not in str(e.value)
    bad_shape = dict(tensors)
    bad_shape["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((I + 1, H), np.float32)
    d = write_hf(tmp_path / "shape", bad_shape)
    with pytest.raises(ConvertError, match=r"layer\.1\.intermediate\.dense\.weight has shape "
                                        r"\[49, 32\], config.json implies \[48, 32\]") as e:
        init_encoder(ft.electra, d)
    assert "\n" not in str(e.value)
    # The config and the model disagree (e.g. a wrong --config): a shape error too.
    wider = ModelConfig(**{**config.__dict__, "intermediate_size": 64})
    other = FinetuningModel(wider, make_head("classification", wider, 2))
    with pytest.raises(InitError, match=r"intermediate/dense/kernel: shape \[32, 48\] != "
                                        r"variable shape \[32, 64\]"):
        init_encoder(other.electra, write_hf(tmp_path / "ok", tensors))
    missing = {k: v for k, v in tensors.items() if "layer.1.output.dense.bias" not in k}
    with pytest.raises(ConvertError, match=r"encoder\.layer\.1\.output\.dense\.bias .*not in"):
        init_encoder(ft.electra, write_hf(tmp_path / "missing", missing))
    torch_only = tmp_path / "torch"
    torch_only.mkdir()
    (torch_only / "config.json").write_text(json.dumps(BERT_CONFIG))
    (torch_only / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(ConvertError, match="pytorch_model.bin.*convert it to model.safetensors"):
        init_encoder(ft.electra, str(torch_only))
    roberta = write_hf(tmp_path / "roberta", tensors, {**BERT_CONFIG, "model_type": "roberta"})
    with pytest.raises(ConvertError, match="model_type 'roberta' is not electra or bert"):
        find_config(roberta, None)


def test_exported_electra_dir_initialises_the_finetuning_encoder(tmp_path):
    config = ModelConfig(vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=24, type_vocab_size=2,
                         generator_hidden_size=0.5)
    model = ElectraPretrainingModel(config)
    arrays = checkpoints.model_arrays(model)
    d = formats.export_hf(arrays, config, str(tmp_path / "electra"))
    found = find_config(d, None)
    assert found == config.__class__(**{**config.__dict__, "generator_hidden_size": 0.25})
    ft = FinetuningModel(found, make_head("classification", found, 2))
    assert init_encoder(ft.electra, d) == d
    ignored = source.resolve(d).ignored
    assert ignored == sorted(k for k in formats.hf_name_map(config, "discriminator").values()
                             for k in [k[0]] if k.startswith("discriminator_predictions."))
    got = encoder_arrays(ft)
    assert "electra/embeddings_project/kernel" in got and len(got) == 7 + 16 * 2
    for name, value in got.items():
        np.testing.assert_array_equal(value, arrays[name])
