"""Configuration: one frozen dataclass per concern, presets in `configs/*.json`.

Unknown keys are errors that list the valid ones; overrides use `section.key=value`
(or a bare `key=value` when the key name is unique across sections).
"""

import dataclasses
import json
import os
import typing
from typing import Any, Dict, Optional, Tuple, Union

from absl import logging

from electra_tf.objective_specs import SPECS

# Repo-internal presets (local, next to this package); user config files go through
# TensorFlow's filesystem layer (`load_config`).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: this package
PRESET_DIR = os.path.join(_REPO, "configs")


class ConfigError(ValueError):
    """A bad preset, key or value; the message is one line."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The encoder sizes (the discriminator's) and how the generator derives from them."""
    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    # Generator: hidden size, FFN size and heads scaled by this; same depth by default.
    generator_hidden_size: float = 0.25
    generator_layers: float = 1.0
    # Share token/position/type embeddings between generator and discriminator.
    tie_embeddings: bool = True
    # Share every encoder weight (paper 3.2); needs generator_hidden_size == 1.0.
    tie_all_weights: bool = False
    # The generator is a two-tower cloze model (left-to-right + right-to-left encoders of
    # the generator's size reading the unmasked input): ELECTRIC's noise distribution.
    two_tower_generator: bool = False
    # Gradient-disentangled embedding sharing (DeBERTaV3's GDES; --generator_tying=gdes):
    # the generator owns the tables; the discriminator reads stop_gradient(them) + its own
    # zero-initialised deltas and has its own embedding LayerNorm.
    disentangled_embeddings: bool = False

    @property
    def generator_hidden(self) -> int:
        return int(round(self.hidden_size * self.generator_hidden_size))

    @property
    def generator_intermediate(self) -> int:
        """The discriminator's FFN scaled as its hidden size. The official code uses 4 x
        the generator's hidden size: the same whenever intermediate_size = 4 x
        hidden_size (every preset and released checkpoint); other shapes keep this rule,
        which Hugging Face and TF1 imports infer sizes by."""
        return int(round(self.intermediate_size * self.generator_hidden_size))

    @property
    def generator_heads(self) -> int:
        return max(1, self.generator_hidden // 64)

    @property
    def generator_num_layers(self) -> int:
        return max(1, int(round(self.num_hidden_layers * self.generator_layers)))

    def released(self) -> "ModelConfig":
        """The config of this model's released-layout export (`modeling.released_arrays`):
        GDES exports untied tables (the discriminator's folded)."""
        if not self.disentangled_embeddings:
            return self
        return dataclasses.replace(self, tie_embeddings=False, disentangled_embeddings=False)

    def check(self):
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "intermediate_size", "max_position_embeddings",
                     "type_vocab_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be at least 1")
        for name in ("generator_hidden_size", "generator_layers", "initializer_range",
                     "layer_norm_eps"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be > 0")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be in [0, 1)")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"model.hidden_size={self.hidden_size} is not a multiple of "
                              f"model.num_attention_heads={self.num_attention_heads}")
        if self.generator_hidden % self.generator_heads:
            raise ConfigError(f"generator hidden size {self.generator_hidden} is not a multiple "
                              f"of its {self.generator_heads} heads")
        if self.tie_all_weights and (self.generator_hidden_size != 1.0 or
                                     self.generator_layers != 1.0):
            raise ConfigError("model.tie_all_weights needs generator_hidden_size=1.0 and "
                              "generator_layers=1.0")
        if self.disentangled_embeddings and (self.tie_all_weights or self.two_tower_generator
                                             or not self.tie_embeddings):
            raise ConfigError("model.disentangled_embeddings (--generator_tying=gdes) shares "
                              "the embeddings through deltas: it needs tie_embeddings=true, "
                              "tie_all_weights=false and no two_tower_generator")
        if self.tie_all_weights and self.two_tower_generator:
            raise ConfigError("model.two_tower_generator has its own encoders: it cannot "
                              "share all weights (use --generator_tying=embeddings or none)")


