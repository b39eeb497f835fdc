"""The CLIs' config flags, defined from the knobs (`schema.knob`: a flag per knob with
help for the job, default None: the config's value), and the config they give."""

from absl import flags

from electra_tf.configs.jobs import FinetuneConfig, PretrainingConfig
from electra_tf.configs.loader import load_config, load_finetune_config
from electra_tf.configs.schema import flag_help, kind, knobs, parse_overrides

# --generator_tying -> (model.tie_embeddings, model.tie_all_weights,
# model.disentangled_embeddings)
_TYING = {"none": ("false", "false", "false"), "embeddings": ("true", "false", "false"),
          "all": ("true", "true", "false"), "gdes": ("true", "false", "true")}
TYINGS = tuple(_TYING)
_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool,
           str: flags.DEFINE_string}


def define_flags(cls):
    """DEFINEs the flags of job config `cls` (PretrainingConfig, FinetuneConfig)."""
    for _, f in knobs(cls):
        help_ = flag_help(f, cls.JOB)
        check = f.metadata.get("check")
        if help_ and check and check.choices:
            flags.DEFINE_enum(f.name, None, list(check.choices), help_)
        elif help_:
            _DEFINE[kind(f)[0]](f.name, None, help_)


def overrides_from_flags(flag_values, cls) -> dict:
    """--params_override, then every flag of `cls`'s knobs the user set (flags left at
    None keep the config's value), then --generator_tying."""
    overrides = parse_overrides(flag_values.params_override)
    overrides.update({key: str(getattr(flag_values, f.name)) for key, f in knobs(cls)
                      if flag_help(f, cls.JOB) and getattr(flag_values, f.name) is not None})
    tying = getattr(flag_values, "generator_tying", None)
    if tying:
        (overrides["model.tie_embeddings"], overrides["model.tie_all_weights"],
         overrides["model.disentangled_embeddings"]) = _TYING[tying]
    return overrides


def pretraining_config_from_flags(flag_values) -> PretrainingConfig:
    """run_pretraining.py's config: --config, --params_override, then the flags."""
    return load_config(flag_values.config, overrides_from_flags(flag_values,
                                                                PretrainingConfig))


def finetune_config_from_flags(flag_values) -> FinetuneConfig:
    """run_finetuning.py's hyper-parameters: --finetune_config, --params_override, then
    the flags."""
    return load_finetune_config(flag_values.finetune_config,
                                overrides_from_flags(flag_values, FinetuneConfig))
