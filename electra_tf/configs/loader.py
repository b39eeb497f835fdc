"""Loading a job's config: the presets in `configs/*.json`, a JSON file on any filesystem,
`--params_override`, the flags, what the objective requires; unknown keys list valid ones."""

import dataclasses
import json
import os
from typing import Any, Dict, Optional, Union

from absl import logging

from electra_tf.configs.jobs import PretrainingConfig
from electra_tf.configs.schema import (ConfigError, apply_overrides, flag_help, knobs,
                                       parse_overrides, resolve_key)
from electra_tf.objective_specs import SPECS

# Repo-internal presets (local, next to this package); user config files go through
# TensorFlow's filesystem layer (`load_config`).
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESET_DIR = os.path.join(_REPO, "configs")

Overrides = Optional[Union[str, Dict[str, Any]]]


def _flatten(data: Dict[str, Any], where: str, cls) -> Dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    sections = {f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(f.default)}
    flat = {}
    for key, value in data.items():
        if key in sections:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: section {key!r} must be a JSON object")
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        elif key not in ("description", "_comment"):
            flat[key] = value
    return flat


def preset_names():
    return sorted(f[:-5] for f in os.listdir(PRESET_DIR)  # local: repo-internal presets
                  if f.endswith(".json"))


def _read_config_file(name_or_path: str, flag: str, cls) -> Dict[str, Any]:
    """The keys of a preset name (configs/NAME.json) or a JSON path (any filesystem
    `fileio` reads: local, gs://...), flattened to `section.key`."""
    from electra_tf import fileio
    path = name_or_path
    try:
        found = fileio.exists(path)
    except OSError as e:  # e.g. an unreachable bucket
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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{flag} {path}: {fileio.error_reason(e)}") from None
    return _flatten(data, path, cls)


# (config key, value) -> what it needs of the model, (key, value, the flag that sets it):
# the objectives' spec `requirements`; a fixed generator shares no trained embeddings.
REQUIREMENTS = {
    **{("objective.objective", s.name): s.requirements for s in SPECS.values()
       if s.requirements},
    ("objective.generator", "fixed"): (
        ("model.tie_embeddings", False, "--generator_tying=none"),
        ("model.tie_all_weights", False, "--generator_tying=none"),
        ("model.disentangled_embeddings", False, "--generator_tying=none")),
}


def _requirements(cfg: PretrainingConfig, explicit) -> PretrainingConfig:
    """Sets what the objective and generator require (REQUIREMENTS), logging each change; a
    conflicting value the user gave (in `explicit`) is a ConfigError naming the fixing flag."""
    get = lambda key: getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1])
    changes = {}
    for (trigger, trigger_value), needs in REQUIREMENTS.items():
        if get(trigger) != trigger_value:
            continue
        for key, value, flag in needs:
            current = get(key)
            if current == value:
                continue
            if key in explicit:
                raise ConfigError(f"{trigger}={trigger_value} needs {key}={value} but it is "
                                  f"set to {current}: use {flag}")
            logging.info("%s=%s: setting %s=%s (was %s)", trigger, trigger_value, key, value,
                         current)
            changes[key] = value
    return apply_overrides(cfg, changes) if changes else cfg


def load_config(name_or_path: Optional[str] = "tiny", overrides: Overrides = None,
                cls=PretrainingConfig):
    """A job's config, checked: its defaults, a preset or JSON file, the overrides, then
    (pre-training) what the objective requires (`REQUIREMENTS`)."""
    cfg = cls()
    if name_or_path:
        cfg = apply_overrides(cfg, _read_config_file(name_or_path, f"--{cls.FILE_FLAG}", cls))
    if isinstance(overrides, str):
        overrides = parse_overrides(overrides)
    cfg = apply_overrides(cfg, overrides or {})
    if cls is PretrainingConfig:
        cfg = _requirements(cfg, {"%s.%s" % resolve_key(cls, k) for k in overrides or {}})
    return cfg.check()


# --generator_tying -> (model.tie_embeddings, model.tie_all_weights,
# model.disentangled_embeddings)
TYINGS = {"none": ("false", "false", "false"), "embeddings": ("true", "false", "false"),
          "all": ("true", "true", "false"), "gdes": ("true", "false", "true")}


def config_from_flags(flag_values, cls, default_file: Optional[str] = None):
    """A CLI's config: its file flag (else `default_file`), --params_override, then the
    flags the user set (those left at None keep the config's value) and --generator_tying."""
    overrides = parse_overrides(flag_values.params_override)
    overrides.update({key: str(getattr(flag_values, f.name)) for key, f in knobs(cls)
                      if flag_help(f, cls.JOB) and getattr(flag_values, f.name) is not None})
    tying = getattr(flag_values, "generator_tying", None)
    if tying:
        (overrides["model.tie_embeddings"], overrides["model.tie_all_weights"],
         overrides["model.disentangled_embeddings"]) = TYINGS[tying]
    return load_config(getattr(flag_values, cls.FILE_FLAG) or default_file, overrides, cls)
