"""The input of pre-training: the shards of one host read in their resumable order,
batched and parsed into static-shape int32 input dicts for each replica. Two pipelines give
the same batches in the same order: tf.data's (`make_dataset`, the TensorFlow runtime's)
and one in plain Python and NumPy (`make_batches`, the JAX runtime's, which needs no
TensorFlow); `make_input` picks by the input context a runtime hands over."""

from __future__ import annotations  # tf.* annotations: TensorFlow is imported lazily

import dataclasses
import itertools
import os
import random
import time
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

import numpy as np
from absl import logging

from electra_tf.data import files, records, shards
from electra_tf.data import order as order_lib
from electra_tf.data.files import FEATURE_NAMES

if TYPE_CHECKING:
    import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class InputConfig:
    """What to read and how to batch; batch_size is the GLOBAL batch, split per replica."""
    file_pattern: str  # comma-separated globs and/or build directories
    max_seq_length: int = 128
    batch_size: int = 128
    shuffle_buffer: int = 10_000  # examples; 0 or 1 reads records in file order
    cycle_length: int = 8  # shards read at once by each input pipeline
    deterministic: bool = False  # same element order on every run; needs `seed`
    seed: Optional[int] = None
    repeat: bool = True
    # Global batches to pass over first (resuming a run where it stopped): each pipeline
    # skips its replicas' share of them, before parsing, so it costs reading only.
    skip_batches: int = 0
    vocab_size: Optional[int] = None  # checked against the manifest when given
    check_data: bool = True  # manifest and first-record checks before building
    # A shard that turns out unreadable (missing, truncated, a corrupted record): skip it
    # (a warning naming it, counted) or stop the read naming it; see data/shards.py.
    on_bad_shard: str = "skip"

    def __post_init__(self):
        if not self.file_pattern or not self.file_pattern.strip(" ,"):
            raise ValueError("InputConfig.file_pattern is empty")
        for name in ("skip_batches", "shuffle_buffer"):
            if getattr(self, name) < 0:
                raise ValueError(f"InputConfig.{name}={getattr(self, name)}: must be >= 0")
        for name in ("max_seq_length", "batch_size", "cycle_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"InputConfig.{name}={getattr(self, name)}: must be at least 1")
        if self.deterministic and self.seed is None:
            # Unseeded shuffles differ per run, so "deterministic" would silently not be.
            raise ValueError("InputConfig.deterministic=True needs a seed")
        files.check_policy(self.on_bad_shard, "InputConfig.")


@dataclasses.dataclass(frozen=True)
class InputContext:
    """A runtime's share of the input without tf.distribute (the JAX runtime's): this
    process's pipeline of `num_input_pipelines`, fed as host arrays (`make_batches`); the
    attributes of `tf.distribute.InputContext`, which the TensorFlow runtime hands over."""
    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(f"the global batch size {global_batch_size} is not divisible "
                             f"by {self.num_replicas_in_sync} replicas")
        return global_batch_size // self.num_replicas_in_sync


def make_input(config: InputConfig, input_context=None, log: Optional[shards.ShardLog] = None):
    """The pipeline of the runtime's input context: `make_batches` (an iterator of NumPy
    batches) for an `InputContext`, `make_dataset` (tf.data) for tf.distribute's."""
    if isinstance(input_context, InputContext):
        return make_batches(config, input_context, log)
    return make_dataset(config, input_context, log)


def parse_batch(serialized: tf.Tensor, max_seq_length: int) -> Dict[str, tf.Tensor]:
    """A batch of serialized examples -> the model's input dict of int32 tensors."""
    import tensorflow as tf
    spec = {name: tf.io.FixedLenFeature([max_seq_length], tf.int64) for name in FEATURE_NAMES}
    parsed = tf.io.parse_example(serialized, spec)
    # int64 is slow or unsupported on TPU and ids fit easily in int32.
    return {name: tf.cast(parsed[name], tf.int32) for name in FEATURE_NAMES}


@dataclasses.dataclass
class _Plan:
    """What both pipelines read: this pipeline's shards in their order from the position."""
    paths: List[str]
    batch_size: int  # per replica
    replicas: int  # this pipeline's
    order: order_lib.StreamOrder
    order_counts: List[int]
    position: Optional[order_lib.StreamPosition]
    expected_records: List[int]
    expected_bytes: List[int]
    log: shards.ShardLog
    pipeline: int


def _plan(config: InputConfig, input_context, log: Optional[shards.ShardLog]) -> _Plan:
    """The shards of this input pipeline (one host), their order and the position to
    start from (`config.skip_batches`), the checks of a resumed position, for either
    pipeline."""
    paths = files.resolve_files(config.file_pattern, config.on_bad_shard)
    if config.check_data:
        files.check_data(config.file_pattern, vocab_size=config.vocab_size,
                         max_seq_length=config.max_seq_length, on_bad_shard=config.on_bad_shard)

    num_pipelines, pipeline_id, batch_size, replicas = 1, 0, config.batch_size, 1
    if input_context is not None:
        num_pipelines = input_context.num_input_pipelines
        pipeline_id = input_context.input_pipeline_id
        batch_size = input_context.get_per_replica_batch_size(config.batch_size)
        replicas = max(1, input_context.num_replicas_in_sync // num_pipelines)
    paths = files.shard_files(paths, num_pipelines, pipeline_id)
    logging.info("Input pipeline %d of %d: %d file(s), %s", pipeline_id, num_pipelines,
                 len(paths), ", ".join(os.path.basename(f) for f in paths[:8]) +
                 (", ..." if len(paths) > 8 else ""))
    if config.check_data:
        files.check_sequence_length(paths, config.max_seq_length, config.on_bad_shard)

    # Hosts hold disjoint files; their own keys keep their orders from being lockstep.
    seed = config.seed
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)  # a fresh order per pipeline
    key = (seed % (1 << 31), pipeline_id)

    # What each shard should yield, to tell a shard that ended early (a read error,
    # skipped or stopped on in shards.read_shard) from one read through: the manifest's
    # record count, or else the file's size now (one stat per file without a manifest).
    counts = files.manifest_counts(paths)
    unlisted = [f for f in paths if f not in counts]
    sizes = dict(zip(unlisted, files.stat_lengths(unlisted)))
    expected_records = [counts.get(f, -1) for f in paths]
    expected_bytes = [-1 if f in counts else (sizes[f] if sizes[f] is not None else 1)
                      for f in paths]
    log = log if log is not None else shards.ShardLog()
    pipeline = log.new_pipeline(len(paths))

    order = order_lib.StreamOrder(num_shards=len(paths),
                                  cycle_length=min(config.cycle_length, len(paths)),
                                  window=max(config.shuffle_buffer, 1), key=key)
    skipped = config.skip_batches * replicas * batch_size  # replicas: this pipeline's
    if skipped and unlisted:
        # The position needs every shard's record count: without a manifest they are
        # counted once, a read of the data (not of the `records` consumed before).
        start = time.perf_counter()
        found = shards.count_records(unlisted)
        logging.warning("No manifest.json lists %d of the %d input files: counted their "
                        "records to find the resume position (%.1f s; a manifest would "
                        "spare this read).", len(unlisted), len(paths),
                        time.perf_counter() - start)
        counts = dict(counts, **found)
    order_counts = [counts.get(f, -1) for f in paths]
    position = order.locate(skipped, order_counts) if skipped else None
    if position is not None:
        open_shards = order.group_shards(position.epoch, position.group)
        shards.check_resume_shards([paths[i] for i in open_shards], counts, set(unlisted),
                                   config.on_bad_shard)
    return _Plan(paths, batch_size, replicas, order, order_counts, position, expected_records,
                 expected_bytes, log, pipeline)


def make_dataset(config: InputConfig,
                 input_context: Optional[tf.distribute.InputContext] = None,
                 log: Optional[shards.ShardLog] = None) -> tf.data.Dataset:
    """The batched dataset of one input pipeline (one host): with an input context (from
    distribute_datasets_from_function) its share of the files in per-replica batches,
    without one every file in config.batch_size batches, of int32 [batch, max_seq_length]
    input dicts; batches are full (static shapes for XLA). A shard found unreadable is
    reported into `log` (its own when None): skipped (`log.skipped()`), or it fails the
    read with an error that `shards.explain_read_error(error, files, log)` explains."""
    import tensorflow as tf
    plan = _plan(config, input_context, log)
    paths, order, position = plan.paths, plan.order, plan.position
    log, pipeline, order_counts = plan.log, plan.pipeline, plan.order_counts
    batch_size = plan.batch_size
    files_t = tf.constant(paths)
    expected_records = tf.constant(plan.expected_records, tf.int64)
    expected_bytes = tf.constant(plan.expected_bytes, tf.int64)

    def read(i):
        return shards.read_shard(tf.gather(files_t, i), tf.gather(expected_records, i),
                                 tf.gather(expected_bytes, i), config.on_bad_shard, log,
                                 pipeline)

    ds = order.dataset(order_counts, read, position, repeat=config.repeat)
    # Parsing a whole batch in one parse_example call is much cheaper than per record.
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(files.traced(lambda s: parse_batch(s, config.max_seq_length)),
                num_parallel_calls=tf.data.AUTOTUNE)

    options = tf.data.Options()
    # The record order is fixed by the seed; a non-deterministic map may still hand the
    # parsed batches over out of order, which lets a slow batch not stall the others.
    options.deterministic = config.deterministic
    # Without tf.data's autotuner: its thread does not always wake when the iterator is
    # released, which then waits out the thread's period (up to a minute; measured here:
    # 8-16 s in 2 of 18 releases of an autotuned pipeline after 12-25 s of reading, none
    # in 30 without it, and an 18 s stall after the last step of pre-training runs). The
    # AUTOTUNE parallelism above then means one call per core, and the prefetch buffer
    # still grows by itself; this pipeline read 107-112k sequences/s of 128 tokens without
    # the autotuner and 92-106k with it (2-core CPU, one process after the other).
    options.autotune.enabled = False
    ds = ds.with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE)


def make_batches(config: InputConfig, input_context: Optional[InputContext] = None,
                 log: Optional[shards.ShardLog] = None) -> Iterator[Dict[str, np.ndarray]]:
    """`make_dataset` in plain Python and NumPy, without TensorFlow: the same records in
    the same order (`StreamOrder.records` over `shards.shard_records`), this pipeline's
    share of each global batch as one dict of int32 [rows, max_seq_length] arrays (its
    replicas' per-replica batches one after the other), full batches only. A bad shard is
    skipped or stops the input as there (a BadShardError naming it, out of `next`)."""
    plan = _plan(config, input_context, log)
    rows = plan.batch_size * plan.replicas

    def read(i):
        return shards.shard_records(plan.paths[i], plan.expected_records[i],
                                    plan.expected_bytes[i], config.on_bad_shard, plan.log,
                                    plan.pipeline)

    stream = plan.order.records(plan.order_counts, read, plan.position, repeat=config.repeat)
    where = f"input pipeline {plan.pipeline}"
    while True:
        chunk = list(itertools.islice(stream, rows))
        if len(chunk) < rows:
            return
        yield records.parse_examples(chunk, config.max_seq_length, where=where)
