"""Configuration: one frozen dataclass per concern (`sections`), composed per job
(`jobs`), loaded from presets, files and overrides (`loader`), flags from the knobs
(`command_line`); the mechanism is `schema`'s."""

from electra_tf.configs.command_line import (TYINGS, define_flags, finetune_config_from_flags,
                                             overrides_from_flags,
                                             pretraining_config_from_flags)
from electra_tf.configs.jobs import FinetuneConfig, PretrainingConfig
from electra_tf.configs.loader import (PRESET_DIR, REQUIREMENTS, load_config,
                                       load_finetune_config, preset_names)
from electra_tf.configs.schema import ConfigError, apply_overrides, parse_overrides
from electra_tf.configs.sections import (GENERATORS, MIN_SEQ_LENGTH, OBJECTIVE_NAMES,
                                         TEMPERATURE_SHAPES, ModelConfig, ObjectiveConfig,
                                         OptimizerConfig, TrainConfig)
