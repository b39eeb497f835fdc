"""The build as an Apache Beam pipeline, for corpora too big for one machine.

    input files (one element each) -> Reshuffle -> read chunks -> Reshuffle
      -> encode chunk (one tokenizer per DoFn instance, built in setup())
           -> serialized examples -> WriteToTFRecord into a staging directory
                                     -> count the records of each shard
           -> chunk stats          -> CombineGlobally -> totals, unigram counts

Every chunk is encoded exactly as in the local build (`examples.encode_chunk` with the
RNG keyed by seed, file index and chunk index), so both builds hold the same multiset of
examples for the same seed; only which shard an example lands in differs. The runner is
any Beam runner (DirectRunner by default; DataflowRunner, FlinkRunner, SparkRunner, ...)
with its options passed through `beam_options`.

Nothing appears under a final name until the pipeline has succeeded: the shards are
written under `<output_dir>/.building-beam/` and moved into place afterwards, then
token_counts.txt, and the manifest last. A failed run leaves no partial build; rerunning
starts over (the runner retries failed work items itself).

Inputs and --output_dir may be local paths visible to every worker (a shared mount) or
any Beam filesystem URL such as gs://bucket/dir; a remote input file is copied to the
worker's local disk before it is read, so one input file is one unit of reading. The
vocabulary is read on the launching machine and shipped to the workers with the job.
Apache Beam is an optional extra and is imported only when a pipeline is built.
"""

import dataclasses
import hashlib
import heapq
import json
import os
import shutil
import struct
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from absl import logging

from tfrecord_builder import BuildError, corpus, manifest as manifest_lib
from tfrecord_builder.build import (SHARD_PREFIX, TOKEN_COUNTS_NAME, BuildConfig, Source,
                                    _fingerprint, make_manifest, open_source, shard_name)
from tfrecord_builder.examples import ChunkStats, encode_chunk, merge_stats, serialize_examples
from tfrecord_builder.tokenizers import VocabInfo, vocab_info

DEFAULT_RUNNER = "DirectRunner"
STAGING_DIR = ".building-beam"
STATS_NAME = "stats.json"
SHARD_COUNTS_NAME = "shard_counts.json"
MAX_SKIP_EXAMPLES = 20  # as many as the local build keeps (examples.merge_stats)
_NEED_BEAM = "--runner needs Apache Beam: pip install -e .[beam]"


def _import_beam():
    try:
        import apache_beam
    except ImportError:
        raise BuildError(_NEED_BEAM) from None
    return apache_beam


# ----------------------------------------------------------------------------- files
# Local paths go through os/shutil; URLs (gs://, s3://, hdfs://, ...) through Beam's
# FileSystems, which the workers use in the same way.


def _is_url(path: str) -> bool:
    return "://" in path


def _fs():
    from apache_beam.io.filesystems import FileSystems
    return FileSystems


def _join(base: str, *parts: str) -> str:
    return _fs().join(base, *parts) if _is_url(base) else os.path.join(base, *parts)


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if _is_url(path) else os.path.basename(path)


def _exists(path: str) -> bool:
    return _fs().exists(path) if _is_url(path) else os.path.exists(path)


def _open_read(path: str):
    if not _is_url(path):
        return open(path, "rb")
    from apache_beam.io.filesystem import CompressionTypes
    return _fs().open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _file_size(path: str) -> int:
    if not _is_url(path):
        return os.path.getsize(path)
    return _fs().match([path])[0].metadata_list[0].size_in_bytes


