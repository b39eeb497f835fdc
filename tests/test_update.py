"""The update written once (`training/update.py`), through both runtimes' wrappers, against
an independent float64 NumPy reference (`update_cases.py`): AdamW and LAMB, bias correction,
weight decay and its exclusions, a layer-wise rate, clipping, float16's loss scale and the
non-finite skip. Compared element by element by relative error, so that a slot of 1e-7 is
held to its own digits (|difference| / max(1, |reference|) would pass it at 1e-4 even if
it were zero)."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import update_cases

HERE = os.path.dirname(os.path.abspath(__file__))
RTOL = 2e-5  # float32 arithmetic against float64: seen up to ~3e-6


def relative_error(got, want) -> float:
    """max |got - want| / |want| over the elements (0/0 counts as 0, x/0 as inf)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.abs(want))
    return float(np.max(rel))


def check(name, got):
    want = update_cases.reference(update_cases.CASES[name])
    assert got["trace"] == want["trace"], name  # steps applied and the loss scale
    for key in ("m", "v"):  # the slots: element by element
        for i, (a, b) in enumerate(zip(got[key], want[key])):
            assert relative_error(a, b) <= RTOL, (name, key, i, relative_error(a, b))
    # the weights: against each array's scale (an element near 0 is a difference of
    # numbers ~0.1 whose float32 rounding it keeps)
    for i, (a, b) in enumerate(zip(got["params"], want["params"])):
        err = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        assert err <= RTOL, (name, "params", i, err)
    # the slots hold something: a zero second moment would fail above, not pass
    assert min(float(np.min(np.abs(v))) for v in want["v"]) > 0


def test_relative_error_holds_small_numbers_to_their_digits():
    assert relative_error([1e-7], [1e-7]) == 0.0
    assert relative_error([0.0], [1e-7]) == 1.0  # a zero slot fails at any tolerance
    assert relative_error([1.0001e-7], [1e-7]) == pytest.approx(1e-4)


def test_the_reference_exercises_what_it_claims():
    """The float16 cases halve the scale on their non-finite step and double it after
    GROWTH good ones; the skipped step applies nothing."""
    trace = update_cases.reference(update_cases.CASES["lamb_float16_skip"])["trace"]
    assert trace == [(1, 2.0 ** 15), (2, 2.0 ** 16), (2, 2.0 ** 15), (3, 2.0 ** 15),
                     (4, 2.0 ** 16)]
    plain = update_cases.reference(update_cases.CASES["adamw_official"])["trace"]
    assert [s for s, _ in plain] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("name", sorted(update_cases.CASES))
def test_tensorflow_runtime_update_equals_numpy(name):
    check(name, update_cases.run(update_cases.CASES[name]))


@pytest.fixture(scope="module")
def jax_results(tmp_path_factory):
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("update") / "jax.pkl"
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, os.path.join(HERE, "update_cases.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out, "rb") as f:
        return pickle.load(f)


@pytest.mark.subprocess
@pytest.mark.jax
@pytest.mark.parametrize("name", sorted(update_cases.CASES))
def test_jax_runtime_update_equals_numpy(jax_results, name):
    check(name, jax_results[name])
