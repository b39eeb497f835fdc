"""electra_tf.quiet: TensorFlow's C++ start-up lines off the console unless asked for."""

import os
import subprocess
import sys

import pytest

from electra_tf import quiet

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Imports TensorFlow the way the CLIs do (through Keras), looks for devices as a strategy
# does, then prints one line of its own to stderr from Python and one from C (os.write).
START = """
import os, sys
import electra_tf
import keras
import tensorflow as tf
from electra_tf.training.tf_runtime.distribute import make_strategy
make_strategy("auto")
print("after", file=sys.stderr, flush=True)
os.write(2, b"native after\\n")
"""


@pytest.mark.subprocess
def test_tensorflows_start_up_lines_only_when_asked():
    env = {k: v for k, v in os.environ.items() if k != quiet.ENV}
    env["KERAS_BACKEND"] = "tensorflow"

    def stderr(extra_env=None, args=()):
        done = subprocess.run([sys.executable, "-c", START, *args], cwd=REPO,
                              env={**env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return [line for line in done.stderr.splitlines()
                if "Strategy OneDeviceStrategy" not in line]

    assert stderr() == ["after", "native after"]  # nothing before, nothing lost after
    # Asked for (the variable here; --verbosity=1 reaches the same `shown`: below).
    asked = stderr({quiet.ENV: "1"})
    assert asked[-2:] == ["after", "native after"] and len(asked) > 2, asked


def test_shown_reads_the_variable_and_the_verbosity(monkeypatch):
    monkeypatch.delenv(quiet.ENV, raising=False)
    assert not quiet.shown(["run.py"])
    assert not quiet.shown(["run.py", "--verbosity=0", "--backend=jax"])
    assert quiet.shown(["run.py", "--verbosity=1"])
    assert quiet.shown(["run.py", "-v", "2"])
    assert quiet.shown(["run.py", "--verbosity", "debug"])
    assert not quiet.shown(["run.py", "--verbosity=-1"])
    monkeypatch.setenv(quiet.ENV, "1")
    assert quiet.shown(["run.py"])
    monkeypatch.setenv(quiet.ENV, "0")
    assert not quiet.shown(["run.py"])
