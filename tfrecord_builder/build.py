"""The local build: chunks -> worker processes -> pieces -> round-robin shards -> manifest.

Work is cut into document-aligned chunks whose examples depend only on the chunk and
the seed, so the shards are byte-identical whatever --num_workers is. Each finished
chunk is kept as a piece under `.building/`; a rerun reuses them (resume), and nothing
with a final name appears until every shard is complete. The manifest comes last.
"""

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import struct
import sys
import time
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
from absl import logging

from tfrecord_builder import BuildError, __version__
from tfrecord_builder import corpus, manifest as manifest_lib
from tfrecord_builder.examples import ChunkStats, encode_chunk, merge_stats, serialize_examples
from tfrecord_builder.progress import Progress
from tfrecord_builder.tokenizers import VocabInfo, vocab_info

STATE_DIR = ".building"
SHARD_PREFIX = "pretrain_data.tfrecord"
TOKEN_COUNTS_NAME = "token_counts.txt"


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    output_dir: str
    inputs: Tuple[str, ...] = ()
    vocab_file: Optional[str] = None
    spm_model: Optional[str] = None
    do_lower_case: bool = True
    max_seq_length: int = 128
    num_shards: int = 16
    num_workers: int = 1
    seed: int = 12345
    chunk_bytes: int = 1 << 19
    resume: bool = True
    overwrite: bool = False
    tfds_name: Optional[str] = None
    tfds_split: str = "train"
    tfds_text_key: str = "text"
    tfds_data_dir: Optional[str] = None

    def check(self):
        if self.max_seq_length < 5:
            raise BuildError(f"--max_seq_length={self.max_seq_length}: must be at least 5")
        if self.num_shards < 1:
            raise BuildError(f"--num_shards={self.num_shards}: must be at least 1")
        if self.num_workers < 1:
            raise BuildError(f"--num_workers={self.num_workers}: must be at least 1")
        if self.chunk_bytes < 1024:
            raise BuildError(f"--chunk_bytes={self.chunk_bytes}: must be at least 1024")
        if bool(self.inputs) == bool(self.tfds_name):
            raise BuildError("give either --input or --tfds_name")


def shard_name(i: int, n: int) -> str:
    return f"{SHARD_PREFIX}-{i:05d}-of-{n:05d}"


# ----------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class Source:
    """The corpus as an ordered list of inputs that each yield chunks."""
    names: Tuple[str, ...]
    sizes: Tuple[int, ...]
    fingerprint: dict

    def chunks(self, cfg: BuildConfig) -> Iterator[corpus.Chunk]:
        if cfg.tfds_name:
            from tfrecord_builder import tfds_source
            yield from tfds_source.iter_tfds_chunks(cfg)
            return
        for file_index, path in enumerate(self.names):
            yield from corpus.iter_file_chunks(path, file_index, cfg.chunk_bytes)


def open_source(cfg: BuildConfig) -> Source:
    if cfg.tfds_name:
        from tfrecord_builder import tfds_source
        return tfds_source.open_tfds_source(cfg)
    files = corpus.expand_inputs(cfg.inputs)
    sizes = []
    stamps = []
    for path in files:
        if not os.access(path, os.R_OK):
            raise BuildError(f"cannot read {path}: permission denied")
        st = os.stat(path)
        sizes.append(st.st_size)
        stamps.append([path, st.st_size, st.st_mtime_ns])
    return Source(tuple(files), tuple(sizes), {"files": stamps})