def _write_file(path: str, data: bytes):
    """Writes `path` whole: temp file + rename locally; object stores commit on close."""
    if _is_url(path):
        from apache_beam.io.filesystem import CompressionTypes
        with _fs().create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(data)
        return
    with open(path + ".tmp", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _move(src: Sequence[str], dst: Sequence[str]):
    if src and _is_url(src[0]):
        _fs().rename(list(src), list(dst))
    else:
        for s, d in zip(src, dst):
            os.replace(s, d)


def _remove(paths: Sequence[str]):
    """Deletes files, ignoring those that are not there."""
    for path in paths:
        try:
            if _is_url(path):
                if _fs().exists(path):
                    _fs().delete([path])
            elif os.path.exists(path):
                os.remove(path)
        except OSError:
            pass


def _remove_tree(path: str):
    if not _is_url(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    found = [m.path for r in _fs().match([path.rstrip("/") + "/**"]) for m in r.metadata_list]
    if found:
        _fs().delete(found)


def _discard(path: str):
    """_remove_tree, best effort (while another error is on its way)."""
    try:
        _remove_tree(path)
    except Exception as e:  # pylint: disable=broad-except
        logging.warning("Could not remove %s: %s", path, e)


def _makedirs(path: str):
    if _is_url(path):
        if not _fs().exists(path):
            _fs().mkdirs(path)  # a no-op on object stores
    else:
        os.makedirs(path, exist_ok=True)


def _read_json(path: str) -> dict:
    with _open_read(path) as f:
        return json.loads(f.read().decode("utf-8"))


def _read_manifest(path: str) -> dict:
    if not _is_url(path):
        return manifest_lib.read_manifest(path)
    try:
        manifest = _read_json(path)
    except (OSError, ValueError) as e:
        raise manifest_lib.ManifestError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != manifest_lib.FORMAT:
        raise manifest_lib.ManifestError(f"{path}: not a tfrecord_builder manifest")
    return manifest


def _write_manifest(output_dir: str, manifest: dict):
    if not _is_url(output_dir):
        manifest_lib.write_manifest(output_dir, manifest)
        return
    text = json.dumps(manifest, indent=2, sort_keys=False) + "\n"  # as write_manifest does
    _write_file(_join(output_dir, manifest_lib.MANIFEST_NAME), text.encode("utf-8"))


# ----------------------------------------------------------------------------- sources


def _open_source(cfg: BuildConfig) -> Source:
    """build.open_source, plus inputs given as filesystem URLs (gs://bucket/dir/*.txt)."""
    if cfg.tfds_name or not any(_is_url(p) for p in cfg.inputs):
        return open_source(cfg)
    found: Dict[str, Tuple[int, float]] = {}
    local = [p for p in cfg.inputs if p.strip() and not _is_url(p.strip())]
    if local:
        for path in corpus.expand_inputs(local):
            if not os.access(path, os.R_OK):
                raise BuildError(f"cannot read {path}: permission denied")
            st = os.stat(path)
            found[path] = (st.st_size, st.st_mtime_ns)
    for pattern in (p.strip() for p in cfg.inputs):
        if not _is_url(pattern):
            continue
        metas = _match(pattern)
        if not metas and not any(c in pattern for c in "*?["):  # a "directory"
            metas = _match(pattern.rstrip("/") + "/**")
        metas = [m for m in metas if not m.path.endswith("/")
                 and not _basename(m.path).startswith(".")]
        if not metas:
            raise BuildError(f"--input: {pattern} matches no files")
        for m in metas:
            found[m.path] = (m.size_in_bytes, m.last_updated_in_seconds)
    names = sorted(found)
    return Source(tuple(names), tuple(found[n][0] for n in names),
                  {"files": [[n, found[n][0], found[n][1]] for n in names]})


def _match(pattern: str):
    try:
        return [m for r in _fs().match([pattern]) for m in r.metadata_list]
    except Exception as e:  # BeamIOError, or no filesystem for the scheme
        raise BuildError(f"--input: cannot list {pattern}: {e}") from None


def _iter_input_chunks(path: str, file_index: int, chunk_bytes: int):
    """corpus.iter_file_chunks, also for a URL (copied to a local temp file first)."""
    if not _is_url(path):
        yield from corpus.iter_file_chunks(path, file_index, chunk_bytes)
        return
    tmp_dir = tempfile.mkdtemp(prefix="tfrecord_builder-input-")
    suffix = next((s for s in (".gz", ".bz2") if path.endswith(s)), "")
    local = os.path.join(tmp_dir, "input" + suffix)  # keeps the decompression by extension
    try:
        with _open_read(path) as src, open(local, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        try:
            for chunk in corpus.iter_file_chunks(local, file_index, chunk_bytes):
                yield dataclasses.replace(chunk, path=path)
        except BuildError as e:
            raise BuildError(str(e).replace(local, path)) from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


# ----------------------------------------------------------------------------- pipeline
# Functions used by the pipeline live at module level, so they pickle by reference.


def _shard_paths(_, directory: str, num_shards: int) -> List[str]:
    return [_join(directory, shard_name(i, num_shards)) for i in range(num_shards)]


def count_records(path: str) -> int:
    """The number of records of a TFRecord file, read from the length headers only."""
    size = _file_size(path)
    n, pos = 0, 0
    with _open_read(path) as f:
        while pos < size:
            f.seek(pos)
            header = f.read(12)
            if len(header) < 12:
                break
            (length,) = struct.unpack("<Q", header[:8])
            pos += 12 + length + 4
            n += 1
    if pos != size:
        raise BuildError(f"{path}: truncated TFRecord file ({size} bytes, records end at {pos})")
    return n


def _count_shard(path: str) -> Tuple[str, int]:
    return _basename(path), count_records(path)


def _write_json(value, path: str):
    _write_file(path, json.dumps(value).encode("utf-8"))


def _first_skips(skips: List[tuple]) -> List[tuple]:
    """The skipped-line examples the local build keeps: the first ones in chunk order."""
    return heapq.nsmallest(MAX_SKIP_EXAMPLES, skips)


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
            if self.cfg.tfds_name:
                from tfrecord_builder import tfds_source
                chunks = tfds_source.iter_tfds_chunks(self.cfg)
            else:
                chunks = _iter_input_chunks(path, file_index, self.cfg.chunk_bytes)
            counter = beam.metrics.Metrics.counter("tfrecord_builder", "chunks")
            for chunk in chunks:
                counter.inc()
                yield chunk

    class EncodeChunk(beam.DoFn):
        """Chunk -> its serialized examples (main output) and (file_index, chunk index,
        ChunkStats) on the "stats" output. The tokenizer is built once per instance."""

        def __init__(self, vocab: VocabInfo, vocab_bytes: bytes, max_seq_length: int,
                     seed: int):
            super().__init__()
            self.vocab, self.vocab_bytes = vocab, vocab_bytes
            self.max_seq_length, self.seed = max_seq_length, seed
            self.tokenizer = None

        def setup(self):
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            from tfrecord_builder.tokenizers import Tokenizer
            # The vocabulary travels with the job: workers need not see the launcher's disk.
            tmp_dir = tempfile.mkdtemp(prefix="tfrecord_builder-vocab-")
            try:
                path = os.path.join(tmp_dir, os.path.basename(self.vocab.path) or "vocab")
                with open(path, "wb") as f:
                    f.write(self.vocab_bytes)
                self.tokenizer = Tokenizer(dataclasses.replace(self.vocab, path=path))
            finally:
                shutil.rmtree(tmp_dir, ignore_errors=True)
            metrics = beam.metrics.Metrics
            self.examples = metrics.counter("tfrecord_builder", "examples")
            self.tokens = metrics.counter("tfrecord_builder", "corpus_tokens")

        def process(self, chunk):
            packed, stats = encode_chunk(chunk, self.tokenizer, self.max_seq_length, self.seed)
            yield from serialize_examples(packed)
            self.examples.inc(stats.examples)
            self.tokens.inc(stats.corpus_tokens)
            yield beam.pvalue.TaggedOutput("stats", (chunk.file_index, chunk.index, stats))

    class CombineStats(beam.CombineFn):
        """Sums chunk stats as examples.merge_stats does; the accumulator is
        (ChunkStats, dense unigram counts, corpus tokens per input, skip examples)."""

        def __init__(self, vocab_size: int):
            super().__init__()
            self.vocab_size = vocab_size

        def create_accumulator(self):
            return ChunkStats(), np.zeros([self.vocab_size], np.int64), {}, []

        def add_input(self, acc, item):
            totals, counts, per_input, skips = acc
            file_index, chunk_index, stats = item
            merge_stats(totals, dataclasses.replace(stats, skip_examples=[]), counts)
            per_input[file_index] = per_input.get(file_index, 0) + stats.corpus_tokens
            skips = _first_skips(skips + [((file_index, chunk_index, j), s)
                                          for j, s in enumerate(stats.skip_examples)])
            return totals, counts, per_input, skips

        def merge_accumulators(self, accumulators):
            totals, counts, per_input, skips = self.create_accumulator()
            for t, c, p, s in accumulators:
                merge_stats(totals, dataclasses.replace(t, skip_examples=[]), counts)
                counts += c
                for k, v in p.items():
                    per_input[k] = per_input.get(k, 0) + v
                skips = _first_skips(skips + list(s))
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
    from apache_beam.io.filesystem import CompressionTypes
    fns = _beam_fns()
    if cfg.tfds_name:
        inputs = [(0, cfg.tfds_name)]
    else:
        inputs = list(enumerate(source.names))
    chunks = (p
              | "Inputs" >> beam.Create(inputs)
              | "SpreadInputs" >> beam.Reshuffle()
              | "ReadChunks" >> beam.ParDo(fns["ReadChunks"](cfg))
              | "SpreadChunks" >> beam.Reshuffle())
    encoded = chunks | "Encode" >> beam.ParDo(
        fns["EncodeChunk"](vocab, vocab_bytes, cfg.max_seq_length, cfg.seed)
    ).with_outputs("stats", main="records")
    written = encoded.records | "WriteShards" >> beam.io.WriteToTFRecord(
        file_path_prefix=_join(staging, SHARD_PREFIX), num_shards=cfg.num_shards,
        shard_name_template="-SSSSS-of-NNNNN",
        compression_type=CompressionTypes.UNCOMPRESSED)
    # Count each shard once all are written: the expected names, not the writer's output
    # (which may omit shards a retried finalize step had already renamed).
    _ = (written
         | "ShardsWritten" >> beam.combiners.Count.Globally()
         | "ShardNames" >> beam.FlatMap(_shard_paths, staging, cfg.num_shards)
         | "SpreadShards" >> beam.Reshuffle()
         | "CountRecords" >> beam.Map(_count_shard)
         | "AllCounts" >> beam.combiners.ToList()
         | "WriteCounts" >> beam.Map(_write_json, _join(staging, SHARD_COUNTS_NAME)))
    _ = (encoded.stats
         | "CombineStats" >> beam.CombineGlobally(fns["CombineStats"](vocab.vocab_size))
         | "WriteStats" >> beam.Map(_write_json, _join(staging, STATS_NAME)))


# ----------------------------------------------------------------------------- build


def _prepare_output(cfg: BuildConfig, fingerprint: str, staging: str) -> Optional[dict]:
    """Returns the existing manifest when this exact build is already complete."""
    _makedirs(cfg.output_dir)
    path = _join(cfg.output_dir, manifest_lib.MANIFEST_NAME)
    if _exists(path):
        try:
            old = _read_manifest(path)
        except manifest_lib.ManifestError:
            old = {}
        if old.get("build_fingerprint") == fingerprint and not cfg.overwrite:
            return old
        if not cfg.overwrite:
            raise BuildError(f"--output_dir {cfg.output_dir} already holds a different build "
                             f"({path}); pass --overwrite to replace it or choose another "
                             "directory")
        # The marker of completeness goes first, then the old shards.
        _remove([path])
        _remove([_join(cfg.output_dir, s["name"]) for s in old.get("shards", [])])
    _remove_tree(staging)  # what a failed run left
    return None


def _beam_fingerprint(cfg: BuildConfig, source: Source, vocab: VocabInfo) -> str:
    """The local build's fingerprint, marked as Beam's: same examples, other shards."""
    local = _fingerprint(cfg, source, vocab)
    return hashlib.sha256(f"beam:{local}".encode()).hexdigest()


def _check_crc32c():
    """Beam's TFRecord writer needs a CRC32C implementation; say so before the job runs."""
    from apache_beam.io import tfrecordio
    crc = getattr(tfrecordio, "_default_crc32c_fn", None)
    if crc is None:
        return
    try:
        crc(b"")
    except RuntimeError:
        raise BuildError("Beam's TFRecord writer needs a CRC32C library: "
                         "pip install google-crc32c (or pip install -e .[beam])") from None


def build_with_beam(cfg: BuildConfig, runner: Optional[str] = None,
                    beam_options: Sequence[str] = ()) -> dict:
    """Builds the dataset of `cfg` as a Beam pipeline on `runner`; returns the manifest."""
    beam = _import_beam()
    runner = runner or DEFAULT_RUNNER
    cfg.check()
    _check_crc32c()
    vocab = vocab_info(cfg.vocab_file, cfg.spm_model, cfg.do_lower_case)
    with open(vocab.path, "rb") as f:
        vocab_bytes = f.read()
    if hashlib.sha256(vocab_bytes).hexdigest() != vocab.sha256:
        raise BuildError(f"{vocab.path} changed while it was read; run again")
    source = _open_source(cfg)
    fingerprint = _beam_fingerprint(cfg, source, vocab)
    staging = _join(cfg.output_dir, STAGING_DIR)
    try:
        done = _prepare_output(cfg, fingerprint, staging)
    except ValueError as e:  # no Beam filesystem for the URL's scheme
        raise BuildError(f"--output_dir {cfg.output_dir}: {e}") from None
    if done is not None:
        logging.info("%s already holds this build (%d examples); nothing to do.",
                     cfg.output_dir, done["examples"])
        return done
    _makedirs(staging)

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
        _discard(staging)  # nothing was published; drop the partial output
        raise
    if str(state).rsplit(".", 1)[-1] != "DONE":
        _discard(staging)
        raise BuildError(f"the Beam pipeline on {runner} ended in state {state}; "
                         f"nothing was published in {cfg.output_dir}")
    run_s = time.monotonic() - t0

    result = _read_json(_join(staging, STATS_NAME))
    stats = ChunkStats.from_json(result["totals"])
    vocab_counts = result["vocab_counts"]
    tokens_per_input = dict((int(k), v) for k, v in result["tokens_per_input"])
    if stats.examples == 0:
        _remove_tree(staging)
        raise BuildError(f"no text to build from: {', '.join(source.names)} "
                         "hold no tokenizable lines")
    names = [shard_name(i, cfg.num_shards) for i in range(cfg.num_shards)]
    shard_counts = dict(_read_json(_join(staging, SHARD_COUNTS_NAME)))
    missing = [n for n in names if n not in shard_counts]
    if missing:
        raise BuildError(f"the Beam pipeline did not write {', '.join(missing)}")
    counts = [int(shard_counts[n]) for n in names]
    if sum(counts) != stats.examples:
        raise BuildError(f"the Beam pipeline wrote {sum(counts)} records but encoded "
                         f"{stats.examples} examples; nothing was published")
    empty_inputs = [name for i, name in enumerate(source.names) if not tokens_per_input.get(i)]

    _move([_join(staging, n) for n in names], [_join(cfg.output_dir, n) for n in names])
    _write_file(_join(cfg.output_dir, TOKEN_COUNTS_NAME),
                ("\n".join(map(str, vocab_counts)) + "\n").encode("ascii"))
    manifest = make_manifest(cfg, vocab, source, stats, names, counts, empty_inputs,
                             fingerprint)
    _write_manifest(cfg.output_dir, manifest)
    _remove_tree(staging)
    logging.info("Wrote %d examples (%d tokens, retention %.4f) in %d shards to %s in %.1fs "
                 "(pipeline %.1fs on %s)", stats.examples, stats.example_tokens,
                 manifest["retention"], cfg.num_shards, cfg.output_dir,
                 time.monotonic() - t0, run_s, runner)
    return manifest
