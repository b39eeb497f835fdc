"""The build as an Apache Beam pipeline, for corpora too big for one machine.

    inputs -> Reshuffle -> read chunks -> Reshuffle -> encode chunk (one tokenizer per
      DoFn, built in setup()) -> (shard, example) -> GroupByKey -> write each shard
                              -> chunk stats -> CombineGlobally -> totals, unigram counts

A chunk is encoded exactly as in the local build (`examples.encode_chunk`), so both builds
hold the same multiset of examples for a seed; only the shards differ (a chunk deals its
examples round-robin from a shard fixed by its file and chunk index). The shards are
written under `<output_dir>/.building-beam/` and published as the local build publishes
(manifest last) only once the pipeline has succeeded; a failed run leaves no partial build.
Workers read and write through TensorFlow's filesystem layer (shared mounts, gs://), and
the vocabulary travels with the job. Apache Beam is imported only to build a pipeline.
"""

import dataclasses
import hashlib
import heapq
import json
import os
import time
import zlib
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from electra_tf import fileio
from tfrecord_builder import BuildError
from tfrecord_builder.build import (BuildConfig, build_fingerprint, discard, finished_build,
                                    input_chunks, make_manifest, open_inputs, output_dir_errors,
                                    publish, require_examples, shard_name, warn_empty_shards)
from tfrecord_builder.corpus import MAX_SKIP_EXAMPLES, Source
from tfrecord_builder.examples import ChunkStats, encode_chunk, merge_stats, serialize_examples
from electra_tf.text import Tokenizer, VocabInfo

DEFAULT_RUNNER = "DirectRunner"
STAGING_DIR = ".building-beam"
STATS_NAME = "stats.json"
SHARD_COUNTS_NAME = "shard_counts.json"


def _import_beam():
    try:
        import apache_beam
    except ImportError:
        raise BuildError("--runner needs Apache Beam: pip install -e .[beam]") from None
    return apache_beam


# ----------------------------------------------------------------------------- pipeline
# Functions used by the pipeline live at module level, so they pickle by reference.


def _first_shard(file_index: int, chunk_index: int, num_shards: int) -> int:
    """The shard of a chunk's first example; the next ones follow round-robin."""
    return zlib.crc32(f"{file_index}:{chunk_index}".encode()) % num_shards


def _write_shard(item: Tuple[int, Iterable[bytes]], directory: str,
                 num_shards: int) -> Tuple[str, int]:
    """(shard, its records) -> the shard file under `directory`, written whole (temp file
    + rename, each attempt its own temp file); returns (name, records written). Empty
    records are the placeholders that make every shard exist."""
    shard, records = item
    name = shard_name(shard, num_shards)
    n = 0
    with fileio.atomic_output(fileio.join(directory, name)) as tmp, \
            tf.io.TFRecordWriter(tmp) as writer:
        for record in records:
            if record:
                writer.write(record)
                n += 1
    return name, n


def _write_json(value, path: str):
    fileio.write_atomic(path, json.dumps(value))


_FNS = {}


