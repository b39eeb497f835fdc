"""conversion.formats, pretraining.model_dir and the conversion.convert CLI: TF1
inspect/import/export and Hugging Face safetensors round trips."""

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.conversion import convert, formats, source
from electra_tf.pretraining import model_dir
from electra_tf.training import checkpoints
from electra_tf.configs import ModelConfig
from electra_tf.model.modeling import ElectraPretrainingModel, released_arrays, tf1_variables

from conftest import REPO

TINY = ModelConfig(vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=1, intermediate_size=64, max_position_embeddings=24,
                   type_vocab_size=2, generator_hidden_size=0.5)
# Like the released small++: generator as wide as the discriminator, E != H, 128 hidden.
WIDE = ModelConfig(vocab_size=40, embedding_size=32, hidden_size=128, num_hidden_layers=2,
                   num_attention_heads=2, intermediate_size=96, max_position_embeddings=16,
                   type_vocab_size=3, generator_hidden_size=1.0)


def _ckpt(tmp_path, config, extra=None, name="model.ckpt", variables=None):
    model = ElectraPretrainingModel(config)
    prefix = str(tmp_path / name)
    arrays = released_arrays(model)
    if variables is not None:
        arrays = {k: v for k, v in arrays.items() if k in variables}
    arrays.update(extra or {})
    checkpoints.write_tf1(arrays, prefix)
    return model, prefix, arrays


@pytest.mark.parametrize("config", [TINY, WIDE])
def test_expected_shapes_match_the_model(config):
    model = ElectraPretrainingModel(config)
    got = {name: tuple(v.shape) for name, v in tf1_variables(model).items()}
    assert got == formats.expected_shapes(config)


def test_inspect_infers_config_and_reports(tmp_path, capsys):
    model = ElectraPretrainingModel(WIDE)
    slots = {"electra/embeddings/word_embeddings/adam_m": np.zeros((40, 32), np.float32),
             "electra/embeddings/word_embeddings/adam_v": np.zeros((40, 32), np.float32),
             "global_step": np.int64(1234), "some/other/var": np.ones(3, np.float32)}
    prefix = checkpoints.save_tf1_checkpoint(model, str(tmp_path / "plain.ckpt"))
    arrays = checkpoints.read_tf1(prefix)
    arrays.update(slots)
    prefix = checkpoints.write_tf1(arrays, str(tmp_path / "full.ckpt"))
    report = source.inspect_tf1(prefix)
    c = report.config
    assert (c.vocab_size, c.embedding_size, c.hidden_size, c.num_hidden_layers) == (40, 32, 128, 2)
    assert (c.num_attention_heads, c.intermediate_size, c.max_position_embeddings,
            c.type_vocab_size) == (2, 96, 16, 3)
    assert c.generator_hidden_size == 1.0 and c.generator_layers == 1.0 and c.tie_embeddings
    assert report.has_generator and report.global_step == 1234
    assert report.unmapped == ["some/other/var"] and not report.missing
    assert len(report.slots) == 2 and len(report.mapped) == len(formats.expected_shapes(c))
    assert convert.main(["inspect", prefix]) == 0
    out = capsys.readouterr().out
    assert "hidden_size: 128" in out and "global_step: 1234" in out and "some/other/var" in out

    # directory form, and the tiny one with a half-width generator
    _, p2, _ = _ckpt(tmp_path / "tiny", TINY)
    r2 = source.inspect_tf1(str(tmp_path / "tiny"))
    assert r2.config.generator_hidden == 16 and r2.config.generator_intermediate == 32
    assert r2.config.num_attention_heads == 1 and r2.global_step is None


