"""The expected TF1 names and shapes of a model, its config inferred from them, and Hugging
Face `transformers` directories (safetensors, no torch) <-> {TF1 name: numpy array}: since
our variable paths are the TF1 names (modeling.py), a name map plus kernel transposes."""

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from electra_tf import fileio
from electra_tf.configs import (ConfigError, ModelConfig, PretrainingConfig, apply_overrides,
                                load_config, parse_overrides)

SLOT_SUFFIXES = ("/adam_m", "/adam_v")
_LAYER_RE = re.compile(r"^(electra|generator)/encoder/layer_(\d+)/")


class ConvertError(ValueError):
    """A checkpoint that cannot be converted; the message is one line."""


# --- expected names and shapes --------------------------------------------------------

def _embedding_shapes(scope: str, c: ModelConfig) -> Dict[str, tuple]:
    e = c.embedding_size
    return {f"{scope}/embeddings/word_embeddings": (c.vocab_size, e),
            f"{scope}/embeddings/position_embeddings": (c.max_position_embeddings, e),
            f"{scope}/embeddings/token_type_embeddings": (c.type_vocab_size, e),
            f"{scope}/embeddings/LayerNorm/gamma": (e,),
            f"{scope}/embeddings/LayerNorm/beta": (e,)}


def _encoder_shapes(scope: str, c: ModelConfig, hidden: int, layers: int,
                    intermediate: int) -> Dict[str, tuple]:
    out = {}
    if c.embedding_size != hidden:
        out[f"{scope}/embeddings_project/kernel"] = (c.embedding_size, hidden)
        out[f"{scope}/embeddings_project/bias"] = (hidden,)
    for i in range(layers):
        p = f"{scope}/encoder/layer_{i}"
        for d in ("attention/self/query", "attention/self/key", "attention/self/value",
                  "attention/output/dense"):
            out[f"{p}/{d}/kernel"] = (hidden, hidden)
            out[f"{p}/{d}/bias"] = (hidden,)
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            out[f"{p}/{ln}/gamma"] = (hidden,)
            out[f"{p}/{ln}/beta"] = (hidden,)
        out[f"{p}/intermediate/dense/kernel"] = (hidden, intermediate)
        out[f"{p}/intermediate/dense/bias"] = (intermediate,)
        out[f"{p}/output/dense/kernel"] = (intermediate, hidden)
        out[f"{p}/output/dense/bias"] = (hidden,)
    return out


def expected_shapes(c: ModelConfig, generator: bool = True) -> Dict[str, tuple]:
    """{TF1 name: shape} of every trainable variable of `ElectraPretrainingModel(c)`
    (without the generator and its head when `generator` is False)."""
    h = c.hidden_size
    out = _embedding_shapes("electra", c)
    out.update(_encoder_shapes("electra", c, h, c.num_hidden_layers, c.intermediate_size))
    out.update({"discriminator_predictions/dense/kernel": (h, h),
                "discriminator_predictions/dense/bias": (h,),
                "discriminator_predictions/dense_1/kernel": (h, 1),
                "discriminator_predictions/dense_1/bias": (1,)})
    if not generator:
        return out
    gh = c.generator_hidden
    if not c.tie_all_weights:
        if not c.tie_embeddings:
            out.update(_embedding_shapes("generator", c))
        out.update(_encoder_shapes("generator", c, gh, c.generator_num_layers,
                                   c.generator_intermediate))
    e = c.embedding_size
    out.update({"generator_predictions/dense/kernel": (gh, e),
                "generator_predictions/dense/bias": (e,),
                "generator_predictions/LayerNorm/gamma": (e,),
                "generator_predictions/LayerNorm/beta": (e,),
                "generator_predictions/output_bias": (c.vocab_size,)})
    return out


# --- a model from its shapes ---------------------------------------------------------

def _num_layers(shapes, scope: str) -> int:
    ids = [int(m.group(2)) for m in map(_LAYER_RE.match, shapes) if m and m.group(1) == scope]
    return max(ids) + 1 if ids else 0


