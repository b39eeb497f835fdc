"""Stateless randomness that does not depend on how a batch is split.

A seed is a [3] int32 tensor (key0, key1, first_row). Every draw's first dimension is
the batch, and row b of a draw is the same numbers as row first_row + b of a draw over
the whole global batch: a replica (or micro-batch) holding rows [r, r + n) draws what
rows r.. of the global draw hold. One device, N replicas and k micro-batches therefore
mask, sample and drop out identically for the same global batch.

Written in `keras.ops`; the generator is the backend's (`electra_tf.kernels`): TensorFlow's
Philox on the TensorFlow backend (every TensorFlow run's numbers), `jax.random` on JAX (its
own stream, equally independent of the split). Tests can record the draws of one backend and
give them to another (`recorded_draws`, `given_draws`).
"""

import contextlib
from typing import List, Optional

import numpy as np
from keras import ops

from electra_tf import kernels as K


def as_seed(seed):
    """[2] or [3] int -> [3] int32 (first_row 0 when not given)."""
    seed = ops.cast(ops.convert_to_tensor(seed), "int32")
    if seed.shape[0] == 2:
        seed = ops.concatenate([seed, ops.zeros((1,), "int32")], 0)
    return seed


def keys_and_row(seed) -> tuple:
    """A [3] seed -> (its [2] keys, its first_row scalar): two ops, not two slices' eight."""
    key0, key1, row = ops.unstack(as_seed(seed))
    return ops.stack([key0, key1]), row


def fold(seed, data):
    """A new independent seed from `seed` and the integer `data`; first_row is kept.
    None (no randomness: inference) stays None."""
    if seed is None:
        return None
    keys, row = keys_and_row(seed)
    return ops.stack([K.drawn_int(keys), ops.cast(data, "int32"), row])


def split(seed, num: int):
    """[num, 3] independent seeds (e.g. masking vs sampling vs dropout)."""
    return ops.stack([fold(seed, i) for i in range(num)])


def offset_rows(seed, rows):
    """The seed of the rows starting `rows` further into the global batch."""
    seed = as_seed(seed)
    return ops.concatenate([seed[:2], seed[2:] + ops.cast(rows, "int32")], 0)


def step_seed(base_seed, step, first_row=0):
    """The seed of one step (e.g. the global step) for the rows from `first_row` of the
    global batch: a replica holding rows [r * b, (r + 1) * b) passes first_row = r * b."""
    return offset_rows(fold(base_seed, step), first_row)


def bits(shape, seed):
    """uint32 random bits of `shape` ([rows, ...], a list of ints or a 1-D int tensor)."""
    return K.bits(shape, as_seed(seed))


def _uniform24(words):
    """float32 on [0, 1) from uint32 words: their 24 high bits (multiples of 2**-24)."""
    return ops.cast(ops.right_shift(words, ops.convert_to_tensor(8, "uint32")),
                    "float32") * (1.0 / (1 << 24))


def uniform(shape, seed):
    """float32 uniform on [0, 1), 24 random bits (multiples of 2**-24)."""
    return _tapped(shape, lambda: _uniform24(bits(shape, seed)))


def uniform_int(shape, seed, maxval: int):
    """int32 uniform on [0, maxval) (maxval < 2**24)."""
    return ops.minimum(ops.cast(ops.floor(uniform(shape, seed) * maxval), "int32"), maxval - 1)


def dropout_uniform(shape, seed):
    """Dropout's float32 uniform draw for a seed: the backend's fast draw where it has one
    (TensorFlow: Philox keyed by the seed and the first row, not row-exact), else `uniform`."""
    if K.dropout_uniform is None:
        return uniform(shape, seed)
    keys, row = keys_and_row(seed)
    return _tapped(shape, lambda: K.dropout_uniform(shape, keys, row))


# --------------------------------------------------------------------------- draws given


_TAP: Optional[dict] = None


@contextlib.contextmanager
def recorded_draws():
    """Every float draw (`uniform`, `uniform_int`'s, dropout's) made inside, in call order:
    yields the list it fills (eager tensors; for `given_draws` on another backend)."""
    global _TAP
    previous, _TAP = _TAP, {"record": []}
    try:
        yield _TAP["record"]
    finally:
        _TAP = previous


@contextlib.contextmanager
def given_draws(draws: List):
    """Inside, each draw is the next of `draws` (arrays) instead of the generator's: the
    same code on another backend sees the same masks, samples and dropout."""
    global _TAP
    previous, _TAP = _TAP, {"replay": list(draws), "next": 0}
    try:
        yield
        if _TAP["next"] != len(_TAP["replay"]):
            raise ValueError(f"{len(_TAP['replay']) - _TAP['next']} given draws were not used")
    finally:
        _TAP = previous


def _tapped(shape, draw):
    if _TAP is None:
        return draw()
    if "record" in _TAP:
        value = draw()
        _TAP["record"].append(np.asarray(ops.convert_to_numpy(value)))
        return value
    i = _TAP["next"]
    if i >= len(_TAP["replay"]):
        raise ValueError(f"draw {i} asked for, {len(_TAP['replay'])} given")
    value = np.asarray(_TAP["replay"][i], np.float32)
    dims = shape if isinstance(shape, (list, tuple)) else ops.convert_to_numpy(shape)
    want = tuple(int(d) for d in dims)
    if value.shape != want:
        raise ValueError(f"given draw {i} has shape {value.shape}, the code asks {want}")
    _TAP["next"] = i + 1
    return ops.convert_to_tensor(value)
