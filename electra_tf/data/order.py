"""The resumable record order of one input pipeline: a per-epoch shard permutation, a
round robin within groups of shards and windowed shuffles, each drawn from a key and epoch."""

from __future__ import annotations  # tf.* annotations: TensorFlow is imported lazily

import dataclasses
import itertools
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from electra_tf import philox
from electra_tf.data.files import InputDataError, traced

if TYPE_CHECKING:
    import tensorflow as tf


# The count a shard without a manifest is given (it is read to its end).
_UNKNOWN_COUNT = 1 << 62
_END = object()  # an exhausted iterator's next()


@dataclasses.dataclass(frozen=True)
class StreamPosition:
    """Where a record of a pipeline's stream is (`StreamOrder.locate`): the epoch; the group
    of shards read, its round robin's round (records each shard had given) and the records
    taken of that round (slot); the shuffle window and the records consumed of it."""
    epoch: int
    group: int
    round: int
    slot: int
    window: int
    offset: int


@dataclasses.dataclass(frozen=True)
class StreamOrder:
    """The order of (shard, record) in one input pipeline, a function of its key and the
    epoch, so that the position of any record is found without reading what precedes it.

    Epoch e reads the shards in a permutation drawn from (key, e), `cycle_length` at a
    time, round robin within a group (a shard that has run out leaves the turn), then
    shuffles its stream in consecutive windows of `window` records, each by a permutation
    drawn from (key, e, window index; window 1: no shuffle). Resuming at record p costs
    arithmetic on the counts, reading the current group's shards up to their place and one
    window, not the p records before. A shard that ends early (skipped as bad) leaves the
    others' order unchanged but shortens the stream after it (data/shards.py)."""
    num_shards: int
    cycle_length: int
    window: int
    key: Tuple[int, int]

    def _epoch_seed(self, epoch) -> tf.Tensor:
        import tensorflow as tf  # the tf.data stream's only
        return tf.random.experimental.stateless_fold_in(
            tf.constant(self.key, tf.int32), tf.cast(epoch, tf.int32), alg="philox")

    def _permutation(self, size, seed) -> tf.Tensor:
        import tensorflow as tf  # the tf.data stream's only
        return tf.argsort(tf.random.stateless_uniform(size, seed=seed, alg="philox"),
                          stable=True)

    def shard_order(self, epoch) -> tf.Tensor:
        """The epoch's permutation of the shards, int32 [num_shards] (graph or eager)."""
        import tensorflow as tf  # the tf.data stream's only
        seed = tf.random.experimental.stateless_fold_in(self._epoch_seed(epoch), 0,
                                                        alg="philox")
        return self._permutation([self.num_shards], seed)

    def shard_permutation(self, epoch: int) -> np.ndarray:
        """`shard_order` on the host, in NumPy: the same Philox numbers without TensorFlow
        (`electra_tf.philox`)."""
        seed = philox.fold_in(philox.fold_in(self.key, epoch), 0)
        return philox.permutation(self.num_shards, seed)

    def window_permutation(self, epoch: int, window: int, size: int) -> np.ndarray:
        """The shuffle of window `window` of epoch `epoch` (`size` records), in NumPy."""
        return philox.permutation(size, philox.fold_in(philox.fold_in(self.key, epoch),
                                                       window + 1))

    def group_shards(self, epoch: int, group: int) -> List[int]:
        """The shards (indices) of group `group` of epoch `epoch`."""
        order = self.shard_permutation(epoch)
        c = self.cycle_length
        return [int(i) for i in order[group * c:(group + 1) * c]]

    def locate(self, records: int, counts: Sequence[int]) -> StreamPosition:
        """The position of record `records` (0-based, counted over repeated epochs) of the
        stream whose shards hold `counts` records; arithmetic on the counts only."""
        counts = np.asarray(counts, np.int64)
        if counts.shape != (self.num_shards,) or (counts < 0).any():
            raise ValueError(f"locate needs the record count of each of the "
                             f"{self.num_shards} shards, got {counts.tolist()[:8]}")
        total = int(counts.sum())
        if total == 0:
            raise InputDataError(f"the {self.num_shards} input file(s) hold no records")
        epoch, within = divmod(int(records), total)
        window, offset = divmod(within, self.window)
        start = window * self.window  # the stream is read from the window's start
        ordered = counts[self.shard_permutation(epoch)]
        c = self.cycle_length
        groups = [ordered[i:i + c] for i in range(0, self.num_shards, c)]
        ends = np.cumsum([g.sum() for g in groups])
        group = int(np.searchsorted(ends, start, side="right"))
        into = start - (int(ends[group - 1]) if group else 0)
        m = groups[group]
        lo, hi = 0, int(m.max())  # the last round r with sum(min(m, r)) <= into
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(np.minimum(m, mid).sum()) <= into:
                lo = mid
            else:
                hi = mid - 1
        return StreamPosition(epoch, group, lo, into - int(np.minimum(m, lo).sum()),
                              window, offset)

    def records(self, counts: Sequence[int], read: Callable[[int], Iterator],
                position: Optional[StreamPosition] = None,
                repeat: bool = True) -> Iterator:
        """`dataset`'s stream in plain Python over `read(i)` (shard i's records, any
        iterable): the same records in the same order, drawn through `electra_tf.philox`
        (no TensorFlow in the loop). The reader a runtime without TensorFlow takes."""
        p = position or StreamPosition(0, 0, 0, 0, 0, 0)
        if not repeat and p.epoch != 0:
            return  # one pass, and it is over
        counts = [_UNKNOWN_COUNT if n < 0 else int(n) for n in counts]
        stream = self._epoch_records(p.epoch, p.group, p.round, p.slot, p.window, counts, read)
        for _ in range(p.offset):
            if next(stream, None) is None:
                break
        yield from stream
        if repeat:
            epoch = p.epoch + 1
            while True:
                yield from self._epoch_records(epoch, 0, 0, 0, 0, counts, read)
                epoch += 1

    def _epoch_records(self, epoch, group, r, j, window, counts, read) -> Iterator:
        c = self.cycle_length
        order = [int(i) for i in self.shard_permutation(epoch)]
        groups = [order[i:i + c] for i in range(0, self.num_shards, c)]

        def group_stream(g):
            shards = groups[g]
            rr, jj = (r, j) if g == group else (0, 0)
            n = [counts[i] for i in shards]
            # the cycle starts at the shard of rank jj among those with records beyond
            # round rr; those before it are one record further on
            alive = [k for k, m in enumerate(n) if m > rr]
            start = alive[jj] if jj > 0 else 0
            turn = [(shards[k], min(n[k], rr) if k >= start else min(n[k], rr + 1))
                    for k in list(range(start, len(shards))) + list(range(start))]
            readers = [itertools.islice(iter(read(i)), skip, None) for i, skip in turn]
            while readers:  # round robin; an exhausted shard leaves the turn
                left = []
                for it in readers:
                    item = next(it, _END)
                    if item is not _END:
                        yield item
                        left.append(it)
                readers = left

        stream = itertools.chain.from_iterable(group_stream(g)
                                               for g in range(group, len(groups)))
        if self.window <= 1:
            yield from stream
            return
        k = window
        while True:
            chunk = list(itertools.islice(stream, self.window))
            if not chunk:
                return
            for i in self.window_permutation(epoch, k, len(chunk)):
                yield chunk[i]
            k += 1

    def dataset(self, counts: Sequence[int], read,
                position: Optional[StreamPosition] = None,
                repeat: bool = True) -> tf.data.Dataset:
        """The stream of serialized records from `position` (the start by default). counts:
        each shard's record count for the order (-1: unknown, read to its end); read(i):
        the dataset of shard i's records (i an int64 tensor)."""
        import tensorflow as tf  # the tf.data stream's only
        c, num_groups = self.cycle_length, -(-self.num_shards // self.cycle_length)
        pad = num_groups * c - self.num_shards
        counts_t = tf.constant(list(counts), tf.int64)
        slots_range = tf.range(c, dtype=tf.int64)

        def group_records(shards, n, active, r, j):
            # The turn is TF's deterministic interleave over the group's shards (one
            # record from each in order; an exhausted shard leaves the cycle). Resuming
            # after the first j records of round r (j counted over the shards still in
            # the turn), the cycle starts at the shard with rank j, those before it one
            # record further on: a rotation of a round robin is the same sequence.
            n = tf.where(n < 0, _UNKNOWN_COUNT, n)  # no manifest: read to its end
            alive = n > r
            rank = tf.cumsum(tf.cast(alive, tf.int64)) - 1
            start = tf.where(j > 0, tf.argmax(tf.cast(alive & (rank == j), tf.int64),
                                              output_type=tf.int64), 0)
            skips = tf.where(slots_range >= start, tf.minimum(n, r), tf.minimum(n, r + 1))
            rotation = tf.roll(slots_range, shift=-start, axis=0)
            keep = tf.gather(active, rotation)
            ds = tf.data.Dataset.from_tensor_slices(
                (tf.boolean_mask(tf.gather(shards, rotation), keep),
                 tf.boolean_mask(tf.gather(skips, rotation), keep)))
            return ds.interleave(traced(lambda i, k: read(i).skip(k)), cycle_length=c,
                                 block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=True)

        def epoch_records(epoch, group, r, j, window):
            grid = tf.reshape(tf.concat([tf.cast(self.shard_order(epoch), tf.int64),
                                         tf.fill([pad], tf.constant(-1, tf.int64))], 0),
                              [num_groups, c])

            def group_args(g):
                active = grid[g] >= 0
                shards = tf.maximum(grid[g], 0)
                n = tf.where(active, tf.gather(counts_t, shards), 0)
                first = tf.equal(g, group)
                zero = tf.constant(0, tf.int64)
                return shards, n, active, tf.where(first, r, zero), tf.where(first, j, zero)

            ds = tf.data.Dataset.range(group, num_groups).map(traced(group_args)).flat_map(
                traced(group_records))
            if self.window > 1:
                seed = self._epoch_seed(epoch)

                def shuffle(k, records):
                    s = tf.random.experimental.stateless_fold_in(
                        seed, tf.cast(k, tf.int32) + 1, alg="philox")
                    return tf.gather(records, self._permutation(tf.shape(records), s))

                ds = ds.batch(self.window).enumerate(start=window).map(traced(shuffle))
                ds = ds.prefetch(2).unbatch()  # windows ahead hide a group's opening reads
            return ds

        p = position or StreamPosition(0, 0, 0, 0, 0, 0)
        first = epoch_records(*(tf.constant(v, tf.int64) for v in
                                (p.epoch, p.group, p.round, p.slot, p.window))).skip(p.offset)
        if not repeat:
            return first if p.epoch == 0 else first.take(0)
        zero = tf.constant(0, tf.int64)
        rest = tf.data.Dataset.counter(p.epoch + 1).flat_map(
            traced(lambda e: epoch_records(e, zero, zero, zero, zero)))
        return first.concatenate(rest)
