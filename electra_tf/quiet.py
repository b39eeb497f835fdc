"""TensorFlow's start-up lines kept off the console. Importing TensorFlow, and its first
look for devices, print C++ log lines straight to file descriptor 2 (oneDNN notices, "Could
not find cuda drivers", the CPU's instruction sets, `E0000 ... failed call to cuInit` on a
machine without a GPU) that `TF_CPP_MIN_LOG_LEVEL` does not silence: they come before
TensorFlow's logging is set up, and read as failures. `quiet_native_stderr` sends fd 2 to
/dev/null around those two moments; Python's own messages and everything after them reach
the console as before. `ELECTRA_TF_SHOW_STARTUP_LOGS=1`, or a `--verbosity` of 1 or more
on the command line, shows them."""

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
from typing import Iterator, List, Optional

ENV = "ELECTRA_TF_SHOW_STARTUP_LOGS"


def shown(argv: Optional[List[str]] = None) -> bool:
    """Whether the start-up lines are asked for: the environment variable, or absl's
    `--verbosity` / `-v` at 1 or more in `argv` (default sys.argv)."""
    if os.environ.get(ENV, "") not in ("", "0"):
        return True
    argv = sys.argv if argv is None else argv
    for i, arg in enumerate(argv):
        value = None
        if arg.startswith(("--verbosity=", "-v=")):
            value = arg.split("=", 1)[1]
        elif arg in ("--verbosity", "-v") and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None:
            try:
                return int(value) >= 1
            except ValueError:
                return value.lower() in ("debug", "info")
    return False


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """File descriptor 2 on /dev/null inside the block (unless `shown()`): what native code
    writes there is dropped. A Python exception raised inside still prints after the block,
    with fd 2 restored."""
    if shown():
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 (an embedded interpreter)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)  # /dev/null, not a user path
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # a closed or broken sys.stderr: fd 2 is restored all the same
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow():
    """`import tensorflow` without its start-up lines; -> the module."""
    with quiet_native_stderr():
        import tensorflow as tf
    return tf


class _QuietLoader(importlib.abc.Loader):
    """A module's loader whose `exec_module` runs inside `quiet_native_stderr`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        uninstall()  # once: later imports find the loaded module
        try:
            with quiet_native_stderr():
                self._loader.exec_module(module)
        finally:  # the module keeps its own loader
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` as the path finder would, with a `_QuietLoader` (also for
    `importlib.util.find_spec`, which loads nothing), until it is loaded."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def install():
    """Makes the process's first `import tensorflow`, wherever it happens, quiet (unless
    `shown()`); nothing once TensorFlow is loaded."""
    if "tensorflow" in sys.modules or shown() or any(
            isinstance(f, _QuietFirstImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietFirstImport())


def uninstall():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _QuietFirstImport)]