def test_inspect_discriminator_only_and_missing(tmp_path):
    disc = formats.expected_shapes(TINY, generator=False)
    _, prefix, _ = _ckpt(tmp_path, TINY, variables=disc)
    report = source.inspect_tf1(prefix)
    assert not report.has_generator and not report.missing
    layer1 = [n for n in disc if "layer_1/output/dense/kernel" in n]
    _, prefix, _ = _ckpt(tmp_path / "m", TINY, variables=set(disc) - set(layer1))
    assert source.inspect_tf1(prefix).missing == layer1


def test_shape_mismatch_is_refused(tmp_path):
    _, prefix, arrays = _ckpt(tmp_path, TINY)
    arrays["electra/encoder/layer_1/intermediate/dense/kernel"] = np.zeros((32, 65), np.float32)
    bad = checkpoints.write_tf1(arrays, str(tmp_path / "bad" / "model.ckpt"))
    with pytest.raises(formats.ConvertError) as e:
        source.inspect_tf1(bad)
    msg = str(e.value)
    assert "layer_1/intermediate/dense/kernel" in msg and "[32, 65]" in msg and "[32, 64]" in msg
    assert "\n" not in msg
    assert convert.main(["inspect", bad]) == 1


def test_tf1_to_model_dir_resumes_and_exports_back(tmp_path):
    from electra_tf.configs import load_config
    from runtimes import tf_pretrainer
    model, _, arrays = _ckpt(tmp_path, TINY)
    arrays["global_step"] = np.int64(77)
    m = "electra/encoder/layer_0/output/dense/kernel/adam_m"
    arrays[m] = np.full((64, 32), 0.5, np.float32)
    prefix = checkpoints.write_tf1(arrays, str(tmp_path / "src" / "model.ckpt"))
    out = str(tmp_path / "run")
    report, path = model_dir.tf1_to_model_dir(prefix, out, overrides="num_train_steps=100")
    assert path.endswith("ckpt-77") and report.global_step == 77
    with pytest.raises(formats.ConvertError, match="already holds"):
        model_dir.tf1_to_model_dir(prefix, out)

    # exactly what electra_tf.pretraining.pretrain.run does on resume
    cfg = load_config(os.path.join(out, "config.json"))
    assert cfg.model == report.config and cfg.train.num_train_steps == 100
    assert cfg.train.max_seq_length == TINY.max_position_embeddings
    trainer = tf_pretrainer(cfg, tf.distribute.get_strategy())
    ckpt = trainer.checkpoint()  # the object graph train.run restores
    ckpt.restore(tf.train.latest_checkpoint(out)).assert_existing_objects_matched()
    assert int(trainer.global_step.numpy()) == 77
    got = released_arrays(trainer.model)
    for name, value in released_arrays(model).items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    slots = {k.replace("electra_pretraining/", ""): v
             for k, v in trainer.optimizer.slot_variables().items()}
    np.testing.assert_array_equal(slots[m].numpy(), arrays[m])

    # export-tf1: official names, values equal, readable by load_checkpoint
    back = str(tmp_path / "back" / "model.ckpt")
    assert convert.main(["export-tf1", out, back, "--include_optimizer"]) == 0
    reader = tf.train.load_checkpoint(back)
    assert int(reader.get_tensor("global_step")) == 77
    np.testing.assert_array_equal(reader.get_tensor(m), arrays[m])
    for name in formats.expected_shapes(TINY):
        np.testing.assert_array_equal(reader.get_tensor(name), arrays[name], err_msg=name)
    assert not source.inspect_tf1(back).missing


@pytest.mark.parametrize("config", [
    TINY, WIDE, ModelConfig(**{**TINY.__dict__, "tie_embeddings": False})])