def _fingerprint(cfg: BuildConfig, source: Source, vocab: VocabInfo) -> str:
    key = {
        "builder": __version__, "max_seq_length": cfg.max_seq_length,
        "num_shards": cfg.num_shards, "seed": cfg.seed, "chunk_bytes": cfg.chunk_bytes,
        "tokenizer": vocab.to_json(), "source": source.fingerprint,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- workers

_WORKER = {}


def _die_with_parent():
    """Linux: the kernel sends this worker SIGKILL when the build process dies, so a
    killed build (kill -9) leaves no orphaned workers behind. Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _init_worker(vocab: VocabInfo):
    from tfrecord_builder.tokenizers import Tokenizer
    _die_with_parent()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _WORKER["tokenizer"] = Tokenizer(vocab)


def _piece_paths(pieces_dir: str, chunk: corpus.Chunk) -> Tuple[str, str]:
    stem = os.path.join(pieces_dir, f"f{chunk.file_index:06d}-c{chunk.index:07d}")
    return stem + ".tfrecord", stem + ".stats.npz"


def _process_chunk(chunk: corpus.Chunk, pieces_dir: str, max_seq_length: int,
                   seed: int) -> ChunkStats:
    """Worker: encode a chunk, write its records as a piece, then its stats (the marker)."""
    import tensorflow as tf
    packed, stats = encode_chunk(chunk, _WORKER["tokenizer"], max_seq_length, seed)
    records = serialize_examples(packed)
    piece, marker = _piece_paths(pieces_dir, chunk)
    with tf.io.TFRecordWriter(piece + ".tmp") as writer:
        for record in records:
            writer.write(record)
    os.replace(piece + ".tmp", piece)
    with open(marker + ".tmp", "wb") as f:
        np.savez(f, stats=np.array(json.dumps(stats.to_json())),
                 count_ids=stats.count_ids, counts=stats.counts)
    os.replace(marker + ".tmp", marker)
    return stats


def _load_stats(marker: str) -> Optional[ChunkStats]:
    try:
        with np.load(marker) as z:
            return ChunkStats.from_json(json.loads(str(z["stats"])), z["count_ids"], z["counts"])
    except (OSError, ValueError, KeyError):
        return None


class _Runner:
    """Runs chunks in order, in-process or on a bounded pool of spawned workers."""

    def __init__(self, cfg: BuildConfig, vocab: VocabInfo, pieces_dir: str):
        self.cfg, self.pieces_dir = cfg, pieces_dir
        self.pool = None
        if cfg.num_workers > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=cfg.num_workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(vocab,))
        else:
            _init_worker(vocab)

    def run(self, chunks: Iterator[corpus.Chunk]) -> Iterator[Tuple[corpus.Chunk, ChunkStats, bool]]:
        """Yields (chunk, stats, reused) in chunk order; at most 2 x workers in flight."""
        args = (self.pieces_dir, self.cfg.max_seq_length, self.cfg.seed)
        pending: List[Tuple[corpus.Chunk, object, bool]] = []
        limit = 2 * self.cfg.num_workers
        for chunk in chunks:
            stats = _load_stats(_piece_paths(self.pieces_dir, chunk)[1]) if self.cfg.resume else None
            if stats is not None:
                pending.append((chunk, stats, True))
            elif self.pool is None:
                pending.append((chunk, _process_chunk(chunk, *args), False))
            else:
                pending.append((chunk, self.pool.submit(_process_chunk, chunk, *args), False))
            while len(pending) > limit or (pending and not _is_future(pending[0][1])):
                yield _resolve(pending.pop(0))
        while pending:
            yield _resolve(pending.pop(0))

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _is_future(x) -> bool:
    return isinstance(x, concurrent.futures.Future)


def _resolve(item):
    chunk, result, reused = item
    if _is_future(result):
        result = result.result()
    return dataclasses.replace(chunk, data=b""), result, reused


# ----------------------------------------------------------------------------- shards


def iter_framed_records(path: str) -> Iterator[bytes]:
    """Yields each TFRecord of `path` with its framing (length, CRCs) intact, so it can
    be copied into another TFRecord file byte for byte."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise BuildError(f"{path}: truncated record header at byte {pos}")
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        if end > len(data):
            raise BuildError(f"{path}: truncated record at byte {pos}")
        yield data[pos:end]
        pos = end


def _assemble_shards(pieces: Sequence[str], shards_dir: str, num_shards: int) -> List[int]:
    """Deals the records of `pieces` (in order) round-robin into `num_shards` files."""
    os.makedirs(shards_dir, exist_ok=True)
    counts = [0] * num_shards
    group = 512  # shards open at once; more shards take more passes over the pieces
    for lo in range(0, num_shards, group):
        hi = min(num_shards, lo + group)
        files = [open(os.path.join(shards_dir, shard_name(i, num_shards)), "wb")
                 for i in range(lo, hi)]
        try:
            g = 0
            for piece in pieces:
                for record in iter_framed_records(piece):
                    s = g % num_shards
                    if lo <= s < hi:
                        files[s - lo].write(record)
                        counts[s] += 1
                    g += 1
        finally:
            for f in files:
                f.flush()
                os.fsync(f.fileno())
                f.close()
    return counts


# ----------------------------------------------------------------------------- build


def _prepare_output(cfg: BuildConfig, fingerprint: str) -> Optional[dict]:
    """Returns the existing manifest when this exact build is already complete."""
    os.makedirs(cfg.output_dir, exist_ok=True)
    path = os.path.join(cfg.output_dir, manifest_lib.MANIFEST_NAME)
    if os.path.exists(path):
        try:
            old = manifest_lib.read_manifest(path)
        except manifest_lib.ManifestError:
            old = {}
        if old.get("build_fingerprint") == fingerprint and not cfg.overwrite:
            return old
        if not cfg.overwrite:
            raise BuildError(f"--output_dir {cfg.output_dir} already holds a different build "
                             f"({path}); pass --overwrite to replace it or choose another directory")
        # Remove the marker of completeness first, then the old shards.
        os.remove(path)
        for shard in old.get("shards", []):
            try:
                os.remove(os.path.join(cfg.output_dir, shard["name"]))
            except OSError:
                pass
    state_dir = os.path.join(cfg.output_dir, STATE_DIR)
    state_file = os.path.join(state_dir, "state.json")
    state = {}
    if os.path.exists(state_file):
        try:
            with open(state_file) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {}
    if state.get("fingerprint") != fingerprint or not cfg.resume or cfg.overwrite:
        if os.path.exists(state_dir):
            logging.info("Discarding an unfinished build in %s", state_dir)
            shutil.rmtree(state_dir)
    os.makedirs(os.path.join(state_dir, "pieces"), exist_ok=True)
    with open(state_file + ".tmp", "w") as f:
        json.dump({"fingerprint": fingerprint}, f)
    os.replace(state_file + ".tmp", state_file)
    return None


def build(cfg: BuildConfig, progress_stream=None) -> dict:
    """Builds the dataset described by `cfg`; returns the manifest."""
    cfg.check()
    vocab = vocab_info(cfg.vocab_file, cfg.spm_model, cfg.do_lower_case)
    source = open_source(cfg)
    fingerprint = _fingerprint(cfg, source, vocab)
    done = _prepare_output(cfg, fingerprint)
    if done is not None:
        logging.info("%s already holds this build (%d examples); nothing to do.",
                     cfg.output_dir, done["examples"])
        return done

    state_dir = os.path.join(cfg.output_dir, STATE_DIR)
    pieces_dir = os.path.join(state_dir, "pieces")
    total_bytes = sum(source.sizes)
    offsets = np.concatenate([[0], np.cumsum(source.sizes)]).tolist()
    progress = Progress(total_bytes, "tfrecord_builder", stream=progress_stream)
    totals = ChunkStats()
    vocab_counts = np.zeros([vocab.vocab_size], np.int64)
    pieces, reused = [], 0
    tokens_per_input = [0] * len(source.names)
    t0 = time.monotonic()
    runner = _Runner(cfg, vocab, pieces_dir)
    try:
        for chunk, stats, was_reused in runner.run(source.chunks(cfg)):
            merge_stats(totals, stats, vocab_counts)
            pieces.append(_piece_paths(pieces_dir, chunk)[0])
            tokens_per_input[chunk.file_index] += stats.corpus_tokens
            reused += was_reused
            progress.update(offsets[chunk.file_index] + chunk.raw_pos, stats.corpus_tokens)
    finally:
        runner.close()
    progress.close()
    encode_s = time.monotonic() - t0
    empty_inputs = [name for name, n in zip(source.names, tokens_per_input) if n == 0]
    if totals.examples == 0:
        raise BuildError(f"no text to build from: {', '.join(source.names)} "
                         "hold no tokenizable lines")

    shards_dir = os.path.join(state_dir, "shards")
    if os.path.exists(shards_dir):
        shutil.rmtree(shards_dir)
    counts = _assemble_shards(pieces, shards_dir, cfg.num_shards)
    names = [shard_name(i, cfg.num_shards) for i in range(cfg.num_shards)]
    for name in names:
        os.replace(os.path.join(shards_dir, name), os.path.join(cfg.output_dir, name))
    with open(os.path.join(cfg.output_dir, TOKEN_COUNTS_NAME + ".tmp"), "w") as f:
        f.write("\n".join(map(str, vocab_counts.tolist())) + "\n")
    os.replace(os.path.join(cfg.output_dir, TOKEN_COUNTS_NAME + ".tmp"),
               os.path.join(cfg.output_dir, TOKEN_COUNTS_NAME))

    manifest = make_manifest(cfg, vocab, source, totals, names, counts, empty_inputs,
                             fingerprint)
    manifest_lib.write_manifest(cfg.output_dir, manifest)
    shutil.rmtree(state_dir, ignore_errors=True)
    elapsed = time.monotonic() - t0
    logging.info("Wrote %d examples (%d tokens, retention %.4f) in %d shards to %s in %.1fs "
                 "(%d chunks reused; encode %.1fs)", totals.examples, totals.example_tokens,
                 manifest["retention"], cfg.num_shards, cfg.output_dir, elapsed, reused, encode_s)
    return manifest


def make_manifest(cfg: BuildConfig, vocab: VocabInfo, source: Source, totals: ChunkStats,
                  names: Sequence[str], counts: Sequence[int], empty_inputs: Sequence[str],
                  fingerprint: str) -> dict:
    retention = totals.example_tokens / totals.corpus_tokens if totals.corpus_tokens else 0.0
    slots = totals.examples * cfg.max_seq_length
    return {
        "format": manifest_lib.FORMAT,
        "format_version": manifest_lib.FORMAT_VERSION,
        "builder_version": __version__,
        "max_seq_length": cfg.max_seq_length,
        "examples": totals.examples,
        "corpus_tokens": totals.corpus_tokens,
        "example_tokens": totals.example_tokens,
        "retention": round(retention, 6),
        "fill": round((totals.example_tokens + 0.0) / slots, 6) if slots else 0.0,
        "documents": totals.documents,
        "lines": totals.lines,
        "skipped_lines": dict(sorted(totals.skipped.items())),
        "skipped_line_examples": totals.skip_examples,
        "empty_inputs": list(empty_inputs),
        "tokenizer": vocab.to_json(),
        "seed": cfg.seed,
        "chunk_bytes": cfg.chunk_bytes,
        "num_shards": cfg.num_shards,
        "features": {k: f"int64[{cfg.max_seq_length}]"
                     for k in ("input_ids", "input_mask", "segment_ids")},
        "inputs": list(source.names),
        "token_counts_file": TOKEN_COUNTS_NAME,
        "shards": [{"name": n, "examples": c} for n, c in zip(names, counts)],
        "build_fingerprint": fingerprint,
    }
