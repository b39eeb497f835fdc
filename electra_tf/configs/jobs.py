"""The two jobs' configs, composed of the same sections (as Model Garden's experiment
config): pre-training's model/objective/optimizer/train, fine-tuning's optimizer/train."""

import dataclasses
from typing import Any, Dict, Optional

from electra_tf.configs.schema import AT_LEAST_1, POSITIVE, Check, ConfigError, check_knobs, knob
from electra_tf.configs.sections import ModelConfig, ObjectiveConfig, OptimizerConfig, TrainConfig
from electra_tf.objective_specs import SPECS


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    JOB, FILE_FLAG = "pretraining", "config"  # whose flags (`schema.knob`); the file flag
    model: ModelConfig = ModelConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()

    def check(self) -> "PretrainingConfig":
        check_knobs(self, self.JOB)
        if self.optimizer.learning_rate is None:
            raise ConfigError("optimizer.learning_rate=None: pre-training needs a value")
        self.model.check()
        self.objective.check()
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
    """A fine-tuning run: pre-training's optimizer and train sections (steps and warmup from the
    epochs) and its own knobs; None: the paper's default for the model and task (`resolved`)."""
    JOB, FILE_FLAG = "finetune", "finetune_config"
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=None, weight_decay=0.0)
    train: TrainConfig = TrainConfig(train_batch_size=32, eval_batch_size=32,
                                     steps_per_loop=50)
    layerwise_lr_decay: Optional[float] = knob(
        None, Check(lambda v: 0 < v <= 1, " must be in (0, 1]"),
        finetune="Default: 0.8 (0.9 large).")
    official_lr_bug: bool = knob(False, finetune=(
        "Reproduce the official code's layer-wise decay, which gives the top encoder layer "
        "decay^2 instead of decay^1."))
    num_train_epochs: Optional[float] = knob(None, POSITIVE, finetune=(
        "Default: the task's (3; 10 for RTE and STS-B; 2 for SQuAD)."))
    warmup_proportion: float = knob(0.1, finetune=("Linear warmup share of the steps "
                                                   "(default 0.1)."))
    num_trials: int = knob(1, AT_LEAST_1, finetune=(
        "Fine-tuning seeds (default 1); results.json has every score and the median."))

    def resolved(self, model: ModelConfig, task) -> "FinetuneConfig":
        """The None knobs set to their defaults for the model size and the task."""
        large = model.hidden_size >= 1024
        lr = self.optimizer.learning_rate
        if lr is None:
            lr = 5e-5 if large else (1e-4 if model.hidden_size >= 768 else 3e-4)
        decay = self.layerwise_lr_decay
        if decay is None:
            decay = 0.9 if large else 0.8
        epochs = task.num_train_epochs if self.num_train_epochs is None else self.num_train_epochs
        return dataclasses.replace(
            self, optimizer=dataclasses.replace(self.optimizer, learning_rate=lr),
            layerwise_lr_decay=decay, num_train_epochs=float(epochs))

    def check(self) -> "FinetuneConfig":
        check_knobs(self, self.JOB)
        return self