def test_hf_round_trip(tmp_path, config):
    model = ElectraPretrainingModel(config)
    arrays = released_arrays(model)
    disc = formats.export_hf(arrays, config, str(tmp_path / "d"))
    gen = formats.export_hf(arrays, config, str(tmp_path / "g"), "generator")
    from safetensors.numpy import load_file
    d = load_file(os.path.join(disc, "model.safetensors"))
    g = load_file(os.path.join(gen, "model.safetensors"))
    q = "electra.encoder.layer.1.attention.self.query.weight"
    np.testing.assert_array_equal(
        d[q], arrays["electra/encoder/layer_1/attention/self/query/kernel"].T)
    np.testing.assert_array_equal(
        d["discriminator_predictions.dense_prediction.weight"],
        arrays["discriminator_predictions/dense_1/kernel"].T)
    assert d["discriminator_predictions.dense_prediction.weight"].shape == (1, config.hidden_size)
    np.testing.assert_array_equal(g["generator_lm_head.weight"],
                                  g["electra.embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(g["generator_lm_head.bias"],
                                  arrays["generator_predictions/output_bias"])
    assert g[q].shape == (config.generator_hidden,) * 2
    assert ("electra.embeddings_project.weight" in d) == (config.embedding_size !=
                                                           config.hidden_size)
    with open(os.path.join(disc, "config.json")) as f:
        hc = json.load(f)
    assert hc["model_type"] == "electra" and hc["architectures"] == ["ElectraForPreTraining"]
    assert hc["embedding_size"] == config.embedding_size and hc["hidden_act"] == "gelu"
    assert hc["layer_norm_eps"] == 1e-12

    got_config, got, unmapped = formats.import_hf(disc, gen)
    assert got_config == config and not unmapped
    assert sorted(got) == sorted(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)

    # discriminator alone
    _, only, _ = formats.import_hf(disc)
    assert sorted(only) == sorted(formats.expected_shapes(config, generator=False))


def test_hf_config_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    arrays = released_arrays(ElectraPretrainingModel(WIDE))
    out = formats.export_hf(arrays, WIDE, str(tmp_path / "g"), "generator")
    hc = transformers.ElectraConfig.from_pretrained(out)
    assert (hc.hidden_size, hc.embedding_size, hc.num_attention_heads,
            hc.intermediate_size) == (128, 32, 2, 96)


def test_cli_export_and_import_hf(tmp_path, capsys):
    _, prefix, arrays = _ckpt(tmp_path, TINY)
    out = str(tmp_path / "hf")
    assert convert.main(["export-hf", prefix, out]) == 0
    back = str(tmp_path / "back" / "model.ckpt")
    assert convert.main(["import-hf", os.path.join(out, "discriminator"), back,
                         "--generator_dir", os.path.join(out, "generator")]) == 0
    reader = tf.train.load_checkpoint(back)
    for name, value in arrays.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value, err_msg=name)


