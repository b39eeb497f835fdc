"""The sections both jobs compose: the model, the objective, the optimizer and the run's
batching and numerics; each knob's check and flag are declared with its field."""

import dataclasses
from typing import Optional, Tuple

from electra_tf.configs.schema import (AT_LEAST_1, DROPOUT, POSITIVE, SKIP_OR_STOP, Check,
                                       ConfigError, check_knobs, knob, one_of)
from electra_tf.objective_specs import SPECS


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The encoder sizes (the discriminator's) and how the generator derives from them."""
    vocab_size: int = knob(30522, AT_LEAST_1)
    embedding_size: int = knob(128, AT_LEAST_1)
    hidden_size: int = knob(256, AT_LEAST_1)
    num_hidden_layers: int = knob(12, AT_LEAST_1)
    num_attention_heads: int = knob(4, AT_LEAST_1)
    intermediate_size: int = knob(1024, AT_LEAST_1)
    hidden_dropout_prob: float = knob(0.1, DROPOUT)
    attention_probs_dropout_prob: float = knob(0.1, DROPOUT)
    max_position_embeddings: int = knob(512, AT_LEAST_1)
    type_vocab_size: int = knob(2, AT_LEAST_1)
    initializer_range: float = knob(0.02, POSITIVE)
    layer_norm_eps: float = knob(1e-12, POSITIVE)
    # Generator: hidden size, FFN size and heads scaled by this; same depth by default.
    generator_hidden_size: float = knob(0.25, POSITIVE)
    generator_layers: float = knob(1.0, POSITIVE)
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
        """The discriminator's FFN scaled as its hidden size (the official 4 x the
        generator's hidden size wherever intermediate_size = 4 x hidden_size)."""
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
        check_knobs(self, prefix="model.")
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
    objective: str = knob(
        "electra", one_of(*OBJECTIVE_NAMES), pretraining=(
            "Overrides objective.objective (default electra; README: Objective variants): " +
            "; ".join(f"{s.name}: {s.description}" for s in SPECS.values()) + "."))
    mask_prob: float = knob(0.15, Check(lambda v: 0 < v < 1, " must be in (0, 1)"))
    # Slots per sequence; 0 = int((mask_prob + 0.005) * max_seq_length) as officially.
    max_predictions_per_seq: int = 0
    # Of the chosen positions: this share becomes [MASK], the rest keep their token.
    mask_token_prob: float = 0.85
    # BERT-style corruption: this share of chosen positions gets a random token.
    random_token_prob: float = 0.0
    temperature: float = knob(1.0, POSITIVE)
    # Empty: `temperature` throughout.
    temperature_schedule: str = knob("", pretraining=(
        "Sampling temperature over the run: SHAPE:START[:END] with SHAPE linear, cosine or "
        "exponential, from START at step 0 to END (default 1) at the last step, e.g. "
        "exponential:2 (Fast-ELECTRA's descending curriculum)."))
    disallow_correct: bool = False
    # The official code's masking, for comparisons (bench/official_curves.py): positions
    # drawn with replacement, so fewer distinct tokens may be corrupted than `count`.
    mask_with_replacement: bool = False
    generator: str = knob("masked_lm", one_of(*GENERATORS), pretraining=(
        "Overrides objective.generator: the sized masked-LM generator, uniform / unigram "
        "proposals (unigram reads the builder's token counts), or fixed: a pre-trained "
        "masked LM from --generator_checkpoint, forward only (Fast-ELECTRA)."))
    generator_checkpoint: str = knob("", pretraining=(
        "--generator=fixed: a TF1 checkpoint with generator/ weights (a released ELECTRA "
        "checkpoint, `convert import-hf --generator_dir`, `convert export-tf1`) or an "
        "earlier pre-training --model_dir; sizes from model.generator_*."))
    gen_weight: float = 1.0
    # Weight of the discriminator's BCE (lambda); MLM-type objectives weigh their main
    # model's cross-entropy by 1.
    disc_weight: float = 50.0
    gen_focal_gamma: str = knob("0", pretraining=(
        "Focal loss for the generator's MLM: a gamma >= 0 (0 = cross-entropy) or "
        "'piecewise' (3 if p_G > 0.2 else 5)."))
    # hp_loss / hp_dist: weight of the sampling head's loss (lambda_1); -1 takes the
    # paper's value (the objective's `ObjectiveSpec.hp_weight`).
    hp_weight: float = -1.0
    # two_stage: the step at which the generator freezes and the discriminator starts
    # (initialised from it); 0 = half of train.num_train_steps.
    two_stage_switch_step: int = knob(0, Check(lambda v: v >= 0, " must be >= 0"))

    def predictions_per_seq(self, max_seq_length: int) -> int:
        return self.max_predictions_per_seq or int((self.mask_prob + 0.005) * max_seq_length)

    def check(self):
        if self.mask_token_prob + self.random_token_prob > 1:
            raise ConfigError("objective.mask_token_prob + random_token_prob must be <= 1")
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
        self.focal_gamma()
        if self.generator != "masked_lm" and SPECS[self.objective].trains_generator:
            raise ConfigError(f"objective.objective={self.objective} trains the generator "
                              f"network; objective.generator={self.generator} has none")

    def schedule(self) -> Tuple[str, float, float]:
        """(shape, start, end) of the sampling temperature; ("constant", T, T) by default."""
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
    optimizer: str = knob("adamw", one_of("adamw", "lamb"))
    learning_rate: Optional[float] = knob(
        5e-4, POSITIVE, pretraining="Overrides optimizer.learning_rate.",
        finetune="Default: 3e-4 small, 1e-4 base, 5e-5 large.")
    warmup_steps: int = 10000
    lr_decay_power: float = 1.0
    end_learning_rate: float = 0.0
    weight_decay: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    bias_correction: bool = False
    clip_norm: float = 1.0


# The shortest pre-training sequence: two one-token segments and their three markers (the
# builder's minimum too).
MIN_SEQ_LENGTH = 5


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Batching, length, steps, checkpoints and numerics of a run."""
    train_batch_size: int = knob(128, AT_LEAST_1,
                                 pretraining="Global batch; overrides the config.",
                                 finetune="Global batch (default 32).")
    eval_batch_size: int = knob(128, AT_LEAST_1, finetune="Global eval batch (default 32).")
    max_seq_length: int = knob(
        128, Check(lambda v: v >= MIN_SEQ_LENGTH,
                   f" must be at least {MIN_SEQ_LENGTH} ([CLS] A [SEP] B [SEP])"),
        pretraining="Overrides train.max_seq_length.",
        finetune="Tokens per example (default 128; SQuAD: 512).")
    num_train_steps: int = knob(1_000_000, AT_LEAST_1,
                                pretraining="Overrides train.num_train_steps.")
    max_eval_steps: int = 100
    steps_per_loop: int = knob(100, AT_LEAST_1, pretraining="Compiled steps per host visit.")
    log_every_steps: int = knob(100, AT_LEAST_1)
    save_checkpoints_steps: int = knob(
        1000, AT_LEAST_1, pretraining="Overrides the config.",
        finetune="Checkpoint interval within a trial (default 1000).")
    keep_checkpoint_max: int = 5
    grad_accum_steps: int = knob(1, AT_LEAST_1, pretraining="Micro-batches per update.")
    precision: str = knob("auto", one_of("auto", "float32", "bfloat16", "float16"), flag=(
        "Compute precision; variables, losses, softmax and sampling stay float32. auto (the "
        "default): bfloat16 on TPU, float32 elsewhere; float16 adds dynamic loss scaling."))
    seed: int = knob(1, pretraining="Overrides train.seed.",
                     finetune="Seed of the first trial (trial i uses seed + i; default 1).")
    # skip is what float16 loss scaling needs.
    on_nan: str = knob("skip", SKIP_OR_STOP, flag=(
        "A step with a non-finite loss or gradient is never applied; skip it and go on "
        "(counted in the logs; 100 in a row stop the run), or stop with the last good "
        "checkpoint named. Default: the config's (skip)."))
    # Why skip is the default: data/shards.py.
    on_bad_shard: str = knob("skip", SKIP_OR_STOP, pretraining=(
        "A corrupted, truncated or deleted TFRecord shard: skip the rest of it (a warning "
        "naming it, counted in the logs; default) or stop the run naming it."))

    def check(self, model: ModelConfig):
        if self.max_seq_length > model.max_position_embeddings:
            raise ConfigError(f"--max_seq_length={self.max_seq_length} exceeds the model's "
                              f"max_position_embeddings={model.max_position_embeddings} (the "
                              "longest input it has position embeddings for)")
        if self.train_batch_size % self.grad_accum_steps:
            raise ConfigError(f"train_batch_size={self.train_batch_size} is not a multiple of "
                              f"grad_accum_steps={self.grad_accum_steps}")