def _beam_fns() -> dict:
    """The DoFn and CombineFn classes; made on first use, since they subclass Beam's."""
    if _FNS:
        return _FNS
    beam = _import_beam()

    class ReadChunks(beam.DoFn):
        """(file_index, path) -> the document-aligned chunks of that input."""

        def __init__(self, cfg: BuildConfig):
            super().__init__()
            self.cfg = cfg

        def process(self, item):
            file_index, path = item
            counter = beam.metrics.Metrics.counter("tfrecord_builder", "chunks")
            # Any filesystem TensorFlow knows, read on the worker.
            for chunk in input_chunks(self.cfg, file_index, path):
                counter.inc()
                yield chunk

    class EncodeChunk(beam.DoFn):
        """Chunk -> its (shard, serialized example) pairs (main output) and (file_index,
        chunk index, ChunkStats) on the "stats" output. The tokenizer is built once per
        instance."""

        def __init__(self, cfg: BuildConfig, vocab: VocabInfo, vocab_bytes: bytes):
            super().__init__()
            self.cfg, self.vocab, self.vocab_bytes = cfg, vocab, vocab_bytes
            self.tokenizer = None

        def setup(self):
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            # The vocabulary travels with the job: workers need not see the launcher's disk.
            self.tokenizer = Tokenizer(self.vocab, self.vocab_bytes)
            metrics = beam.metrics.Metrics
            self.examples = metrics.counter("tfrecord_builder", "examples")
            self.tokens = metrics.counter("tfrecord_builder", "corpus_tokens")

        def process(self, chunk):
            cfg = self.cfg
            packed, stats = encode_chunk(chunk, self.tokenizer, cfg.max_seq_length, cfg.seed)
            first = _first_shard(chunk.file_index, chunk.index, cfg.num_shards)
            for j, record in enumerate(serialize_examples(packed)):
                yield (first + j) % cfg.num_shards, record
            self.examples.inc(stats.examples)
            self.tokens.inc(stats.corpus_tokens)
            yield beam.pvalue.TaggedOutput("stats", (chunk.file_index, chunk.index, stats))

    class CombineStats(beam.CombineFn):
        """Sums chunk stats as examples.merge_stats does; the accumulator is
        (ChunkStats, dense unigram counts, corpus tokens per input, skip examples keyed
        by their place in chunk order)."""

        def __init__(self, vocab_size: int):
            super().__init__()
            self.vocab_size = vocab_size

        def create_accumulator(self):
            return ChunkStats(), np.zeros([self.vocab_size], np.int64), {}, []

        def add_input(self, acc, item):
            # A chunk is an accumulator of one; merge_stats adds its sparse unigram counts.
            file_index, chunk_index, stats = item
            skips = [((file_index, chunk_index, j), s) for j, s in enumerate(stats.skip_examples)]
            one = (stats, 0, {file_index: stats.corpus_tokens}, skips)
            return self.merge_accumulators([acc, one])

        def merge_accumulators(self, accumulators):
            totals, counts, per_input, skips = self.create_accumulator()
            for t, c, p, s in accumulators:
                merge_stats(totals, dataclasses.replace(t, skip_examples=[]), counts)
                counts += c
                for k, v in p.items():
                    per_input[k] = per_input.get(k, 0) + v
                # The skipped-line examples the local build keeps: the first in chunk order.
                skips = heapq.nsmallest(MAX_SKIP_EXAMPLES, skips + list(s))
            return totals, counts, per_input, skips

        def extract_output(self, acc):
            totals, counts, per_input, skips = acc
            totals = dataclasses.replace(totals, skip_examples=[s for _, s in skips])
            return {"totals": totals.to_json(), "vocab_counts": counts.tolist(),
                    "tokens_per_input": sorted(per_input.items())}

    _FNS.update(ReadChunks=ReadChunks, EncodeChunk=EncodeChunk, CombineStats=CombineStats)
    return _FNS


def _pipeline_options(runner: str, beam_options: Sequence[str], num_workers: int):
    from apache_beam.options.pipeline_options import (DirectOptions, PipelineOptions,
                                                      StandardOptions)
    options = PipelineOptions(list(beam_options))
    options.view_as(StandardOptions).runner = runner
    if (runner.lower() in ("directrunner", "direct") and num_workers > 1
            and not any(o.startswith("--direct_num_workers") for o in beam_options)):
        direct = options.view_as(DirectOptions)
        direct.direct_num_workers = num_workers
        if not any(o.startswith("--direct_running_mode") for o in beam_options):
            direct.direct_running_mode = "multi_processing"
    return options


def _add_transforms(beam, p, cfg: BuildConfig, source: Source, vocab: VocabInfo,
                    vocab_bytes: bytes, staging: str):
    fns = _beam_fns()
    chunks = (p
              | "Inputs" >> beam.Create(list(enumerate(source.names)))
              | "SpreadInputs" >> beam.Reshuffle()
              | "ReadChunks" >> beam.ParDo(fns["ReadChunks"](cfg))
              | "SpreadChunks" >> beam.Reshuffle())
    encoded = chunks | "Encode" >> beam.ParDo(
        fns["EncodeChunk"](cfg, vocab, vocab_bytes)
    ).with_output_types(Tuple[int, bytes]).with_outputs("stats", main="records")
    # One (shard, b"") placeholder each, so that a shard no example lands in is written
    # (empty) too. Each shard is written by one worker through TensorFlow's filesystem
    # layer, and the records it holds are counted as they are written.
    placeholders = p | "EveryShard" >> beam.Create([(i, b"") for i in range(cfg.num_shards)])
    _ = ((encoded.records, placeholders)
         | "AllRecords" >> beam.Flatten()
         | "GroupByShard" >> beam.GroupByKey()
         | "WriteShards" >> beam.Map(_write_shard, staging, cfg.num_shards)
         | "AllCounts" >> beam.combiners.ToList()
         | "WriteCounts" >> beam.Map(_write_json, fileio.join(staging, SHARD_COUNTS_NAME)))
    _ = (encoded.stats
         | "CombineStats" >> beam.CombineGlobally(fns["CombineStats"](vocab.vocab_size))
         | "WriteStats" >> beam.Map(_write_json, fileio.join(staging, STATS_NAME)))


