"""keras-hub ELECTRA presets (`ElectraBackbone`) <-> {TF1 name: array}, through Hugging Face's
names (keras-hub's layers renamed; kernels reshaped on the heads axis). An optional extra,
imported lazily; its GELU is the tanh approximation (README)."""

import os
from typing import Dict, List, Tuple

import numpy as np

from electra_tf import fileio, text
from electra_tf.configs import ModelConfig
from electra_tf.conversion import formats
from electra_tf.conversion.formats import ConvertError
from electra_tf.training import checkpoints

BACKBONE = "keras_hub>ElectraBackbone"
VOCAB_ASSET = os.path.join("assets", "tokenizer", "vocabulary.txt")
# {ElectraBackbone argument: transformers config.json key}
HUB_CONFIG = {"vocab_size": "vocab_size", "num_layers": "num_hidden_layers",
              "num_heads": "num_attention_heads", "hidden_dim": "hidden_size",
              "embedding_dim": "embedding_size", "intermediate_dim": "intermediate_size",
              "dropout": "hidden_dropout_prob", "max_sequence_length": "max_position_embeddings",
              "num_segments": "type_vocab_size"}


def keras_hub_module():
    try:
        import keras_hub
    except ImportError:
        raise ConvertError('keras-hub is not installed: pip install -e ".[keras-hub]"') from None
    return keras_hub


def hub_variables(backbone) -> Dict[str, object]:
    """{Hugging Face name under `electra.`: variable} of an ElectraBackbone's encoder."""
    get, out = backbone.get_layer, {}

    def put(key, layer, attrs=("kernel", "bias")):
        out[key + ".weight"], out[key + ".bias"] = (getattr(layer, a) for a in attrs)

    out["embeddings.word_embeddings.weight"] = get("token_embedding").embeddings
    out["embeddings.position_embeddings.weight"] = get("position_embedding").position_embeddings
    out["embeddings.token_type_embeddings.weight"] = get("segment_embedding").embeddings
    put("embeddings.LayerNorm", get("embeddings_layer_norm"), ("gamma", "beta"))
    if backbone.hidden_dim != backbone.embedding_dim:
        put("embeddings_project", get("embeddings_projection"))
    for i in range(backbone.num_layers):
        block, p = get(f"transformer_layer_{i}"), f"encoder.layer.{i}."
        attn = block._self_attention_layer
        for name in ("query", "key", "value"):
            put(p + "attention.self." + name, getattr(attn, name + "_dense"))
        put(p + "attention.output.dense", attn.output_dense)
        put(p + "attention.output.LayerNorm", block._self_attention_layer_norm, ("gamma", "beta"))
        put(p + "intermediate.dense", block._feedforward_intermediate_dense)
        put(p + "output.dense", block._feedforward_output_dense)
        put(p + "output.LayerNorm", block._feedforward_layer_norm, ("gamma", "beta"))
    return out


def encoder_names(config: ModelConfig, part: str) -> Dict[str, str]:
    """{Hugging Face name under `electra.`: TF1 name} of `part`'s encoder."""
    return {key: name for name, (key, _) in formats.hf_encoder_map(config, part).items()}


def _vocab(path: str, lower: bool, what: str) -> Tuple[text.VocabInfo, List[str]]:
    try:
        return text.vocab_info(path, do_lower_case=lower), text.read_wordpiece_vocab(path)
    except text.VocabError as e:
        raise ConvertError(f"{what}: {str(e).split(': ', 1)[-1]}") from None


def _write_new_dir(out: str, write, last: str = "config.json") -> str:
    """Runs `write(local)` in a local staging directory (keras-hub's savers write local
    files), then copies it to `out` (any filesystem, gs:// too) with `last` copied last: a
    failure before the copy leaves nothing at `out`."""
    if fileio.isdir(out) and fileio.listdir(out):
        raise ConvertError(f"OUT {out}: exists and is not empty")
    with fileio.local_staging_dir(".keras-hub-") as tmp:
        write(tmp)
        fileio.copy_tree(tmp, out, last=[last])
    return out