def _need(shapes, name: str) -> List[int]:
    if name not in shapes:
        raise ConvertError(f"cannot infer the model: {name} is not in the checkpoint")
    return list(shapes[name])


def infer_model_config(shapes: Dict[str, List[int]],
                       num_heads: Optional[int] = None) -> Tuple[ModelConfig, bool]:
    """(ModelConfig, has_generator) from {TF1 name: shape}; heads hidden // 64 as officially
    unless `num_heads` is given (the generator's: ModelConfig.generator_heads)."""
    vocab, emb = _need(shapes, "electra/embeddings/word_embeddings")
    layers = _num_layers(shapes, "electra")
    if not layers:
        raise ConvertError("cannot infer the model: no electra/encoder/layer_N variables")
    hidden = _need(shapes, "electra/encoder/layer_0/attention/self/query/kernel")[1]
    fields = dict(
        vocab_size=vocab, embedding_size=emb, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=num_heads or max(1, hidden // 64),
        intermediate_size=_need(shapes, "electra/encoder/layer_0/intermediate/dense/kernel")[1],
        max_position_embeddings=_need(shapes, "electra/embeddings/position_embeddings")[0],
        type_vocab_size=_need(shapes, "electra/embeddings/token_type_embeddings")[0])
    has_encoder = any(n.startswith("generator/") for n in shapes)
    has_head = any(n.startswith("generator_predictions/") for n in shapes)
    if has_encoder:
        gl = _num_layers(shapes, "generator")
        gh = _need(shapes, "generator/encoder/layer_0/attention/self/query/kernel")[1]
        gi = _need(shapes, "generator/encoder/layer_0/intermediate/dense/kernel")[1]
        mult = gh / hidden
        if int(round(fields["intermediate_size"] * mult)) != gi:
            raise ConvertError(f"generator FFN size {gi} is not {gh}/{hidden} of the "
                               f"discriminator's {fields['intermediate_size']}")
        fields.update(generator_hidden_size=mult, generator_layers=gl / layers,
                      tie_embeddings="generator/embeddings/word_embeddings" not in shapes)
    elif has_head:  # one encoder for both (tie_all_weights)
        fields.update(generator_hidden_size=1.0, generator_layers=1.0, tie_all_weights=True)
    config = ModelConfig(**fields)
    try:
        config.check()
    except ConfigError as e:
        raise ConvertError(f"inferred config is invalid: {e}") from None
    return config, has_encoder or has_head


@dataclasses.dataclass
class Report:
    """What a TF1 checkpoint holds relative to the model its shapes describe."""
    config: ModelConfig
    has_generator: bool
    mapped: List[str]
    missing: List[str]
    unmapped: List[str]
    slots: List[str]
    global_step: Optional[int]

    def lines(self) -> List[str]:
        step = self.global_step if self.global_step is not None else "absent"
        return ["model config (inferred):",
                *(f"  {k}: {v}" for k, v in dataclasses.asdict(self.config).items()),
                f"generator: {'present' if self.has_generator else 'absent'}",
                f"mapped variables: {len(self.mapped)}",
                f"optimizer slots (ignored unless imported): {len(self.slots)}",
                f"global_step: {step}",
                f"missing ({len(self.missing)}): {', '.join(self.missing) or '-'}",
                f"unmapped ({len(self.unmapped)}): {', '.join(self.unmapped) or '-'}"]


# --- a pre-training config around an inferred model --------------------------------

def pretraining_config(model: ModelConfig, base: Optional[str] = None,
                       overrides: Optional[str] = None) -> PretrainingConfig:
    """`model` with the other sections from preset/JSON `base` (default: the defaults);
    max_seq_length is capped at the model's positions."""
    cfg = load_config(base, None) if base else PretrainingConfig()
    cfg = dataclasses.replace(cfg, model=model)
    if cfg.train.max_seq_length > model.max_position_embeddings:
        cfg = apply_overrides(cfg, {"train.max_seq_length": model.max_position_embeddings})
    if overrides:
        cfg = apply_overrides(cfg, parse_overrides(overrides))
    try:
        return cfg.check()
    except ConfigError as e:
        raise ConvertError(str(e)) from None


# --- Hugging Face transformers (safetensors) ------------------------------------------

_LEAF = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}


