"""The config mechanism: a knob (a field with its check and its flags, declared once),
checking a config's knobs, its flags, and overrides by `section.key` or a bare key.

No TensorFlow import here: the CLIs define their flags before TensorFlow loads."""

import dataclasses
import typing
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Tuple

from absl import flags


class ConfigError(ValueError):
    """A bad preset, key or value; the message is one line."""


class Check(NamedTuple):
    """A knob's own rule: `ok(value)`, else the error is `<key>=<value><tail>`."""
    ok: Callable[[Any], bool]
    tail: str
    choices: Optional[Tuple[str, ...]] = None  # a flag of these values is an enum


AT_LEAST_1 = Check(lambda v: v >= 1, " must be at least 1")
POSITIVE = Check(lambda v: v > 0, " must be > 0")
DROPOUT = Check(lambda v: 0 <= v < 1, " must be in [0, 1)")


def one_of(*choices: str) -> Check:
    return Check(lambda v: v in choices, f": expected one of {', '.join(choices)}", choices)


SKIP_OR_STOP = one_of("skip", "stop")


def knob(default, check: Optional[Check] = None, flag: Optional[str] = None, **job_flags):
    """A config field declared once: its default, its `check`, and its command-line flag
    (named as the field, default None: the config's value): `flag` is its help in every
    job whose config holds the section, `pretraining=` / `finetune=` its help in one."""
    return dataclasses.field(default=default, metadata={
        "check": check, "flags": {**({"*": flag} if flag else {}), **job_flags}})


def flag_help(f: dataclasses.Field, job: Optional[str]) -> Optional[str]:
    """The help of knob `f`'s flag in `job`, None where it has no flag there."""
    helps = f.metadata.get("flags", {})
    return helps.get(job, helps.get("*"))


def knobs(cls, prefix: str = "") -> Iterator[Tuple[str, dataclasses.Field]]:
    """(key, field) of every knob of config class `cls`, its sections' as `section.name`."""
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default):
            yield from knobs(type(f.default), f"{f.name}.")
        else:
            yield prefix + f.name, f


def kind(f: dataclasses.Field) -> Tuple[type, bool]:
    """(the type of knob `f`, whether None is allowed: `Optional[float]`)."""
    args = [a for a in typing.get_args(f.type) if a is not type(None)]
    return (args[0], True) if args else (f.type, False)


def check_knobs(cfg, job: Optional[str] = None, prefix: str = ""):
    """Each knob's own check (None passes: the job resolves it), named by its `job` flag or key."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(f.default):
            check_knobs(value, job, f"{f.name}.")
            continue
        check = f.metadata.get("check")
        if check and value is not None and not check.ok(value):
            name = f"--{f.name}" if flag_help(f, job) else prefix + f.name
            raise ConfigError(f"{name}={value!r}{check.tail}")


def _coerce(value: Any, f: dataclasses.Field, key: str) -> Any:
    """A JSON or command-line value as the knob's type (`none`/null: None if allowed)."""
    kind_, optional = kind(f)
    if optional and (value is None or (isinstance(value, str) and
                                       value.strip().lower() in ("none", "null"))):
        return None
    if isinstance(value, str) and kind_ is not str:
        text = value.strip()
        if kind_ is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ConfigError(f"{key}={value!r}: expected true or false")
        try:
            return kind_(float(text)) if kind_ is int and "e" in text.lower() else kind_(text)
        except ValueError:
            raise ConfigError(f"{key}={value!r}: expected a {kind_.__name__}") from None
    if kind_ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind_ is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, kind_) or (kind_ is int and isinstance(value, bool)):
        raise ConfigError(f"{key}={value!r}: expected a {kind_.__name__}")
    return value


def resolve_key(cls, key: str) -> Tuple[Optional[str], str]:
    """'section.name', or a name unique in config class `cls` -> (section or None, name)."""
    keys = [k for k, _ in knobs(cls)]
    section, dot, name = key.partition(".")
    if dot:
        sections = list(dict.fromkeys(k.split(".")[0] for k in keys if "." in k))
        if section not in sections:
            raise ConfigError(f"unknown config section {section!r}; valid: "
                              f"{', '.join(sections)}")
        if key not in keys:
            raise ConfigError(f"unknown key {key!r}; valid keys of {section}: " + ", ".join(
                k.split(".")[1] for k in keys if k.startswith(section + ".")))
        return section, name
    owners = [k.rpartition(".")[0] or None for k in keys if k.rpartition(".")[2] == key]
    if not owners:
        raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(keys)}")
    if len(owners) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous; write one of "
                          f"{', '.join(f'{s}.{key}' for s in owners)}")
    return owners[0], key


def apply_overrides(cfg, overrides: Dict[str, Any]):
    """`cfg` with {key: value} applied (keys as `resolve_key`), values as the knobs' types."""
    changes: Dict[Optional[str], Dict[str, Any]] = {}
    for key, value in overrides.items():
        section, name = resolve_key(type(cfg), key)
        changes.setdefault(section, {})[name] = value

    def replaced(obj, values, prefix):
        fields = {f.name: f for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **{n: _coerce(v, fields[n], prefix + n)
                                           for n, v in values.items()})
    sections = {s: replaced(getattr(cfg, s), kv, f"{s}.") for s, kv in changes.items() if s}
    return dataclasses.replace(replaced(cfg, changes.get(None, {}), ""), **sections)


def parse_overrides(text: str) -> Dict[str, str]:
    """'a=1,b.c=2' -> {'a': '1', 'b.c': '2'} (the --params_override syntax)."""
    out = {}
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        if "=" not in item:
            raise ConfigError(f"--params_override: {item!r} is not key=value")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def define_flags(cls, flag_values=flags.FLAGS):
    """DEFINEs the flags of `cls`'s knobs: a job config's (help for `cls.JOB`) with default
    None, the config's value; an options class's with the field's default."""
    job = getattr(cls, "JOB", None)
    for _, f in knobs(cls):
        help_, check = flag_help(f, job), f.metadata.get("check")
        choices = {"enum_values": list(check.choices)} if check and check.choices else {}
        define = flags.DEFINE_enum if choices else {
            int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool,
            str: flags.DEFINE_string}[kind(f)[0]]
        if help_:
            define(name=f.name, default=None if job else f.default, help=help_,
                   flag_values=flag_values, **choices)