def test_conversions_on_ram_filesystem(tmp_path, monkeypatch, capsys):
    """Every conversion with its paths on TensorFlow's in-memory filesystem: TF1 -> HF
    directories (bytes equal to a local export) -> TF1 (tensors equal, state file
    written), TF1 -> our model_dir -> HF and TF1; nothing local named after the path."""
    import uuid

    from electra_tf import fileio
    monkeypatch.chdir(tmp_path)
    root = f"ram://convert_{uuid.uuid4().hex}"
    model = ElectraPretrainingModel(TINY)
    arrays = released_arrays(model)
    arrays["global_step"] = np.int64(12)
    prefix = checkpoints.write_tf1(arrays, f"{root}/src/model.ckpt")
    assert tf.train.latest_checkpoint(f"{root}/src") == prefix
    assert convert.main(["inspect", prefix]) == 0
    assert f"mapped variables: {len(arrays) - 1}\n" in capsys.readouterr().out
    assert convert.main(["export-hf", prefix, f"{root}/hf"]) == 0
    local = {part: formats.export_hf(arrays, TINY, str(tmp_path / "local" / part), part)
             for part in ("discriminator", "generator")}
    for part, local_dir in local.items():
        for name in ("model.safetensors", "config.json"):
            with open(os.path.join(local_dir, name), "rb") as f:
                assert fileio.read_bytes(f"{root}/hf/{part}/{name}") == f.read(), name
    assert formats.is_hf_dir(f"{root}/hf/discriminator") and not formats.is_hf_dir(prefix)
    assert source.resolve(f"{root}/hf/discriminator").config.hidden_size == 32

    back = f"{root}/back/model.ckpt"
    assert convert.main(["import-hf", f"{root}/hf/discriminator", back, "--generator_dir",
                         f"{root}/hf/generator"]) == 0
    assert tf.train.latest_checkpoint(f"{root}/back") == back
    got = checkpoints.read_tf1(f"{root}/back")
    assert sorted(got) == sorted(k for k in arrays if k != "global_step")
    for name, value in got.items():
        np.testing.assert_array_equal(value, arrays[name], err_msg=name)

    report, path = model_dir.tf1_to_model_dir(prefix, f"{root}/run")
    assert path == f"{root}/run/ckpt-12" and report.global_step == 12
    assert fileio.read_json(f"{root}/run/config.json")["model"]["hidden_size"] == 32
    assert convert.main(["export-tf1", f"{root}/run", f"{root}/tf1/model.ckpt"]) == 0
    again = checkpoints.read_tf1(f"{root}/tf1/model.ckpt")
    assert sorted(again) == sorted(arrays)
    for name, value in again.items():
        np.testing.assert_array_equal(value, arrays[name], err_msg=name)
    assert convert.main(["export-hf", f"{root}/run", f"{root}/hf2"]) == 0
    assert fileio.read_bytes(f"{root}/hf2/generator/model.safetensors") == \
        fileio.read_bytes(f"{root}/hf/generator/model.safetensors")
    with pytest.raises(formats.ConvertError, match=f"cannot read Hugging Face directory "
                       f"{root}/run: model.safetensors: No such file or directory"):
        formats.import_hf(f"{root}/run")
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("ram:")]


def test_transformers_parity(tmp_path):
    torch = pytest.importorskip("torch")
    import transformers
    model = ElectraPretrainingModel(WIDE)
    out = formats.export_hf(released_arrays(model), WIDE, str(tmp_path / "d"))
    hf = transformers.ElectraForPreTraining.from_pretrained(out).eval()
    ids = np.array([[2, 5, 7, 9, 1, 3]], np.int32)
    seg = np.array([[0, 0, 0, 1, 1, 1]], np.int32)
    mask = np.array([[1, 1, 1, 1, 1, 0]], np.int32)
    ours = model.discriminator(ids, mask, seg).numpy()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    token_type_ids=torch.tensor(seg, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours[mask == 1], theirs[mask == 1], atol=1e-4)


def _inputs():
    ids = np.array([[2, 5, 7, 9, 1, 3], [4, 4, 8, 1, 0, 0]], np.int32)
    seg = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]], np.int32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int32)
    return ids, seg, mask


def _torch_inputs(torch):
    ids, seg, mask = _inputs()
    as_torch = {"input_ids": torch.tensor(ids, dtype=torch.long),
                "attention_mask": torch.tensor(mask, dtype=torch.long),
                "token_type_ids": torch.tensor(seg, dtype=torch.long)}
    return ids, seg, mask, as_torch


def test_transformers_generator_parity(tmp_path):
    """Our generator exported as ElectraForMaskedLM: the same MLM logits everywhere."""
    torch = pytest.importorskip("torch")
    import transformers
    model = ElectraPretrainingModel(WIDE)
    out = formats.export_hf(released_arrays(model), WIDE, str(tmp_path / "g"), "generator")
    hf = transformers.ElectraForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    ids, seg, mask, inputs = _torch_inputs(torch)
    positions = np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1))
    ours = model.generator_mlm_logits(ids, mask, seg, positions).numpy()
    with torch.no_grad():
        theirs = hf(**inputs).logits.numpy()
    assert ours.shape == theirs.shape == (2, 6, WIDE.vocab_size)
    np.testing.assert_allclose(ours[mask == 1], theirs[mask == 1], atol=1e-4)


