"""Configuration: one frozen dataclass per concern (`sections`), composed per job (`jobs`),
loaded from presets, files, overrides and flags (`loader`); knobs declared once (`schema`)."""

from electra_tf.configs.jobs import FinetuneConfig, PretrainingConfig
from electra_tf.configs.loader import (PRESET_DIR, TYINGS, config_from_flags, load_config,
                                       preset_names)
from electra_tf.configs.schema import ConfigError, apply_overrides, define_flags, parse_overrides
from electra_tf.configs.sections import (OBJECTIVE_NAMES, ModelConfig, ObjectiveConfig,
                                         OptimizerConfig, TrainConfig)