def export_keras_hub(arrays: Dict[str, np.ndarray], config: ModelConfig, vocab_file: str,
                     out: str, part: str = "discriminator", lower: bool = True) -> str:
    """`part`'s encoder -> a keras-hub preset at `out` (ElectraBackbone + ElectraTokenizer).
    `pooled_dense` (ELECTRA has no pooler) is written as the identity with zero bias, so
    `pooled_output` is tanh of the [CLS] vector ELECTRA's classifiers read: the closest
    thing to ELECTRA's own feature, rather than a random or an all-zero one."""
    info, tokens = _vocab(vocab_file, lower, f"--vocab_file {vocab_file}")
    if info.vocab_size != config.vocab_size:
        raise ConvertError(f"--vocab_file {vocab_file}: {info.vocab_size} tokens but the model "
                           f"has vocab_size={config.vocab_size}")
    if config.layer_norm_eps != 1e-12:
        raise ConvertError(f"layer_norm_eps={config.layer_norm_eps}: keras-hub's ElectraBackbone "
                           "fixes it at 1e-12")
    hub, hf = keras_hub_module(), formats.hf_config(config, part)
    backbone = hub.models.ElectraBackbone(**{k: hf[key] for k, key in HUB_CONFIG.items()})
    names = encoder_names(config, part)
    for key, variable in hub_variables(backbone).items():
        if names[key] not in arrays:
            raise ConvertError(f"{names[key]} is needed for the {part} export but missing")
        variable.assign(np.reshape(arrays[names[key]], variable.shape))
    pooled = backbone.get_layer("pooled_dense")
    pooled.kernel.assign(np.eye(hf["hidden_size"], dtype=np.float32))
    pooled.bias.assign(np.zeros(hf["hidden_size"], np.float32))
    tokenizer = hub.models.ElectraTokenizer(vocabulary=tokens, lowercase=lower,
                                            strip_accents=lower)

    def write(tmp):
        backbone.save_to_preset(tmp)
        tokenizer.save_to_preset(tmp)
    return _write_new_dir(out, write)


def is_preset_dir(path: str) -> bool:
    """A keras-hub preset directory: metadata.json beside a config.json naming a
    registered keras-hub class (an ELECTRA one or not: `import_keras_hub` says which)."""
    try:
        if not (fileio.isdir(path) and fileio.isfile(fileio.join(path, "metadata.json"))):
            return False
        return "registered_name" in fileio.read_json(fileio.join(path, "config.json"))
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def import_keras_hub(preset: str) -> Tuple[ModelConfig, Dict[str, np.ndarray], bool]:
    """A keras-hub ELECTRA preset -> (ModelConfig, {TF1 name: array} of the encoder `electra/...`,
    the tokenizer's lowercase); the pooler is dropped, every file checked before reading."""
    cfg_path = fileio.join(preset, "config.json")
    try:
        name = fileio.read_json(cfg_path).get("registered_name")
    except (OSError, ValueError, AttributeError) as e:
        raise ConvertError(f"{cfg_path}: not a keras-hub preset ({fileio.error_reason(e)})") \
            from None
    if name != BACKBONE:
        raise ConvertError(f"{cfg_path}: registered_name {name!r} is not {BACKBONE} "
                           "(not an ELECTRA preset)")
    for need in ("model.weights.h5", "tokenizer.json", VOCAB_ASSET):
        if not fileio.isfile(fileio.join(preset, need)):
            raise ConvertError(f"{fileio.join(preset, need)}: missing from the preset")
    hub = keras_hub_module()
    tokenizer = fileio.read_json(fileio.join(preset, "tokenizer.json"))
    lower = bool(tokenizer.get("config", {}).get("lowercase", False))
    vocab = fileio.join(preset, VOCAB_ASSET)
    _vocab(vocab, lower, vocab)
    if fileio.is_remote(preset):  # keras-hub reads presets from local files
        with fileio.local_staging_dir(".keras-hub-") as local:
            fileio.copy_tree(preset, local)
            backbone = hub.models.ElectraBackbone.from_preset(local)
    else:
        backbone = hub.models.ElectraBackbone.from_preset(preset)
    c = backbone.get_config()
    config = formats.hf_model_config(dict(
        {key: c[k] for k, key in HUB_CONFIG.items()},
        attention_probs_dropout_prob=c["dropout"]), preset)
    names, shapes = encoder_names(config, "discriminator"), formats.expected_shapes(config, False)
    arrays = {names[key]: np.reshape(v.numpy(), shapes[names[key]]).astype(np.float32)
              for key, v in hub_variables(backbone).items()}
    return config, arrays, lower


def write_imported(preset: str, arrays: Dict[str, np.ndarray], out: str) -> str:
    """`out`/model.ckpt (TF1 names, the released layout) and `out`/vocab.txt."""
    def write(tmp):
        checkpoints.write_tf1(arrays, os.path.join(tmp, "model.ckpt"))
        fileio.copy(fileio.join(preset, VOCAB_ASSET), os.path.join(tmp, "vocab.txt"))
    return fileio.join(_write_new_dir(out, write, last="model.ckpt.index"), "model.ckpt")