def test_transformers_model_imports_with_the_same_logits(tmp_path):
    """A randomly initialised transformers ElectraForPreTraining, saved with
    save_pretrained and imported: our discriminator gives its logits."""
    torch = pytest.importorskip("torch")
    import transformers
    torch.manual_seed(0)
    hc = transformers.ElectraConfig(vocab_size=40, embedding_size=32, hidden_size=64,
                                    num_hidden_layers=2, num_attention_heads=1,
                                    intermediate_size=96, max_position_embeddings=16,
                                    type_vocab_size=2)
    hf = transformers.ElectraForPreTraining(hc).eval()
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    config, arrays, unmapped = formats.import_hf(str(tmp_path / "hf"))
    assert (config.hidden_size, config.embedding_size, config.num_hidden_layers) == (64, 32, 2)
    model = ElectraPretrainingModel(config)
    checkpoints.assign_arrays(model, arrays, allow_missing=True)  # no generator in this dir
    ids, seg, mask, inputs = _torch_inputs(torch)
    with torch.no_grad():
        theirs = hf(**inputs).logits.numpy()
    ours = model.discriminator(ids, mask, seg).numpy()
    np.testing.assert_allclose(ours[mask == 1], theirs[mask == 1], atol=1e-4)


def test_transformers_bert_as_our_encoder(tmp_path):
    """A transformers BertModel saved to a directory and loaded as the fine-tuning encoder
    gives BERT's sequence output."""
    torch = pytest.importorskip("torch")
    import transformers
    from electra_tf.finetune.model import init_encoder
    from electra_tf.model.modeling import build_discriminator_encoder
    torch.manual_seed(1)
    hc = transformers.BertConfig(vocab_size=40, hidden_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=96,
                                 max_position_embeddings=16, type_vocab_size=2)
    bert = transformers.BertModel(hc).eval()
    bert.save_pretrained(str(tmp_path / "bert"), safe_serialization=True)
    src = source.resolve(str(tmp_path / "bert"))
    encoder = build_discriminator_encoder(src.config)
    init_encoder(encoder, str(tmp_path / "bert"))
    ignored = src.ignored
    assert any("pooler" in n for n in ignored)
    ids, seg, mask, inputs = _torch_inputs(torch)
    with torch.no_grad():
        theirs = bert(**inputs).last_hidden_state.numpy()
    ours = encoder(ids, mask, seg).numpy()
    np.testing.assert_allclose(ours[mask == 1], theirs[mask == 1], atol=1e-4)


# transformers 5.x dropped its TF-checkpoint loader; 4.x lives in a side directory that
# only a subprocess puts on its path (tests/legacy-transformers.txt), installed there by the
# fixture below on first use (once per virtual environment).
LEGACY_TRANSFORMERS = os.path.join(sys.prefix, "legacy-transformers")
LEGACY_REQUIREMENTS = os.path.join(REPO, "tests", "legacy-transformers.txt")
# pip's messages when the package registry cannot be reached (the one reason to skip).
_OFFLINE = ("Could not find a version that satisfies", "No matching distribution",
            "NewConnectionError", "Failed to establish a new connection",
            "Temporary failure in name resolution", "Network is unreachable")


def _legacy_transformers_ready() -> bool:
    return os.path.isdir(os.path.join(LEGACY_TRANSFORMERS, "transformers"))


