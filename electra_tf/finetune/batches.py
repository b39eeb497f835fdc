"""A fine-tuning trial's training batches in NumPy, without TensorFlow: the same batches in
the same order as the tf.data pipeline the TensorFlow runtime reads
(`from_tensor_slices(arrays).shuffle(n, seed, reshuffle_each_iteration=True).repeat()
.batch(b, drop_remainder=True).skip(k)`), so that a trial on JAX sees what it sees on
TensorFlow for the same seed.

What tf.data does there, and this module repeats (checked against tf.data in
tests/test_finetune_notf.py):

- The seed pair: Keras sets TensorFlow's global seed to the trial's seed before the
  pipeline is made, so the op's seeds are (seed, seed), each taken modulo 2**31 - 1; (0, 0)
  becomes (0, 2**31 - 1).
- A seed generator (stateful Philox, `PhiloxRandom(seed, seed2)`: key = seed's two 32-bit
  halves, counter = (0, 0, seed2's halves), one uint32 word at a time) gives each epoch's
  shuffle two words: that epoch's own Philox seeds.
- A shuffle over a buffer as large as the split fills it with the rows in order, then
  yields one row at a time: word % rows left, counted from the first row not yet yielded;
  that row leaves and the first row left takes its slot.
- Batches run across epochs (the repeat comes before the batch)."""

from typing import Dict, Iterator, Tuple

import numpy as np

from electra_tf import philox

_MAXINT32 = 2 ** 31 - 1
_U32 = 0xFFFFFFFF


def op_seeds(seed: int) -> Tuple[int, int]:
    """The (seed, seed2) of `ds.shuffle(..., seed=seed)` under the global seed `seed`."""
    seeds = (seed % _MAXINT32, seed % _MAXINT32)
    return (0, _MAXINT32) if seeds == (0, 0) else seeds


class PhiloxStream:
    """TensorFlow's stateful `SingleSampleAdapter<PhiloxRandom>(seed, seed2)`: uint32 words
    one at a time, the four of each counter value in order."""

    def __init__(self, seed: int, seed2: int):
        seed, seed2 = seed & 0xFFFFFFFFFFFFFFFF, seed2 & 0xFFFFFFFFFFFFFFFF
        self.key = (seed & _U32, seed >> 32)
        self.high = (seed2 & _U32, seed2 >> 32)
        self.used = 0  # words handed out
        self._words = np.zeros([0], np.uint32)
        self._first = 0  # the index of self._words[0]

    def _fill(self, n: int):
        blocks = -(-n // 4) + 64
        start = self.used // 4
        low = np.arange(start, start + blocks, dtype=np.uint64)
        counters = np.stack([low & np.uint64(_U32), low >> np.uint64(32),
                             np.full_like(low, self.high[0]), np.full_like(low, self.high[1])],
                            axis=1).astype(np.uint32)
        self._words = philox.philox(counters, self.key).reshape(-1)
        self._first = start * 4

    def take(self, n: int) -> np.ndarray:
        """The next `n` words."""
        end = self.used + n
        if self.used < self._first or end > self._first + len(self._words):
            self._fill(n)
        out = self._words[self.used - self._first:end - self._first]
        self.used = end
        return out


def epoch_order(num_rows: int, stream: PhiloxStream) -> np.ndarray:
    """One epoch of a shuffle whose buffer holds every row, drawn from `stream`."""
    rows = np.arange(num_rows, dtype=np.int64)
    draws = stream.take(num_rows).astype(np.int64)
    out = np.empty([num_rows], np.int64)
    for start in range(num_rows):
        index = start + int(draws[start]) % (num_rows - start)
        out[start] = rows[index]
        rows[index] = rows[start]
    return out


def shuffled_order(num_rows: int, seed: int) -> Iterator[np.ndarray]:
    """Each epoch's row order, endlessly, as `shuffle(num_rows, seed,
    reshuffle_each_iteration=True).repeat()` yields it."""
    seeds = PhiloxStream(*op_seeds(seed))
    while True:
        words = seeds.take(2)
        yield epoch_order(num_rows, PhiloxStream(int(words[0]), int(words[1])))


def shuffled_batches(arrays: Dict[str, np.ndarray], batch_size: int, seed: int,
                     skip_batches: int = 0) -> Iterator[Dict[str, np.ndarray]]:
    """Endless global batches of `arrays` ([N, ...] each), shuffled afresh each epoch, the
    first `skip_batches` left out (a resumed trial's position)."""
    num_rows = len(next(iter(arrays.values())))
    if num_rows < 1:
        raise ValueError("no training rows to batch")
    epochs = shuffled_order(num_rows, seed)
    pending = np.zeros([0], np.int64)
    skip_rows = skip_batches * batch_size
    while True:
        while len(pending) < batch_size + skip_rows:
            pending = np.concatenate([pending, next(epochs)])
            if skip_rows >= len(pending):  # whole epochs skipped: keep only the count
                skip_rows -= len(pending)
                pending = pending[:0]
        pending = pending[skip_rows:]
        skip_rows = 0
        take, pending = pending[:batch_size], pending[batch_size:]
        yield {k: v[take] for k, v in arrays.items()}