def _hf_key(rest: str) -> Tuple[str, bool]:
    """'encoder/layer_3/attention/self/query/kernel' -> ('encoder.layer.3.attention.self.
    query.weight', transpose?)."""
    parts = rest.split("/")
    leaf = parts.pop()
    parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in parts]
    if leaf.endswith("_embeddings"):
        return ".".join(parts + [leaf, "weight"]), False
    return ".".join(parts + [_LEAF[leaf]]), leaf == "kernel"


def hf_name_map(config: ModelConfig, part: str) -> Dict[str, Tuple[str, bool]]:
    """{TF1 name: (transformers parameter name, transpose)} for `part` 'discriminator'
    (ElectraForPreTraining) or 'generator' (ElectraForMaskedLM; `generator_lm_head.weight`,
    tied to the word embeddings, is added by the writer)."""
    gen = part == "generator"
    head = "generator_predictions" if gen else "discriminator_predictions"
    enc = "generator" if gen and not config.tie_all_weights else "electra"
    emb = "generator" if gen and not (config.tie_embeddings or config.tie_all_weights) \
        else "electra"
    out = {}
    for name in expected_shapes(config, generator=gen):
        scope, rest = name.split("/", 1)
        if name == "generator_predictions/output_bias":
            out[name] = ("generator_lm_head.bias", False)
        elif scope == head:
            key, t = _hf_key(rest.replace("dense_1/", "dense_prediction/"))
            out[name] = (f"{head}.{key}", t)
        elif scope == (emb if rest.startswith("embeddings/") else enc):
            key, t = _hf_key(rest)
            out[name] = ("electra." + key, t)
    return out


def hf_encoder_map(config: ModelConfig, part: str) -> Dict[str, Tuple[str, bool]]:
    """{TF1 name: (transformers name under `electra.`, transpose)} of `part`'s encoder."""
    return {name: (key[len("electra."):], t) for name, (key, t) in
            hf_name_map(config, part).items() if key.startswith("electra.")}


def hf_config(config: ModelConfig, part: str) -> Dict:
    gen = part == "generator"  # tie_all_weights: generator_* are the discriminator's sizes
    return {
        "architectures": ["ElectraForMaskedLM" if gen else "ElectraForPreTraining"],
        "model_type": "electra",
        "vocab_size": config.vocab_size,
        "embedding_size": config.embedding_size,
        "hidden_size": config.generator_hidden if gen else config.hidden_size,
        "num_hidden_layers": config.generator_num_layers if gen else config.num_hidden_layers,
        "num_attention_heads": config.generator_heads if gen else config.num_attention_heads,
        "intermediate_size": (config.generator_intermediate if gen
                              else config.intermediate_size),
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.hidden_dropout_prob,
        "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def export_hf(arrays: Dict[str, np.ndarray], config: ModelConfig, out_dir: str,
              part: str = "discriminator") -> str:
    """Writes `out_dir/model.safetensors` and `out_dir/config.json` for `part` (any
    filesystem; config.json, by which `is_hf_dir` recognises the directory, last)."""
    from safetensors.numpy import save
    tensors = {}
    for name, (key, transpose) in hf_name_map(config, part).items():
        if name not in arrays:
            raise ConvertError(f"{name} is needed for the {part} export but missing")
        a = np.asarray(arrays[name], np.float32)
        tensors[key] = np.ascontiguousarray(a.T if transpose else a)
    if part == "generator":
        tensors["generator_lm_head.weight"] = tensors[
            "electra.embeddings.word_embeddings.weight"].copy()
    fileio.makedirs(out_dir)
    fileio.write_atomic(fileio.join(out_dir, "model.safetensors"),
                        save(tensors, metadata={"format": "pt"}))
    fileio.write_json_atomic(fileio.join(out_dir, "config.json"), hf_config(config, part))
    return out_dir


