"""Stateless randomness that does not depend on how a batch is split.

A seed is a [3] int32 tensor (key0, key1, first_row). Every draw's first dimension is
the batch, and row b of a draw is the same numbers as row first_row + b of a draw over
the whole global batch: Philox is counter based, so a replica (or micro-batch) holding
rows [r, r + n) starts its counter r rows in. One device, N replicas and k micro-batches
therefore mask, sample and drop out identically for the same global batch.
"""

import numpy as np
import tensorflow as tf
# No public API: the key/counter derivation TF's own stateless ops use for Philox.
from tensorflow.python.ops import random_ops_util

from electra_tf import compat

_PHILOX = 1  # the `alg` enum of the V2 stateless random ops


def philox_key_counter(seed2):
    """(key [1], counter [2]) uint64 of Philox for a [2] int seed: TF's scrambling, as its
    stateless ops do with alg="philox". Eager and in graphs one op, where TF's Python form
    is ~40 (each a trace and graph-optimisation cost: a step calls this ~60 times). Not
    under XLA (jit_compile, TPU), whose kernel for that op scrambles negative seeds
    otherwise (and picks another generator on a TPU): there the Python form."""
    if compat.in_xla_trace():
        key, counter, _ = random_ops_util.get_key_counter_alg(seed2, "philox")
        return key, counter
    return tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed2)


def fold_in(seed2, data) -> tf.Tensor:
    """`tf.random.experimental.stateless_fold_in(seed2, data, alg="philox")` for int32
    `data`: [a draw keyed by seed2, data]."""
    return tf.stack([_drawn_int(seed2), tf.cast(data, tf.int32)])


def _drawn_int(seed2) -> tf.Tensor:
    key, counter = philox_key_counter(seed2)
    return tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=tf.constant([], tf.int32), key=key, counter=counter, alg=_PHILOX, dtype=tf.int32)


def philox_uniform(shape, seed2) -> tf.Tensor:
    """`tf.random.stateless_uniform(shape, seed2, tf.float32, alg="philox")`: float32
    on [0, 1), TF's own draw (not row-exact: see `uniform`)."""
    key, counter = philox_key_counter(seed2)
    return tf.raw_ops.StatelessRandomUniformV2(shape=shape, key=key, counter=counter,
                                               alg=_PHILOX, dtype=tf.float32)


def as_seed(seed) -> tf.Tensor:
    """[2] or [3] int -> [3] int32 (first_row 0 when not given)."""
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int32)
    if seed.shape[0] == 2:
        seed = tf.concat([seed, [0]], 0)
    return seed


def keys_and_row(seed) -> tuple:
    """A [3] seed -> (its [2] keys, its first_row scalar): two ops, not two slices' eight."""
    key0, key1, row = tf.unstack(as_seed(seed))
    return tf.stack([key0, key1]), row


def fold(seed, data) -> tf.Tensor:
    """A new independent seed from `seed` and the integer `data`; first_row is kept.
    None (no randomness: inference) stays None."""
    if seed is None:
        return None
    keys, row = keys_and_row(seed)
    return tf.stack([_drawn_int(keys), tf.cast(data, tf.int32), row])  # fold_in's, + row


def split(seed, num: int) -> tf.Tensor:
    """[num, 3] independent seeds (e.g. masking vs sampling vs dropout)."""
    return tf.stack([fold(seed, i) for i in range(num)])


def offset_rows(seed, rows) -> tf.Tensor:
    """The seed of the rows starting `rows` further into the global batch."""
    seed = as_seed(seed)
    return tf.concat([seed[:2], seed[2:] + tf.cast(rows, tf.int32)], 0)


def step_seed(base_seed, step, first_row=0) -> tf.Tensor:
    """The seed of one step (e.g. the global step) for the rows from `first_row` of the
    global batch: a replica holding rows [r * b, (r + 1) * b) passes first_row = r * b."""
    return offset_rows(fold(base_seed, step), first_row)


def bits(shape, seed) -> tf.Tensor:
    """uint32 random bits of `shape` ([rows, ...], a list of ints or a 1-D int tensor)."""
    seed = as_seed(seed)
    static = isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape)
    if static:
        rows, per_row = shape[0], int(np.prod(shape[1:]))
        padded = -(-per_row // 4) * 4  # whole Philox blocks (4 words) per row
        out_shape = [rows, padded]
    else:
        shape = tf.cast(tf.convert_to_tensor(shape), tf.int32)
        rows, per_row = shape[0], tf.reduce_prod(shape[1:])
        padded = (per_row + 3) // 4 * 4
        out_shape = tf.stack([rows, padded])
    key, counter = philox_key_counter(seed[:2])
    skip = tf.cast(seed[2], tf.uint64) * tf.cast(padded // 4, tf.uint64)
    counter = counter + tf.stack([skip, tf.constant(0, tf.uint64)])
    out = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=out_shape, key=key, counter=counter, alg=_PHILOX, dtype=tf.uint32)
    return tf.reshape(out[:, :per_row], shape)


def uniform(shape, seed) -> tf.Tensor:
    """float32 uniform on [0, 1), 24 random bits (multiples of 2**-24)."""
    high = tf.bitwise.right_shift(bits(shape, seed), tf.constant(8, tf.uint32))
    return tf.cast(high, tf.float32) * (1.0 / (1 << 24))


def uniform_int(shape, seed, maxval: int) -> tf.Tensor:
    """int32 uniform on [0, maxval) (maxval < 2**24)."""
    return tf.minimum(tf.cast(tf.floor(uniform(shape, seed) * maxval), tf.int32), maxval - 1)
