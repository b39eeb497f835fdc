"""JAX's persistent compilation cache, on by default for the JAX runtime, and what the
compiles of a run cost.

A run's first host loop compiles its step (a minute or more for ELECTRA-Base on a GPU);
a rerun, a resume after preemption or the next fine-tuning trial of the same shapes reads
the compiled program from the cache instead. The directory:
- `JAX_COMPILATION_CACHE_DIR` (JAX's own setting) where it is set: used as it is, with
  JAX's own bound (none by default: no locks);
- else `ELECTRA_TF_COMPILATION_CACHE`: a local directory, or `off` (also `0`, `false`,
  `no`, empty) for none;
- else `$XDG_CACHE_HOME/electra_tf/jax`, `~/.cache/electra_tf/jax` without it.
Several processes may share this project's directory (the processes of one host,
concurrent runs): where the `filelock` package is installed the cache is bounded
(`MAX_BYTES`, least recently used entries evicted), which makes JAX take a file lock
around every read and write, so that no process reads an entry another is still writing.
The bound is not put on a directory JAX_COMPILATION_CACHE_DIR names: JAX's eviction reads
an access-time file that an unbounded writer does not write, and fails on that entry. A program compiled in under a second
is not stored (JAX's threshold): it costs less to compile than to read.

`CompileWatch` listens to JAX's monitoring events: compile seconds and cache hits and
misses since a mark, for the log line after the first host loop.
"""

import importlib.util
import os
import threading
from typing import Dict, Mapping, Optional

ENV = "ELECTRA_TF_COMPILATION_CACHE"
OFF = ("", "0", "off", "false", "no")
MAX_BYTES = 8 << 30  # 8 GiB: ~100 ELECTRA-Base step programs


class CacheSettingError(ValueError):
    """A compilation-cache setting that cannot be used; the message is one line."""


def cache_dir(environ: Mapping[str, str]) -> Optional[str]:
    """The directory ELECTRA_TF_COMPILATION_CACHE and the defaults name, or None: off."""
    value = environ.get(ENV)
    if value is not None:
        if value.strip().lower() in OFF:
            return None
        if "://" in value:
            raise CacheSettingError(f"{ENV}={value}: JAX's compilation cache takes a local "
                                    f"directory (or off)")
        return os.path.expanduser(value)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "electra_tf", "jax")  # local: JAX's cache reads local files


def configure(jax, environ: Mapping[str, str] = os.environ) -> str:
    """Turns the cache on as the module's docstring says; -> the log line's description."""
    given = jax.config.jax_compilation_cache_dir
    if given:  # JAX's own settings, as they are (other JAX programs may share it)
        bound = jax.config.jax_compilation_cache_max_size
        return f"{given} (JAX_COMPILATION_CACHE_DIR; " + (
            "unbounded)" if bound == -1 else f"at most {bound / 2**30:.3g} GiB)")
    directory = cache_dir(environ)
    if directory is None:
        return f"off ({ENV}={environ.get(ENV)})"
    try:
        os.makedirs(directory, exist_ok=True)  # local: see cache_dir
    except OSError as e:
        return f"off: cannot create {directory} ({e.strerror or e}); set {ENV}"
    jax.config.update("jax_compilation_cache_dir", directory)
    how = f"{ENV}=off turns it off"
    if importlib.util.find_spec("filelock") is None:
        return (f"{directory} ({how}; unbounded, without file locks: pip install filelock "
                "to share it between processes)")
    # Bounded, every entry read and written under JAX's file lock. The directory is this
    # project's alone: JAX's eviction reads each entry's access time, which an unbounded
    # writer (another program pointed at it) does not record.
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return (f"{directory} ({how}; at most {MAX_BYTES >> 30} GiB, entries locked for several "
            "processes)")


# JAX's monitoring events (jax/_src/monitoring.py names): the seconds of each compile and
# whether the persistent cache served it.
_COMPILE_DURATIONS = ("/jax/core/compile/jaxpr_trace_duration",
                      "/jax/core/compile/jaxpr_to_mlir_module_duration",
                      "/jax/core/compile/backend_compile_duration")
_HITS, _MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"


class CompileWatch:
    """Totals of JAX's compile events in this process (listeners registered once)."""

    _lock = threading.Lock()
    _totals: Dict[str, float] = {"compile_s": 0.0, "hits": 0, "misses": 0}
    _listening = False

    @classmethod
    def start(cls, jax) -> None:
        with cls._lock:
            if cls._listening:
                return
            cls._listening = True
        jax.monitoring.register_event_duration_secs_listener(cls._on_duration)
        jax.monitoring.register_event_listener(cls._on_event)

    @classmethod
    def _on_duration(cls, name, seconds, **_):
        if name in _COMPILE_DURATIONS:
            with cls._lock:
                cls._totals["compile_s"] += seconds

    @classmethod
    def _on_event(cls, name, **_):
        key = {_HITS: "hits", _MISSES: "misses"}.get(name)
        if key:
            with cls._lock:
                cls._totals[key] += 1

    @classmethod
    def mark(cls) -> Dict[str, float]:
        with cls._lock:
            return dict(cls._totals)

    @classmethod
    def since(cls, mark: Dict[str, float]) -> str:
        """"compiling 41.2 s; persistent cache: 1 hit, 2 misses" since `mark`."""
        now = cls.mark()
        hits, misses = int(now["hits"] - mark["hits"]), int(now["misses"] - mark["misses"])
        cache = (f"persistent cache: {hits} hit{'s' * (hits != 1)}, {misses} "
                 f"miss{'es' * (misses != 1)}" if hits or misses else
                 "no persistent cache lookups")
        return f"compiling {now['compile_s'] - mark['compile_s']:.1f} s; {cache}"