HF_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                     "cls_token": "[CLS]", "mask_token": "[MASK]"}


def write_hf_tokenizer(out_dir: str, vocab_file: str, do_lower_case: bool,
                       config: ModelConfig) -> str:
    """`out_dir`/vocab.txt, tokenizer_config.json and special_tokens_map.json: what
    `AutoTokenizer.from_pretrained(out_dir)` reads to build the ELECTRA (BERT WordPiece)
    tokenizer of `vocab_file`, with the casing the model was trained with."""
    fileio.copy(vocab_file, fileio.join(out_dir, "vocab.txt"))
    fileio.write_json_atomic(fileio.join(out_dir, "special_tokens_map.json"), HF_SPECIAL_TOKENS)
    fileio.write_json_atomic(fileio.join(out_dir, "tokenizer_config.json"), dict(
        HF_SPECIAL_TOKENS, tokenizer_class="ElectraTokenizer", do_lower_case=do_lower_case,
        strip_accents=None, tokenize_chinese_chars=True,
        model_max_length=config.max_position_embeddings))
    return out_dir


def is_hf_dir(path: str) -> bool:
    """A Hugging Face `transformers` model directory: a config.json naming a model_type."""
    cfg = fileio.join(path, "config.json")
    try:
        if not (fileio.isdir(path) and fileio.isfile(cfg)):
            return False
        return "model_type" in fileio.read_json(cfg)
    except (OSError, ValueError, TypeError):
        return False


def _read_hf(path: str, model_types=("electra",)) -> Tuple[Dict, Dict[str, np.ndarray]]:
    from safetensors import SafetensorError
    from safetensors.numpy import load
    weights = fileio.join(path, "model.safetensors")
    if not fileio.exists(weights) and fileio.exists(fileio.join(path, "pytorch_model.bin")):
        raise ConvertError(f"{path} holds pytorch_model.bin, which needs torch to read: convert "
                           "it to model.safetensors (e.g. save_pretrained(..., "
                           "safe_serialization=True))")
    what = "config.json"
    try:
        cfg = fileio.read_json(fileio.join(path, what))
        what = "model.safetensors"  # read as bytes: any filesystem
        tensors = load(fileio.read_bytes(weights))
    except (OSError, ValueError, TypeError, SafetensorError) as e:
        msg = f"{what}: {fileio.error_reason(e)}"
        raise ConvertError(f"cannot read Hugging Face directory {path}: {msg}") from None
    if cfg.get("model_type") not in model_types:
        raise ConvertError(f"{path}: model_type {cfg.get('model_type')!r} is not "
                           f"{' or '.join(model_types)}")
    return cfg, tensors


def hf_model_config(cfg: Dict, path: str = "") -> ModelConfig:
    """The ModelConfig of a transformers ELECTRA or BERT (embedding size = hidden) config."""
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":
        raise ConvertError(f"{path}: hidden_act {act!r} is not supported (the encoder uses "
                           "exact gelu)")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ConvertError(f"{path}: position_embedding_type "
                           f"{cfg['position_embedding_type']!r} is not absolute")
    try:
        h = cfg["hidden_size"]
        return ModelConfig(
            vocab_size=cfg["vocab_size"], embedding_size=cfg.get("embedding_size", h),
            hidden_size=h, num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            hidden_dropout_prob=cfg.get("hidden_dropout_prob", 0.1),
            attention_probs_dropout_prob=cfg.get("attention_probs_dropout_prob", 0.1),
            max_position_embeddings=cfg["max_position_embeddings"],
            type_vocab_size=cfg.get("type_vocab_size", 2),
            initializer_range=cfg.get("initializer_range", 0.02),
            layer_norm_eps=cfg.get("layer_norm_eps", 1e-12))
    except KeyError as e:
        raise ConvertError(f"{path}: config.json has no {e.args[0]}") from None