# Pre-training objectives: one spec each (`objective_specs.SPECS`), one class each
# (`electra_tf.pretraining.objectives.OBJECTIVES`).
OBJECTIVE_NAMES = tuple(SPECS)
GENERATORS = ("masked_lm", "uniform", "unigram", "fixed")
TEMPERATURE_SHAPES = ("linear", "cosine", "exponential")


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """What is corrupted, how replacements are sampled, and how losses are weighted."""
    objective: str = "electra"
    mask_prob: float = 0.15
    # Slots per sequence; 0 = int((mask_prob + 0.005) * max_seq_length) as officially.
    max_predictions_per_seq: int = 0
    # Of the chosen positions: this share becomes [MASK], the rest keep their token.
    mask_token_prob: float = 0.85
    # BERT-style corruption: this share of chosen positions gets a random token.
    random_token_prob: float = 0.0
    temperature: float = 1.0
    # A sampling temperature that changes over the run (Fast-ELECTRA's curriculum):
    # "SHAPE:START[:END]", SHAPE linear | cosine | exponential (geometric), from START at
    # step 0 to END (default 1) at the last step; empty: `temperature` throughout.
    temperature_schedule: str = ""
    disallow_correct: bool = False
    # Draw the masked positions with replacement, as the official code does (a position
    # can fill several slots; fewer distinct tokens are corrupted): for comparisons with
    # it (bench/official_curves.py). Default: without replacement, exactly `count` tokens.
    mask_with_replacement: bool = False
    # masked_lm | uniform | unigram | fixed (a pre-trained masked LM from
    # generator_checkpoint, run forward only: Fast-ELECTRA)
    generator: str = "masked_lm"
    generator_checkpoint: str = ""
    gen_weight: float = 1.0
    # Weight of the discriminator's BCE (lambda); MLM-type objectives weigh their main
    # model's cross-entropy by 1.
    disc_weight: float = 50.0
    # Focal loss for the generator's MLM: "0" (cross-entropy), a constant gamma, or
    # "piecewise" (gamma 3 where p_G > 0.2, else 5).
    gen_focal_gamma: str = "0"
    # hp_loss / hp_dist: weight of the sampling head's loss (lambda_1); -1 takes the
    # paper's value (the objective's `ObjectiveSpec.hp_weight`).
    hp_weight: float = -1.0
    # two_stage: the step at which the generator freezes and the discriminator starts
    # (initialised from it); 0 = half of train.num_train_steps.
    two_stage_switch_step: int = 0

    def predictions_per_seq(self, max_seq_length: int) -> int:
        return self.max_predictions_per_seq or int((self.mask_prob + 0.005) * max_seq_length)

    def check(self):
        if not 0 < self.mask_prob < 1:
            raise ConfigError(f"objective.mask_prob={self.mask_prob} must be in (0, 1)")
        if self.mask_token_prob + self.random_token_prob > 1:
            raise ConfigError("objective.mask_token_prob + random_token_prob must be <= 1")
        if self.generator not in GENERATORS:
            raise ConfigError(f"objective.generator={self.generator!r}: expected one of "
                              f"{', '.join(GENERATORS)}")
        if self.temperature <= 0:
            raise ConfigError(f"objective.temperature={self.temperature} must be > 0")
        self.schedule()
        official = [s.name for s in SPECS.values() if s.official_masking]
        if self.mask_with_replacement and (self.objective not in official or
                                           self.random_token_prob > 0):
            raise ConfigError("objective.mask_with_replacement reproduces the official "
                              f"ELECTRA masking: it needs objective={' or '.join(official)} "
                              "and random_token_prob=0")
        if (self.generator == "fixed") != bool(self.generator_checkpoint):
            raise ConfigError("objective.generator=fixed and objective.generator_checkpoint "
                              "(--generator_checkpoint) go together: give both or neither")
        if self.objective not in OBJECTIVE_NAMES:
            raise ConfigError(f"objective.objective={self.objective!r}: expected one of "
                              f"{', '.join(OBJECTIVE_NAMES)}")
        self.focal_gamma()
        if self.two_stage_switch_step < 0:
            raise ConfigError(f"objective.two_stage_switch_step={self.two_stage_switch_step} "
                              "must be >= 0")
        if self.generator != "masked_lm" and SPECS[self.objective].trains_generator:
            raise ConfigError(f"objective.objective={self.objective} trains the generator "
                              f"network; objective.generator={self.generator} has none")

    def schedule(self) -> Tuple[str, float, float]:
        """(shape, start, end) of the sampling temperature; ("constant", T, T) without a
        temperature_schedule."""
        if not self.temperature_schedule:
            return "constant", self.temperature, self.temperature
        parts = self.temperature_schedule.split(":")
        bad = ConfigError(f"objective.temperature_schedule={self.temperature_schedule!r}: "
                          f"expected SHAPE:START[:END], SHAPE one of "
                          f"{', '.join(TEMPERATURE_SHAPES)}, temperatures > 0")
        if parts[0] not in TEMPERATURE_SHAPES or len(parts) not in (2, 3):
            raise bad
        try:
            start, end = float(parts[1]), float(parts[2]) if len(parts) == 3 else 1.0
        except ValueError:
            raise bad from None
        if not (start > 0 and end > 0):
            raise bad
        return parts[0], start, end

    def focal_gamma(self):
        """The focal gamma: a float (0 = cross-entropy) or the string "piecewise"."""
        text = str(self.gen_focal_gamma).strip().lower()
        if text == "piecewise":
            return "piecewise"
        try:
            gamma = float(text)
        except ValueError:
            gamma = -1.0
        if not gamma >= 0:
            raise ConfigError(f"objective.gen_focal_gamma={self.gen_focal_gamma!r}: expected "
                              "a number >= 0 or 'piecewise'")
        return gamma

    def sampling_weight(self) -> float:
        """lambda_1 of the hardness-prediction head (the paper's value unless set)."""
        return self.hp_weight if self.hp_weight >= 0 else SPECS[self.objective].hp_weight

    def switch_step(self, num_train_steps: int) -> int:
        """two_stage: the first step of the discriminator stage."""
        return self.two_stage_switch_step or num_train_steps // 2


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """The official defaults: AdamW without bias correction, linear warmup and decay."""
    optimizer: str = "adamw"  # adamw | lamb
    learning_rate: float = 5e-4
    warmup_steps: int = 10000
    lr_decay_power: float = 1.0
    end_learning_rate: float = 0.0
    weight_decay: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    bias_correction: bool = False
    clip_norm: float = 1.0

    def check(self):
        if self.optimizer not in ("adamw", "lamb"):
            raise ConfigError(f"optimizer.optimizer={self.optimizer!r}: expected adamw or lamb")
        if self.learning_rate <= 0:
            raise ConfigError(f"optimizer.learning_rate={self.learning_rate} must be > 0")


