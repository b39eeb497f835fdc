"""TensorFlow's stateless Philox draws in NumPy, bit for bit, without TensorFlow.

The input order of pre-training (`data/order.py`) is drawn with
`tf.random.experimental.stateless_fold_in` and `tf.random.stateless_uniform` (alg
"philox"); a reader without TensorFlow draws the same numbers here, so both give the same
batches for the same seed. What TensorFlow does, and this module repeats:

- Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011): a
  128-bit counter and a 64-bit key; ten rounds, each two 32x32->64-bit products, the key
  raised by two Weyl constants between rounds; four uint32 words per counter value.
- A seed (two integers, each taken as a 64-bit integer: int32 seeds sign-extend) becomes a
  key and a counter by one Philox call on counter (seed0 low, seed0 high, seed1 low, seed1
  high) under a fixed key: its first two words are the key, its last two the counter's
  upper half (the lower half zero).
- A draw of n numbers takes the words of consecutive counter values in order; a float32
  uniform on [0, 1) is a word's low 23 bits as the mantissa of a float in [1, 2), minus 1;
  a full-range int32 is a word as it is.
- `stateless_fold_in(seed, data)` is [one full-range int32 drawn from `seed`, data]."""

from typing import Sequence, Tuple

import numpy as np

_W32A, _W32B = 0x9E3779B9, 0xBB67AE85  # the key's Weyl increments
_M4x32A, _M4x32B = 0xD2511F53, 0xCD9E8D57  # the round multipliers
_SEED_KEY = (0x3EC8F720, 0x02461E29)  # the key a seed is scrambled under
_U32 = 0xFFFFFFFF


def philox(counters: np.ndarray, key: Tuple[int, int]) -> np.ndarray:
    """Philox-4x32-10 of uint32 counters [n, 4] under `key` -> uint32 words [n, 4]."""
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    a, b = np.uint64(_M4x32A), np.uint64(_M4x32B)
    mask, shift = np.uint64(_U32), np.uint64(32)
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(_W32A)) & mask
            k1 = (k1 + np.uint64(_W32B)) & mask
        p0, p1 = a * c[0], b * c[2]  # 32 x 32 -> 64 bits: no overflow in uint64
        hi0, lo0, hi1, lo1 = p0 >> shift, p0 & mask, p1 >> shift, p1 & mask
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return np.stack(c, axis=1).astype(np.uint32)


def key_and_counter(seed: Sequence[int]) -> Tuple[Tuple[int, int], Tuple[int, int, int, int]]:
    """A [2] seed -> (Philox key, counter) as TensorFlow's stateless ops derive them."""
    s0, s1 = (int(s) & 0xFFFFFFFFFFFFFFFF for s in seed)  # int32s sign-extend to 64 bits
    counter = np.array([[s0 & _U32, s0 >> 32, s1 & _U32, s1 >> 32]], np.uint32)
    mix = philox(counter, _SEED_KEY)[0]
    return (int(mix[0]), int(mix[1])), (0, 0, int(mix[2]), int(mix[3]))


def words(n: int, seed: Sequence[int]) -> np.ndarray:
    """The first `n` uint32 words of the stream a seed starts."""
    key, counter = key_and_counter(seed)
    blocks = -(-n // 4)
    # the 128-bit counter plus 0, 1, ...: the lowest word counts, carries move up
    low = np.uint64(counter[0]) + np.arange(blocks, dtype=np.uint64)
    c1 = np.uint64(counter[1]) + (low >> np.uint64(32))
    c2 = np.uint64(counter[2]) + (c1 >> np.uint64(32))
    c3 = np.uint64(counter[3]) + (c2 >> np.uint64(32))
    counters = np.stack([x & np.uint64(_U32) for x in (low, c1, c2, c3)], axis=1)
    return philox(counters.astype(np.uint32), key).reshape(-1)[:n]


def uniform(n: int, seed: Sequence[int]) -> np.ndarray:
    """`tf.random.stateless_uniform([n], seed, alg="philox")`: float32 on [0, 1)."""
    mantissa = (words(n, seed) & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)
    return mantissa.view(np.float32) - np.float32(1.0)


def fold_in(seed: Sequence[int], data: int) -> np.ndarray:
    """`tf.random.experimental.stateless_fold_in(seed, data, alg="philox")`: int32 [2]."""
    return np.array([words(1, seed)[0].astype(np.int32), np.int32(data)], np.int32)


def permutation(n: int, seed: Sequence[int]) -> np.ndarray:
    """`tf.argsort(stateless_uniform([n], seed, alg="philox"), stable=True)`: int64 [n]."""
    return np.argsort(uniform(n, seed), kind="stable")