@pytest.fixture(scope="session")
def legacy_transformers():
    """The side directory holding transformers 4.x, installed with pip on first use into
    a temporary sibling renamed into place (an interrupted install leaves nothing that
    looks complete). Skips only when the package registry cannot be reached."""
    if _legacy_transformers_ready():
        return LEGACY_TRANSFORMERS
    staging = f"{LEGACY_TRANSFORMERS}.{os.getpid()}.tmp"  # local test scaffolding
    shutil.rmtree(staging, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--disable-pip-version-check", "--target", staging,
                           "-r", LEGACY_REQUIREMENTS], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        if any(needle in proc.stderr for needle in _OFFLINE):
            pytest.skip("transformers 4.x could not be installed (package registry "
                        f"unreachable): {proc.stderr.strip().splitlines()[-1]}")
        raise AssertionError(f"pip install -r {LEGACY_REQUIREMENTS} failed:\n"
                             f"{proc.stderr[-3000:]}")
    try:
        os.rename(staging, LEGACY_TRANSFORMERS)
    except OSError:  # another test process finished the same install first
        shutil.rmtree(staging, ignore_errors=True)
    assert _legacy_transformers_ready(), LEGACY_TRANSFORMERS
    return LEGACY_TRANSFORMERS
_LEGACY_LOAD = r"""
import contextlib, io, json, sys
import torch
import transformers
from safetensors.torch import save_file
from transformers.models.electra.modeling_electra import load_tf_weights_in_electra
job = json.loads(sys.argv[1])
assert transformers.__version__.startswith("4."), transformers.__version__
feed = {k: torch.tensor(job[k], dtype=torch.long)
        for k in ("input_ids", "attention_mask", "token_type_ids")}
for part, hf_dir, out in job["parts"]:
    config = transformers.ElectraConfig.from_json_file(hf_dir + "/config.json")
    config._attn_implementation = "eager"
    cls = (transformers.ElectraForMaskedLM if part == "generator"
           else transformers.ElectraForPreTraining)
    model = cls(config)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # the loader print()s what it loads and skips
        load_tf_weights_in_electra(model, config, job["checkpoint"], part)
    loaded = [l.split()[-1] for l in log.getvalue().splitlines()
              if l.startswith("Initialize PyTorch weight ")]
    skipped = [l.split()[1] for l in log.getvalue().splitlines() if l.startswith("Skipping ")]
    model.eval()
    with torch.no_grad():
        logits = model(**feed).logits
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
              out + ".safetensors")
    with open(out + ".json", "w") as f:
        json.dump({"loaded": loaded, "skipped": skipped, "logits": logits.tolist()}, f)
"""


@pytest.mark.subprocess
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_tf1_export_loads_in_transformers_tf_loader(tmp_path, legacy_transformers):
    """Our TF1 export (the CLI's export-tf1 from a training model_dir, Adam slots included)
    read by transformers 4.x's own load_tf_weights_in_electra: every weight of
    ElectraForPreTraining / ElectraForMaskedLM found, the same tensors as our safetensors
    export, and the same discriminator and MLM logits as our model."""
    model, prefix, arrays = _ckpt(tmp_path / "src", WIDE)
    model_dir.tf1_to_model_dir(prefix, str(tmp_path / "run"))
    ckpt = str(tmp_path / "tf1" / "model.ckpt")
    assert convert.main(["export-tf1", str(tmp_path / "run"), ckpt, "--include_optimizer"]) == 0
    in_ckpt = set(tf.train.load_checkpoint(ckpt).get_variable_to_shape_map())
    assert any(n.endswith("/adam_m") for n in in_ckpt) and "global_step" in in_ckpt

    ids, seg, mask = _inputs()
    parts = [(part, formats.export_hf(arrays, WIDE, str(tmp_path / part), part),
              str(tmp_path / f"legacy_{part}")) for part in ("discriminator", "generator")]
    job = {"checkpoint": ckpt, "parts": parts, "input_ids": ids.tolist(),
           "attention_mask": mask.tolist(), "token_type_ids": seg.tolist()}
    env = dict(os.environ, USE_TF="0", USE_TORCH="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(
                   p for p in (legacy_transformers, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", _LEGACY_LOAD, json.dumps(job)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

    from safetensors.numpy import load_file
    positions = np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1))
    ours = {"discriminator": model.discriminator(ids, mask, seg).numpy(),
            "generator": model.generator_mlm_logits(ids, mask, seg, positions).numpy()}
    for part, hf_dir, out in parts:
        with open(out + ".json") as f:
            got = json.load(f)
        # every weight of this network loaded, once; all else skipped by the loader
        needed = set(formats.hf_name_map(WIDE, part))
        assert sorted(got["loaded"]) == sorted(needed), part
        assert set(got["skipped"]) == in_ckpt - needed - {"global_step"}, part
        # the same tensors as our safetensors export (whose keys are the model's own)
        theirs, expected = load_file(out + ".safetensors"), load_file(
            os.path.join(hf_dir, "model.safetensors"))
        assert sorted(theirs) == sorted(expected), part
        for key, value in expected.items():
            np.testing.assert_array_equal(theirs[key], value, err_msg=f"{part} {key}")
        logits = np.asarray(got["logits"], np.float32)
        assert logits.shape == ours[part].shape, part
        np.testing.assert_allclose(ours[part][mask == 1], logits[mask == 1], atol=1e-4,
                                   err_msg=part)