# The shortest pre-training sequence: two one-token segments and their three markers (the
# builder's minimum too).
MIN_SEQ_LENGTH = 5


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Batching, length, steps, checkpoints and numerics of a run."""
    train_batch_size: int = 128
    eval_batch_size: int = 128
    max_seq_length: int = 128
    num_train_steps: int = 1_000_000
    max_eval_steps: int = 100
    steps_per_loop: int = 100
    log_every_steps: int = 100
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    grad_accum_steps: int = 1
    # auto: bfloat16 on TPU, float32 elsewhere; float16 uses dynamic loss scaling.
    precision: str = "auto"  # auto | float32 | bfloat16 | float16
    seed: int = 1
    # A step with a non-finite loss or gradient is never applied; then either go on
    # (skip: counted in the logs; what float16 loss scaling needs) or stop the run.
    on_nan: str = "skip"  # skip | stop
    # A corrupted, truncated or vanished TFRecord shard: skip the rest of it (one warning
    # naming it, counted in the logs; a run that has lost over half its shards stops), or
    # stop the run at once naming it. Skip is the default because an auto-restarted
    # preemptible job that stops would hit the same shard on every restart.
    on_bad_shard: str = "skip"  # skip | stop

    def check(self, model: ModelConfig):
        if self.max_seq_length < MIN_SEQ_LENGTH:
            raise ConfigError(f"max_seq_length={self.max_seq_length} must be at least "
                              f"{MIN_SEQ_LENGTH} ([CLS] A [SEP] B [SEP])")
        if self.max_seq_length > model.max_position_embeddings:
            raise ConfigError(f"max_seq_length={self.max_seq_length} exceeds "
                              f"model.max_position_embeddings={model.max_position_embeddings}")
        for name in ("train_batch_size", "num_train_steps", "steps_per_loop",
                     "save_checkpoints_steps", "grad_accum_steps", "log_every_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.train_batch_size % self.grad_accum_steps:
            raise ConfigError(f"train_batch_size={self.train_batch_size} is not a multiple of "
                              f"grad_accum_steps={self.grad_accum_steps}")
        if self.on_nan not in ("skip", "stop"):
            raise ConfigError(f"on_nan={self.on_nan!r}: expected skip or stop")
        if self.on_bad_shard not in ("skip", "stop"):
            raise ConfigError(f"on_bad_shard={self.on_bad_shard!r}: expected skip or stop")
        if self.precision not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"precision={self.precision!r}: expected auto, float32, "
                              "bfloat16 or float16")


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    model: ModelConfig = ModelConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()

    def check(self) -> "PretrainingConfig":
        self.model.check()
        self.objective.check()
        self.optimizer.check()
        self.train.check(self.model)
        m, o = self.model, self.objective
        if SPECS[o.objective].phases:  # two_stage
            if (m.generator_hidden, m.generator_num_layers, m.generator_heads,
                    m.generator_intermediate) != (m.hidden_size, m.num_hidden_layers,
                                                  m.num_attention_heads, m.intermediate_size):
                raise ConfigError(
                    f"objective.objective={o.objective} initialises the discriminator from the "
                    "generator: set model.generator_hidden_size=1.0 and generator_layers=1.0 "
                    f"(and num_attention_heads={max(1, m.hidden_size // 64)}, the "
                    "generator's head count)")
            if m.tie_embeddings or m.tie_all_weights:
                raise ConfigError(f"objective.objective={o.objective} freezes the generator while "
                                  "the discriminator trains: set model.tie_embeddings=false")
            if not 0 < o.switch_step(self.train.num_train_steps) < self.train.num_train_steps:
                raise ConfigError(f"objective.two_stage_switch_step="
                                  f"{o.two_stage_switch_step} must fall inside the run's "
                                  f"{self.train.num_train_steps} steps")
        towers = [s.name for s in SPECS.values() if s.generator_towers == 2]
        if m.two_tower_generator and o.objective not in towers:
            raise ConfigError("model.two_tower_generator is ELECTRIC's noise model: use it "
                              f"with --objective={' or '.join(towers)}, not {o.objective}")
        return self

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of a fine-tuning run (paper Appendix B defaults where None; the
    trainer resolves those for the model size and task). Keys are flat:
    `--params_override=learning_rate=1e-4,num_train_epochs=2`."""
    learning_rate: Optional[float] = None  # None: 3e-4 small, 1e-4 base, 5e-5 large
    layerwise_lr_decay: Optional[float] = None  # None: 0.8, 0.9 for large
    official_lr_bug: bool = False  # the official code's top-layer decay^2
    num_train_epochs: Optional[float] = None  # None: the task's (3; 10 RTE/STS-B; 2 SQuAD)
    train_batch_size: int = 32
    eval_batch_size: int = 32
    max_seq_length: int = 128
    warmup_proportion: float = 0.1
    weight_decay: float = 0.0
    adam_epsilon: float = 1e-6
    clip_norm: float = 1.0
    num_trials: int = 1
    seed: int = 1
    precision: str = "auto"  # as train.precision
    steps_per_loop: int = 50
    save_checkpoints_steps: int = 1000
    on_nan: str = "skip"  # as train.on_nan

    def resolved(self, model: ModelConfig, task) -> "FinetuneConfig":
        """The defaults that depend on the model size and the task (its
        `num_train_epochs`)."""
        large = model.hidden_size >= 1024
        lr = self.learning_rate
        if lr is None:
            lr = 5e-5 if large else (1e-4 if model.hidden_size >= 768 else 3e-4)
        decay = self.layerwise_lr_decay
        if decay is None:
            decay = 0.9 if large else 0.8
        epochs = task.num_train_epochs if self.num_train_epochs is None else self.num_train_epochs
        return dataclasses.replace(self, learning_rate=lr, layerwise_lr_decay=decay,
                                   num_train_epochs=float(epochs))

    def check(self) -> "FinetuneConfig":
        for name in ("train_batch_size", "eval_batch_size", "max_seq_length", "num_trials",
                     "steps_per_loop", "save_checkpoints_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name}={getattr(self, name)} must be at least 1")
        if self.layerwise_lr_decay is not None and not 0 < self.layerwise_lr_decay <= 1:
            raise ConfigError(f"--layerwise_lr_decay={self.layerwise_lr_decay} must be in (0, 1]")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ConfigError(f"--learning_rate={self.learning_rate} must be > 0")
        if self.num_train_epochs is not None and self.num_train_epochs <= 0:
            raise ConfigError(f"--num_train_epochs={self.num_train_epochs} must be > 0")
        if self.on_nan not in ("skip", "stop"):
            raise ConfigError(f"--on_nan={self.on_nan!r}: expected skip or stop")
        if self.precision not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"--precision={self.precision!r}: expected auto, float32, "
                              "bfloat16 or float16")
        return self


