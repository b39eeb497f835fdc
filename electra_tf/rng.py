"""Stateless randomness that does not depend on how a batch is split.

A seed is a [3] int32 tensor (key0, key1, first_row). Every draw's first dimension is
the batch, and row b of a draw is the same numbers as row first_row + b of a draw over
the whole global batch: a replica (or micro-batch) holding rows [r, r + n) draws what
rows r.. of the global draw hold. One device, N replicas and k micro-batches therefore
mask, sample and drop out identically for the same global batch.

Written in `keras.ops`. Masking's and sampling's draws come from the backend's generator
(`electra_tf.kernels`): TensorFlow's Philox on the TensorFlow backend, `jax.random` on JAX
(its own stream, equally independent of the split). Folding a seed and dropout's draws are
integer hashing in `keras.ops` (`_mix`): the same numbers on every backend, a few ops an
element, where a generator's draw compiles to hundreds of instructions a site under XLA
(a step has some 5 + 4 x layers of them per network). Tests can record the draws of one
backend and give them to another (`recorded_draws`, `given_draws`).
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
    """A new independent seed from `seed` and the integer `data`; first_row is kept. `data`
    a 1-D int array gives [n, 3] seeds, one a value (one chain of ops for all: `split`).
    None (no randomness: inference) stays None. Integer hashing in `keras.ops` (`_mix`),
    the same numbers on every backend and a few vector ops where a generator's draw
    expands to hundreds of instructions under XLA."""
    if seed is None:
        return None
    key0, key1, row = ops.unstack(as_seed(seed))
    k0, k1 = _u32(key0), _u32(key1)
    new0 = _mix(ops.bitwise_xor(_mix(_mix(k1) + _u32(data)), k0))
    new1 = _mix(ops.bitwise_xor(new0, k1) + _const(_SALT))
    new0, new1 = _i32(new0), _i32(new1)
    return ops.stack([new0, new1, ops.broadcast_to(row, ops.shape(new0))], axis=-1)


def split(seed, num: int):
    """[num, 3] independent seeds (e.g. masking vs sampling vs dropout): the folds of
    0 .. num - 1."""
    return fold(seed, ops.arange(num, dtype="int32"))


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
    """Dropout's float32 uniform draw on [0, 1) (24 bits), row-exact as `uniform` and the
    same numbers on every backend: each element hashed (`_mix`, twice) from its index in
    its row and two words keyed by the seed and the row's global index. About 20 integer
    ops an element, fused into the mask's consumer under XLA, where a counter-based
    generator's rounds are some 100 and compile to hundreds of instructions a draw site;
    dropout needs independence between elements, not a cipher's strength."""
    return _tapped(shape, lambda: _uniform24(_hashed_bits(shape, seed)))


def _hashed_bits(shape, seed):
    keys, row = keys_and_row(seed)
    k0, k1 = _u32(keys[0]), _u32(keys[1])
    if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape):
        rows, inner = shape[0], [int(d) for d in shape[1:]]
        per_row, rank = (int(np.prod(inner)) if inner else 1), len(shape)
    else:  # a 1-D int tensor (TensorFlow's dynamic shapes)
        shape = ops.cast(ops.convert_to_tensor(shape), "int32")
        rows, inner = shape[0], shape[1:]
        per_row, rank = ops.prod(inner), int(shape.shape[0])
    global_rows = _u32(row + ops.arange(rows, dtype="int32"))             # [R]
    a = _mix(_mix(ops.bitwise_xor(global_rows, k0)) + k1)
    b = _mix(ops.bitwise_xor(a, k1) + _const(_SALT))
    index = ops.reshape(_u32(ops.arange(per_row, dtype="int32")), inner)  # row's elements
    a = ops.reshape(a, [-1] + [1] * (rank - 1))
    b = ops.reshape(b, [-1] + [1] * (rank - 1))
    return _mix(_mix(ops.bitwise_xor(index[None], a)) + b)


# --------------------------------------------------------------------------- hashing

# "lowbias32" (C. Wellons' hash-prospector): xorshift-multiply rounds, a bijection of the
# uint32s with a measured bias of 0.17 (an ideal hash ~0.02, MurmurHash3's finaliser 0.26).
_M1, _M2 = 0x7FEB352D, 0x846CA68B
_SALT = 0x9E3779B9  # 2**32 / golden ratio: keeps the two words of a key apart


def _const(value):
    return ops.convert_to_tensor(value, "uint32")


def _u32(x):
    """int32 -> uint32, the same bits (wrapping casts on every backend)."""
    return ops.cast(ops.convert_to_tensor(x), "uint32")


def _i32(x):
    """uint32 -> int32, the same bits."""
    return ops.cast(x, "int32")


def _mix_ops(x):
    """uint32 -> uint32, a bijection whose every output bit depends on every input bit."""
    x = ops.bitwise_xor(x, ops.right_shift(x, _const(16)))
    x = x * _const(_M1)
    x = ops.bitwise_xor(x, ops.right_shift(x, _const(15)))
    x = x * _const(_M2)
    return ops.bitwise_xor(x, ops.right_shift(x, _const(16)))


# One op in a TensorFlow graph (cheap to trace), `_mix_ops` itself on JAX.
_mix = K.single_op(_mix_ops, "uint32")


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