# ----------------------------------------------------------------------------- build


def build_with_beam(cfg: BuildConfig, runner: Optional[str] = None,
                    beam_options: Sequence[str] = ()) -> dict:
    """Builds the dataset of `cfg` as a Beam pipeline on `runner`; returns the manifest."""
    beam = _import_beam()
    runner = runner or DEFAULT_RUNNER
    vocab, vocab_bytes, source = open_inputs(cfg)
    # The local build's, marked as Beam's: the same examples, in other shards.
    local = build_fingerprint(cfg, source, vocab)
    fingerprint = hashlib.sha256(f"beam:{local}".encode()).hexdigest()
    staging = fileio.join(cfg.output_dir, STAGING_DIR)
    with output_dir_errors(cfg):
        done = finished_build(cfg, fingerprint)
        if done is not None:
            return done
        fileio.rmtree(staging)  # what a failed run left
        fileio.makedirs(staging)

    t0 = time.monotonic()
    try:
        pipeline = beam.Pipeline(options=_pipeline_options(runner, beam_options,
                                                           cfg.num_workers))
    except ValueError as e:  # unknown runner, bad option values
        raise BuildError(f"--runner={runner}: {e}") from None
    _add_transforms(beam, pipeline, cfg, source, vocab, vocab_bytes, staging)
    logging.info("Running the build as a Beam pipeline on %s (%d inputs, %d shards)",
                 runner, len(source.names), cfg.num_shards)
    try:
        state = pipeline.run().wait_until_finish()
    except Exception:
        discard(staging)  # nothing was published; drop the partial output
        raise
    if str(state).rsplit(".", 1)[-1] != "DONE":
        discard(staging)
        raise BuildError(f"the Beam pipeline on {runner} ended in state {state}; "
                         f"nothing was published in {cfg.output_dir}")
    run_s = time.monotonic() - t0

    result = fileio.read_json(fileio.join(staging, STATS_NAME))
    stats = ChunkStats.from_json(result["totals"])
    vocab_counts = result["vocab_counts"]
    tokens_per_input = dict((int(k), v) for k, v in result["tokens_per_input"])
    if stats.examples == 0:
        discard(staging)
        require_examples(stats, source)
    names = [shard_name(i, cfg.num_shards) for i in range(cfg.num_shards)]
    shard_counts = dict(fileio.read_json(fileio.join(staging, SHARD_COUNTS_NAME)))
    missing = [n for n in names if n not in shard_counts]
    if missing:
        raise BuildError(f"the Beam pipeline did not write {', '.join(missing)}")
    counts = [int(shard_counts[n]) for n in names]
    if sum(counts) != stats.examples:
        raise BuildError(f"the Beam pipeline wrote {sum(counts)} records but encoded "
                         f"{stats.examples} examples; nothing was published")
    empty_inputs = [name for i, name in enumerate(source.names) if not tokens_per_input.get(i)]
    warn_empty_shards(cfg, counts)

    manifest = publish(cfg, staging, vocab_counts, make_manifest(
        cfg, vocab, source, stats, counts, empty_inputs, fingerprint))
    discard(staging)
    logging.info("Wrote %d examples (%d tokens, retention %.4f) in %d shards to %s in %.1fs "
                 "(pipeline %.1fs on %s)", stats.examples, stats.example_tokens,
                 manifest["retention"], cfg.num_shards, cfg.output_dir,
                 time.monotonic() - t0, run_s, runner)
    return manifest