_SECTION_CLASSES = {"model": ModelConfig, "objective": ObjectiveConfig,
                    "optimizer": OptimizerConfig, "train": TrainConfig}


def _fields(cls) -> Dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _kind(cls, name: str):
    """(the type of field `name`, whether None is allowed): from its default, or from
    its annotation when the default is None (`Optional[float]`)."""
    default = _fields(cls)[name].default
    if default is not None:
        return type(default), False
    hint = typing.get_type_hints(cls)[name]
    return next(a for a in typing.get_args(hint) if a is not type(None)), True


def _coerce(value: Any, kind: type, key: str, optional: bool = False) -> Any:
    """Converts a JSON or command-line value to the field's type (`none`/null: None
    where the field allows it)."""
    if optional and (value is None or (isinstance(value, str) and
                                       value.strip().lower() in ("none", "null"))):
        return None
    if isinstance(value, str) and kind is not str:
        text = value.strip()
        if kind is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ConfigError(f"{key}={value!r}: expected true or false")
        try:
            return kind(float(text)) if kind is int and "e" in text.lower() else kind(text)
        except ValueError:
            raise ConfigError(f"{key}={value!r}: expected a {kind.__name__}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{key}={value!r}: expected a {kind.__name__}")
    return value


def _resolve_key(key: str) -> tuple:
    """'section.field' or a bare field name unique across sections -> (section, field)."""
    if "." in key:
        section, name = key.split(".", 1)
        if section not in _SECTION_CLASSES:
            raise ConfigError(f"unknown config section {section!r}; valid: "
                              f"{', '.join(_SECTION_CLASSES)}")
        if name not in _fields(_SECTION_CLASSES[section]):
            raise ConfigError(f"unknown key {key!r}; valid keys of {section}: "
                              f"{', '.join(_fields(_SECTION_CLASSES[section]))}")
        return section, name
    owners = [s for s, cls in _SECTION_CLASSES.items() if key in _fields(cls)]
    if not owners:
        valid = ", ".join(f"{s}.{n}" for s, cls in _SECTION_CLASSES.items() for n in _fields(cls))
        raise ConfigError(f"unknown config key {key!r}; valid keys: {valid}")
    if len(owners) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous; write one of "
                          f"{', '.join(f'{s}.{key}' for s in owners)}")
    return owners[0], key


