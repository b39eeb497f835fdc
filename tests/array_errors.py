"""How far apart two runs' arrays are: relative error, per array and per kind, as the
JAX-runtime tests hold weights, Adam slots and steps to each other."""

from typing import Dict

import numpy as np


def max_error(ours, theirs):
    """max |ours - theirs| over the array's own scale, max |ours|: relative error, so a
    second moment of 1e-7 is held to its own size (a zero in its place fails)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape
    scale = float(np.max(np.abs(ours)))
    if scale == 0.0:
        return float(np.max(np.abs(theirs)))
    return float(np.max(np.abs(ours - theirs)) / scale)


# The attention's key bias has a zero gradient in exact arithmetic (adding one number to
# every score of a query leaves its softmax unchanged), so its Adam slots hold rounding
# noise (~1e-12 where the other slots reach ~1e-3), and so does the bias itself where it
# starts at zero: they are held to the largest array of their kind instead of to their own
# size. (`key/bias` in variable paths and checkpoint keys.)
NOISE_ONLY = "key/bias"


def errors(want: Dict[str, np.ndarray], got: Dict[str, np.ndarray]) -> Dict[str, float]:
    """{path: `max_error`} over arrays of one kind (weights, m or v)."""
    largest = max(float(np.max(np.abs(w))) for w in want.values())
    out = {}
    for path, value in want.items():
        error = max_error(value, got[path])
        if NOISE_ONLY in path.replace(".S", "/"):  # a checkpoint key escapes / as .S
            error = float(np.max(np.abs(np.asarray(value, np.float64) - got[path]))) / largest
        out[path] = error
    return out