def _take(tensors: Dict[str, np.ndarray], key: str, transpose: bool, name: str, want,
          where: str) -> np.ndarray:
    """tensors[key] in the TF1 layout of `name`, whose shape must be `want`."""
    if key not in tensors:
        raise ConvertError(f"{where}: {key} (for {name}) is not in model.safetensors")
    a = tensors[key].T if transpose else tensors[key]
    if tuple(a.shape) != tuple(want):
        raise ConvertError(f"{where}: {key} has shape {list(tensors[key].shape)}, config.json "
                           f"implies {list(want[::-1] if transpose else want)}")
    return a


def import_hf_encoder(path: str) -> Tuple[ModelConfig, Dict[str, np.ndarray], List[str]]:
    """A transformers ELECTRA (ElectraForPreTraining / ElectraModel / ...) or BERT (BertModel,
    BertForPreTraining, ...) directory -> (ModelConfig, {TF1 encoder name: array}, ignored
    transformers names: pooler, heads, buffers)."""
    cfg, tensors = _read_hf(path, ("electra", "bert"))
    config = hf_model_config(cfg, path)
    # Older BERT files name LayerNorm parameters gamma / beta.
    tensors = {re.sub(r"(LayerNorm)\.gamma$", r"\1.weight",
                      re.sub(r"(LayerNorm)\.beta$", r"\1.bias", k)): v
               for k, v in tensors.items()}
    module = cfg["model_type"] + "."  # absent from a bare ElectraModel / BertModel
    prefix = module if f"{module}embeddings.word_embeddings.weight" in tensors else ""
    keys = {name: (prefix + key, t)
            for name, (key, t) in hf_encoder_map(config, "discriminator").items()}
    want = expected_shapes(config, generator=False)
    arrays = {name: np.ascontiguousarray(_take(tensors, key, t, name, want[name], path),
                                         dtype=np.float32)
              for name, (key, t) in keys.items()}
    used = {key for key, _ in keys.values()}
    return config, arrays, sorted(k for k in tensors if k not in used)


def import_hf(disc_dir: str, gen_dir: Optional[str] = None
              ) -> Tuple[ModelConfig, Dict[str, np.ndarray], List[str]]:
    """Hugging Face ElectraForPreTraining (+ optional ElectraForMaskedLM) directories ->
    (ModelConfig, {TF1 name: array}, unmapped transformers names)."""
    d, dt = _read_hf(disc_dir)
    fields = dataclasses.asdict(hf_model_config(d, disc_dir))
    parts = [("discriminator", dt, disc_dir)]
    if gen_dir:
        g, gt = _read_hf(gen_dir)
        mult = g["hidden_size"] / d["hidden_size"]
        tied = all(np.array_equal(gt.get(f"electra.embeddings.{k}"),
                                  dt.get(f"electra.embeddings.{k}"))
                   for k in ("word_embeddings.weight", "position_embeddings.weight",
                             "token_type_embeddings.weight", "LayerNorm.weight",
                             "LayerNorm.bias"))
        fields.update(generator_hidden_size=mult,
                      generator_layers=g["num_hidden_layers"] / d["num_hidden_layers"],
                      tie_embeddings=tied)
        parts.append(("generator", gt, gen_dir))
    config = ModelConfig(**fields)
    want = expected_shapes(config, generator=bool(gen_dir))
    arrays, used = {}, {}
    for part, tensors, where in parts:
        names = hf_name_map(config, part)
        for name, (key, t) in names.items():  # tied embeddings come with both parts
            arrays.setdefault(name, np.ascontiguousarray(
                _take(tensors, key, t, name, want[name], where)))
        used[part] = {key for key, _ in names.values()}
    unmapped = sorted(f"{part}:{k}" for part, tensors, _ in parts for k in tensors
                      if k not in used[part] and k != "generator_lm_head.weight")
    return config, arrays, unmapped