def _replace(obj, values: Dict[str, Any], prefix: str = ""):
    """A flat config dataclass with {field: value} applied, values coerced to the field
    types; an unknown field is an error listing the valid ones."""
    fields = _fields(type(obj))
    changes = {}
    for name, value in values.items():
        if name not in fields:
            raise ConfigError(f"unknown config key {prefix}{name!r}; valid keys: "
                              f"{', '.join(prefix + n for n in fields)}")
        kind, optional = _kind(type(obj), name)
        changes[name] = _coerce(value, kind, f"{prefix}{name}", optional)
    return dataclasses.replace(obj, **changes)


def apply_overrides(cfg, overrides: Dict[str, Any]):
    """Returns `cfg` with {key: value} applied. PretrainingConfig: keys as in
    `_resolve_key`; a flat config (FinetuneConfig): its field names."""
    if not isinstance(cfg, PretrainingConfig):
        return _replace(cfg, overrides)
    changes: Dict[str, Dict[str, Any]] = {}
    for key, value in overrides.items():
        section, name = _resolve_key(key)
        changes.setdefault(section, {})[name] = value
    return dataclasses.replace(cfg, **{
        s: _replace(getattr(cfg, s), kv, f"{s}.") for s, kv in changes.items()})


def parse_overrides(text: str) -> Dict[str, str]:
    """'a=1,b.c=2' -> {'a': '1', 'b.c': '2'} (the --params_override syntax)."""
    out = {}
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        if "=" not in item:
            raise ConfigError(f"--params_override: {item!r} is not key=value")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def _flatten(data: Dict[str, Any], where: str) -> Dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    flat = {}
    for key, value in data.items():
        if key in _SECTION_CLASSES:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: section {key!r} must be a JSON object")
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        elif key in ("description", "_comment"):
            continue
        else:
            flat[key] = value
    return flat


