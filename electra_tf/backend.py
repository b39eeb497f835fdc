"""Which runtime a run executes on: `--backend` (tensorflow or jax) on both CLIs, which sets
`KERAS_BACKEND` before Keras is imported; `KERAS_BACKEND` alone works too (the flag wins
and says so when they differ). TensorFlow is the default. Nothing here imports Keras."""

import importlib.util
import os
import sys
from typing import List, Optional

BACKENDS = ("tensorflow", "jax")
DEFAULT = "tensorflow"


def _installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def default() -> str:
    """The runtime when neither --backend nor KERAS_BACKEND names one: TensorFlow, or JAX
    on a machine that has JAX and no TensorFlow (the `.[jax]` install)."""
    if not _installed("tensorflow") and _installed("jax"):
        return "jax"
    return DEFAULT


def set_default():
    """KERAS_BACKEND=jax where it is unset and only JAX is installed, before Keras loads
    (`import electra_tf` does this: every command, the converters and scorers too, runs
    where only JAX is; elsewhere Keras' own default, TensorFlow, stands)."""
    if not os.environ.get("KERAS_BACKEND") and "keras" not in sys.modules and \
            default() == "jax":
        os.environ["KERAS_BACKEND"] = "jax"


class BackendError(ValueError):
    """A backend that cannot be used, as one line."""


def from_argv(argv: List[str]) -> Optional[str]:
    """The value of --backend in `argv` (`--backend=X` or `--backend X`), or None."""
    for i, arg in enumerate(argv):
        if arg.startswith("--backend="):
            return arg.split("=", 1)[1]
        if arg == "--backend" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def select(argv: Optional[List[str]] = None) -> str:
    """Sets KERAS_BACKEND from --backend in `argv` (default sys.argv) before Keras loads;
    -> the backend the run will use. Call before importing anything that imports Keras."""
    flag = from_argv(sys.argv if argv is None else argv)
    env = os.environ.get("KERAS_BACKEND")
    chosen = flag or env or default()
    if chosen not in BACKENDS:
        source = "--backend" if flag else "KERAS_BACKEND"
        raise BackendError(f"{source}={chosen}: expected one of {', '.join(BACKENDS)}")
    loaded = sys.modules.get("keras")
    if loaded is not None and flag:
        current = loaded.backend.backend()
        if current != chosen:
            raise BackendError(f"--backend={chosen}: Keras is already loaded with the "
                               f"{current} backend in this process")
    os.environ["KERAS_BACKEND"] = chosen
    return chosen


def current() -> str:
    """The backend Keras runs on (imports Keras)."""
    import keras
    return keras.backend.backend()


def require_jax():
    """-> the jax module, or a one-line BackendError saying how to install it."""
    try:
        import jax
    except ImportError:
        raise BackendError("--backend=jax: JAX is not installed: pip install -e \".[jax]\" "
                           "(CPU), or the GPU/TPU lines of the README's Platforms table")
    return jax


def _needs_tensorflow(what: str) -> str:
    return f"{what} needs TensorFlow, which is not installed: pip install -e \".[tensorflow]\""


def tensorflow_missing(what: str) -> Optional[str]:
    """None where TensorFlow is installed (found, not imported), else the one line saying
    that `what` needs it and how to install it."""
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else _needs_tensorflow(what)


def require_tensorflow(what: str):
    """-> the tensorflow module, or a one-line BackendError saying that `what` (a feature
    that is TensorFlow by nature: SavedModels, TFDS, the TF1 layout) needs it and how to
    install it."""
    try:
        import tensorflow as tf
    except ImportError:
        raise BackendError(_needs_tensorflow(what)) from None
    return tf