def _gdes_model():
    """A GDES model whose deltas are not zero (as after training)."""
    config = dataclasses.replace(TINY, disentangled_embeddings=True)
    model = ElectraPretrainingModel(config)
    for i, delta in enumerate(model.embeddings.deltas):
        delta.assign(tf.random.stateless_normal(delta.shape, [5, i], stddev=0.05))
    return config, model


def test_gdes_exports_fold_the_deltas_into_the_released_layout(tmp_path):
    """TF1 and Hugging Face exports of a GDES model hold the tables the discriminator
    computes with (generator table + delta) under the untied layout's names; the
    discriminator alone reloads into a plain encoder (what fine-tuning builds) with the
    same outputs, and the generator keeps its own tables."""
    torch = pytest.importorskip("torch")
    import transformers
    from electra_tf.model import modeling
    config, model = _gdes_model()
    assert config.released() == dataclasses.replace(config, tie_embeddings=False,
                                                    disentangled_embeddings=False)
    arrays = released_arrays(model)
    assert set(arrays) == set(formats.expected_shapes(config.released()))
    assert not any(n.endswith("_delta") for n in arrays)
    gen_table = model.generator.embeddings.word_embeddings.numpy()
    np.testing.assert_array_equal(arrays["generator/embeddings/word_embeddings"], gen_table)
    np.testing.assert_allclose(arrays["electra/embeddings/word_embeddings"],
                               gen_table + model.embeddings.deltas[0].numpy(), rtol=1e-6)
    ids, seg, mask = _inputs()
    ours = model.discriminator(ids, mask, seg).numpy()
    # TF1, discriminator only -> the encoder fine-tuning builds.
    prefix = checkpoints.save_tf1_checkpoint(model, str(tmp_path / "disc" / "model.ckpt"),
                                             modeling.discriminator_variables(model))
    encoder = modeling.build_discriminator_encoder(config.released())
    checkpoints.assign_arrays(encoder, checkpoints.read_tf1(prefix))
    np.testing.assert_allclose(encoder(ids, mask, seg).numpy(),
                               model.discriminator_hidden(ids, mask, seg).numpy(), atol=1e-5)
    # A full export loads into an untied model with the same discriminator and generator.
    untied = ElectraPretrainingModel(config.released())
    checkpoints.assign_arrays(untied, arrays)
    np.testing.assert_allclose(untied.discriminator(ids, mask, seg).numpy(), ours, atol=1e-5)
    # Hugging Face.
    out = formats.export_hf(arrays, config.released(), str(tmp_path / "hf"))
    hf = transformers.ElectraForPreTraining.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf(**_torch_inputs(torch)[3]).logits.numpy()
    np.testing.assert_allclose(ours[mask == 1], theirs[mask == 1], atol=1e-4)