def preset_names():
    return sorted(f[:-5] for f in os.listdir(PRESET_DIR)  # local: repo-internal presets
                  if f.endswith(".json"))


def _read_config_file(name_or_path: str, flag: str) -> Dict[str, Any]:
    """The JSON object of a preset name (configs/NAME.json) or a JSON path (any
    filesystem TensorFlow knows: local, gs://...)."""
    # TensorFlow is imported here, not at the top: the CLIs import this module to define
    # their flags before TensorFlow loads.
    import tensorflow as tf
    from electra_tf import fileio
    path = name_or_path
    try:
        found = fileio.exists(path)
    except tf.errors.OpError as e:  # e.g. an unreachable bucket
        raise ConfigError(f"{flag} {path}: {fileio.error_reason(e)}") from None
    if not found:
        if fileio.is_remote(path):
            raise ConfigError(f"{flag} {path}: no such file")
        path = os.path.join(PRESET_DIR, f"{name_or_path}.json")
        if not fileio.exists(path):
            raise ConfigError(f"{flag} {name_or_path!r}: neither a file nor a preset; "
                              f"presets: {', '.join(preset_names())}")
    try:
        data = json.loads(fileio.read_text(path))
    except (OSError, tf.errors.OpError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{flag} {path}: {fileio.error_reason(e)}") from None
    return _flatten(data, path)


def _with_overrides(cfg, overrides: Optional[Union[str, Dict[str, Any]]]):
    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    return apply_overrides(cfg, overrides) if overrides else cfg


# What an objective (its spec's `requirements`) or a generator kind needs of the model, set
# for it unless the user set otherwise, keyed by (config key, value): a fixed generator
# must not share embeddings the discriminator trains. (key, value, the flag)
REQUIREMENTS = {
    **{("objective.objective", s.name): s.requirements for s in SPECS.values()
       if s.requirements},
    ("objective.generator", "fixed"): (
        ("model.tie_embeddings", False, "--generator_tying=none"),
        ("model.tie_all_weights", False, "--generator_tying=none"),
        ("model.disentangled_embeddings", False, "--generator_tying=none")),
}


def _get(cfg, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _requirements(cfg: PretrainingConfig, explicit) -> PretrainingConfig:
    """Sets what the objective and generator require (REQUIREMENTS), logging each change;
    a conflicting value the user gave (a key in `explicit`) is a ConfigError naming the
    flag that fixes it."""
    changes = {}
    for (trigger, trigger_value), needs in REQUIREMENTS.items():
        if _get(cfg, trigger) != trigger_value:
            continue
        for key, value, flag in needs:
            current = _get(cfg, key)
            if current == value:
                continue
            if key in explicit:
                raise ConfigError(f"{trigger}={trigger_value} needs {key}={value} but it is "
                                  f"set to {current}: use {flag}")
            logging.info("%s=%s: setting %s=%s (was %s)", trigger, trigger_value, key, value,
                         current)
            changes[key] = value
    return apply_overrides(cfg, changes) if changes else cfg


def load_config(name_or_path: str = "tiny",
                overrides: Optional[Union[str, Dict[str, Any]]] = None) -> PretrainingConfig:
    """A pre-training preset name (configs/NAME.json) or a JSON path (any filesystem),
    plus overrides; then what the objective requires (`REQUIREMENTS`); checked."""
    cfg = apply_overrides(PretrainingConfig(), _read_config_file(name_or_path, "--config"))
    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    cfg = _with_overrides(cfg, overrides)
    explicit = {".".join(_resolve_key(k)) for k in (overrides or {})}
    return _requirements(cfg, explicit).check()


def load_finetune_config(path: Optional[str] = None,
                         overrides: Optional[Union[str, Dict[str, Any]]] = None
                         ) -> FinetuneConfig:
    """Fine-tuning hyper-parameters: the defaults, a JSON file of FinetuneConfig keys (any
    filesystem; --finetune_config), then overrides (--params_override, then the flags);
    checked."""
    cfg = FinetuneConfig()
    if path:
        cfg = apply_overrides(cfg, _read_config_file(path, "--finetune_config"))
    return _with_overrides(cfg, overrides).check()


# Flags of run_pretraining.py that set a config key.
PRETRAINING_FLAGS = {"num_train_steps": "train.num_train_steps",
                     "train_batch_size": "train.train_batch_size",
                     "max_seq_length": "train.max_seq_length",
                     "save_checkpoints_steps": "train.save_checkpoints_steps",
                     "steps_per_loop": "train.steps_per_loop",
                     "grad_accum_steps": "train.grad_accum_steps",
                     "learning_rate": "optimizer.learning_rate",
                     "precision": "train.precision", "seed": "train.seed",
                     "on_nan": "train.on_nan", "on_bad_shard": "train.on_bad_shard",
                     "objective": "objective.objective",
                     "generator": "objective.generator",
                     "generator_checkpoint": "objective.generator_checkpoint",
                     "temperature_schedule": "objective.temperature_schedule",
                     "gen_focal_gamma": "objective.gen_focal_gamma"}
# --generator_tying -> (model.tie_embeddings, model.tie_all_weights,
# model.disentangled_embeddings)
_TYING = {"none": ("false", "false", "false"), "embeddings": ("true", "false", "false"),
          "all": ("true", "true", "false"), "gdes": ("true", "false", "true")}
TYINGS = tuple(_TYING)
# Flags of run_finetuning.py that set a FinetuneConfig key (the same names).
FINETUNE_FLAGS = {name: name for name in (
    "learning_rate", "layerwise_lr_decay", "official_lr_bug", "num_train_epochs",
    "train_batch_size", "eval_batch_size", "max_seq_length", "warmup_proportion",
    "num_trials", "seed", "precision", "save_checkpoints_steps", "on_nan")}


def overrides_from_flags(flag_values, keys: Dict[str, str]) -> Dict[str, str]:
    """--params_override, then every flag of `keys` the user set (flags left at None
    keep the config's value)."""
    overrides = parse_overrides(flag_values.params_override)
    overrides.update({key: str(getattr(flag_values, name)) for name, key in keys.items()
                      if getattr(flag_values, name) is not None})
    tying = getattr(flag_values, "generator_tying", None)
    if tying:
        (overrides["model.tie_embeddings"], overrides["model.tie_all_weights"],
         overrides["model.disentangled_embeddings"]) = _TYING[tying]
    return overrides


def pretraining_config_from_flags(flag_values) -> PretrainingConfig:
    """run_pretraining.py's config: --config, --params_override, then the flags."""
    return load_config(flag_values.config, overrides_from_flags(flag_values,
                                                                PRETRAINING_FLAGS))


def finetune_config_from_flags(flag_values) -> FinetuneConfig:
    """run_finetuning.py's hyper-parameters: --finetune_config, --params_override, then
    the flags."""
    return load_finetune_config(flag_values.finetune_config,
                                overrides_from_flags(flag_values, FINETUNE_FLAGS))
