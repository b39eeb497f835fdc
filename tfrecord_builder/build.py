"""The local build: chunks -> worker processes -> pieces -> round-robin shards -> manifest.

A chunk's examples depend only on the chunk and the seed, so the shards are byte-identical
whatever --num_workers is. A finished chunk is a piece under `.building/pieces`: its
records, then a marker (`.stats.npz`) that vouches for them; a rerun reuses the pieces.
For a remote --output_dir (gs://, ram://) workers stage pieces locally and the main
process copies them over, marker last. Shards are dealt under `.building/shards/`,
renamed into place, then token_counts.txt, and manifest.json last: where a rename is a
copy, a kill leaves no manifest or one whose shards are all there.
"""

import concurrent.futures
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import multiprocessing
import os
import signal
import struct
import sys
import time
import zipfile
from typing import Iterator, List, Optional, Sequence, Tuple

from tfrecord_builder import BuildError, __version__, import_tensorflow, start_worker

import_tensorflow()  # where installed: before the imports below, which then use it
import numpy as np
from absl import logging

from electra_tf import fileio
from electra_tf.data import manifest as manifest_lib
from tfrecord_builder import corpus, tfds_source
from tfrecord_builder.examples import (FEATURES, ChunkStats, encode_chunk, merge_stats,
                                       serialize_examples, write_records)
from tfrecord_builder.progress import Progress
from electra_tf.text import (RUN_VOCAB_FILES, Tokenizer, VocabInfo, read_vocab_data,
                             vocab_info)

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
        for flag, least in (("max_seq_length", 5), ("num_shards", 1), ("num_workers", 1),
                            ("chunk_bytes", 1024)):
            if getattr(self, flag) < least:
                raise BuildError(f"--{flag}={getattr(self, flag)}: must be at least {least}")
        if bool(self.inputs) == bool(self.tfds_name):
            raise BuildError("give either --input or --tfds_name")


def shard_name(i: int, n: int) -> str:
    return f"{SHARD_PREFIX}-{i:05d}-of-{n:05d}"


# ----------------------------------------------------------------------------- sources


def open_inputs(cfg: BuildConfig) -> Tuple[VocabInfo, bytes, corpus.Source]:
    """Checks `cfg` and what it reads: (vocabulary, its bytes for the workers, source:
    cfg's files or its tensorflow-datasets split)."""
    cfg.check()
    vocab = vocab_info(cfg.vocab_file, cfg.spm_model, cfg.do_lower_case)
    source = tfds_source.open_tfds_source(cfg) if cfg.tfds_name else corpus.open_files(cfg.inputs)
    return vocab, read_vocab_data(vocab), source


def input_chunks(cfg: BuildConfig, file_index: int, path: str) -> Iterator[corpus.Chunk]:
    """The chunks of the source's input `file_index` (named `path`): a file, or the
    tensorflow-datasets split (a TFDS source's only input), read where this runs."""
    if cfg.tfds_name:
        return tfds_source.iter_tfds_chunks(cfg)
    return corpus.iter_file_chunks(path, file_index, cfg.chunk_bytes)


def build_fingerprint(cfg: BuildConfig, source: corpus.Source, vocab: VocabInfo) -> str:
    """What identifies the local build's output: a finished or unfinished build with the
    same fingerprint is this one."""
    key = {
        "builder": __version__, "max_seq_length": cfg.max_seq_length,
        "num_shards": cfg.num_shards, "seed": cfg.seed, "chunk_bytes": cfg.chunk_bytes,
        "tokenizer": vocab.to_json(), "source": source.fingerprint,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- workers

_WORKER = {}


def _die_with_parent():
    """Linux: the worker gets SIGKILL when the build process dies (no orphans)."""
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


def _init_worker(vocab: VocabInfo, vocab_data: Optional[bytes] = None):
    """`vocab_data`: the vocabulary's bytes (a worker need not see the file), else read."""
    _die_with_parent()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _WORKER["tokenizer"] = Tokenizer(vocab, vocab_data)


PIECE_SUFFIX = ".tfrecord"
MARKER_SUFFIX = ".stats.npz"


def _piece_stem(chunk: corpus.Chunk) -> str:
    return f"f{chunk.file_index:06d}-c{chunk.index:07d}"


def _piece_paths(pieces_dir: str, chunk: corpus.Chunk) -> Tuple[str, str]:
    stem = fileio.join(pieces_dir, _piece_stem(chunk))
    return stem + PIECE_SUFFIX, stem + MARKER_SUFFIX


def _process_chunk(chunk: corpus.Chunk, pieces_dir: str, max_seq_length: int,
                   seed: int) -> ChunkStats:
    """Worker: encode a chunk, write its records as a piece, then its stats (the marker)."""
    packed, stats = encode_chunk(chunk, _WORKER["tokenizer"], max_seq_length, seed)
    records = serialize_examples(packed)
    piece, marker = _piece_paths(pieces_dir, chunk)
    with fileio.atomic_output(piece) as tmp:
        write_records(tmp, records)
    buf = io.BytesIO()
    np.savez(buf, stats=np.array(json.dumps(stats.to_json())),
             count_ids=stats.count_ids, counts=stats.counts)
    fileio.write_atomic(marker, buf.getvalue())
    return stats


def _load_stats(marker: str) -> Optional[ChunkStats]:
    """The stats of a finished piece, None when its marker is missing or unreadable."""
    try:
        data = fileio.read_bytes(marker)
        with np.load(io.BytesIO(data)) as z:
            return ChunkStats.from_json(json.loads(str(z["stats"])), z["count_ids"], z["counts"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def _publish_piece(staging_dir: str, pieces_dir: str, chunk: corpus.Chunk,
                   stale: bool = False):
    """Main process: copies a piece a worker staged locally into `pieces_dir`, records
    first, marker last (a kill in between: redone on resume), then drops the local copy.
    `stale`: a killed run left records under the piece's name (removed first: ram://
    appends to a file it reopens for writing)."""
    src_piece, src_marker = _piece_paths(staging_dir, chunk)
    dst_piece, dst_marker = _piece_paths(pieces_dir, chunk)
    if stale:
        fileio.remove(dst_piece)
    fileio.copy(src_piece, dst_piece, overwrite=True)
    fileio.write_atomic(dst_marker, fileio.read_bytes(src_marker))
    fileio.remove(src_piece)
    fileio.remove(src_marker)


class _Runner:
    """Runs chunks in order, in-process or on a bounded pool of spawned workers (which
    stage their pieces locally when `pieces_dir` is remote)."""

    def __init__(self, cfg: BuildConfig, vocab: VocabInfo, vocab_data: bytes, pieces_dir: str):
        self.cfg, self.pieces_dir = cfg, pieces_dir
        self.pool = None
        self.staging_dir = None
        self._stack = contextlib.ExitStack()
        # One listing instead of a (remote) read per chunk to find the finished pieces.
        self.finished = set(fileio.listdir(pieces_dir))
        try:
            if cfg.num_workers > 1:
                if fileio.is_remote(pieces_dir):
                    self.staging_dir = self._stack.enter_context(
                        fileio.local_staging_dir("tfrecord_builder-pieces-"))
                self.pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=cfg.num_workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=start_worker, initargs=(dataclasses.asdict(vocab), vocab_data))
            else:
                _init_worker(vocab, vocab_data)
        except BaseException:
            self._stack.close()
            raise

    def run(self, chunks: Iterator[corpus.Chunk]) -> Iterator[Tuple[corpus.Chunk, ChunkStats, bool]]:
        """Yields (chunk, stats, reused) in chunk order; at most 2 x workers in flight."""
        args = (self.staging_dir or self.pieces_dir, self.cfg.max_seq_length, self.cfg.seed)
        pending: List[Tuple[corpus.Chunk, object, bool]] = []
        limit = 2 * self.cfg.num_workers
        for chunk in chunks:
            stats = None
            if self.cfg.resume and _piece_stem(chunk) + MARKER_SUFFIX in self.finished:
                stats = _load_stats(_piece_paths(self.pieces_dir, chunk)[1])
            if stats is not None:
                pending.append((chunk, stats, True))
            elif self.pool is None:
                pending.append((chunk, _process_chunk(chunk, *args), False))
            else:
                pending.append((chunk, self.pool.submit(_process_chunk, chunk, *args), False))
            while len(pending) > limit or (pending and not _is_future(pending[0][1])):
                yield self._resolve(pending.pop(0))
        while pending:
            yield self._resolve(pending.pop(0))

    def _resolve(self, item):
        chunk, result, reused = item
        if _is_future(result):
            result = result.result()
            if self.staging_dir is not None:
                stale = _piece_stem(chunk) + PIECE_SUFFIX in self.finished
                _publish_piece(self.staging_dir, self.pieces_dir, chunk, stale=stale)
        return dataclasses.replace(chunk, data=b""), result, reused

    def close(self):
        try:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
        finally:
            self._stack.close()


def _is_future(x) -> bool:
    return isinstance(x, concurrent.futures.Future)


# ----------------------------------------------------------------------------- shards


def iter_framed_records(path: str) -> Iterator[bytes]:
    """Yields each TFRecord of `path` with its framing (length, CRCs) intact, so it can
    be copied into another TFRecord file byte for byte."""
    data = fileio.read_bytes(path)
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


WRITE_BUFFER = 1 << 18  # bytes gathered per shard before one write call


def _assemble_shards(pieces: Sequence[str], shards_dir: str, num_shards: int) -> List[int]:
    """Deals the records of `pieces` (in order) round-robin into `num_shards` files."""
    fileio.makedirs(shards_dir)
    counts = [0] * num_shards
    group = 512  # shards open at once; more shards take more passes over the pieces
    for lo in range(0, num_shards, group):
        hi = min(num_shards, lo + group)
        files = [fileio.open_file(fileio.join(shards_dir, shard_name(i, num_shards)), "wb")
                 for i in range(lo, hi)]
        buffers = [[] for _ in files]
        buffered = [0] * len(files)
        try:
            g = 0
            for piece in pieces:
                for record in iter_framed_records(piece):
                    s = g % num_shards
                    if lo <= s < hi:
                        j = s - lo
                        buffers[j].append(record)
                        buffered[j] += len(record)
                        if buffered[j] >= WRITE_BUFFER:
                            files[j].write(b"".join(buffers[j]))
                            buffers[j], buffered[j] = [], 0
                        counts[s] += 1
                    g += 1
            for i, (f, buf) in enumerate(zip(files, buffers), lo):
                if buf:
                    f.write(b"".join(buf))
                elif not counts[i]:
                    # GFile creates its file on the first write, and a shard no example
                    # reaches must exist all the same: the manifest lists it with 0.
                    f.write(b"")
        finally:
            for f in files:
                f.close()
        for i in range(lo, hi):  # on disk before the manifest vouches for them
            fileio.fsync(fileio.join(shards_dir, shard_name(i, num_shards)))
    return counts


# ----------------------------------------------------------------------------- build


@contextlib.contextmanager
def output_dir_errors(cfg: BuildConfig):
    """A filesystem error on --output_dir (no filesystem for the scheme, no access, ...)
    as a one-line BuildError."""
    try:
        yield
    except OSError as e:
        raise BuildError(f"--output_dir {cfg.output_dir}: {fileio.error_reason(e)}") from None


def finished_build(cfg: BuildConfig, fingerprint: str) -> Optional[dict]:
    """Creates --output_dir; returns its manifest when it holds this exact build. A
    different finished build there is an error, or with --overwrite is removed (its
    manifest, the marker of completeness, first, then its shards)."""
    fileio.makedirs(cfg.output_dir)
    path = fileio.join(cfg.output_dir, manifest_lib.MANIFEST_NAME)
    if not fileio.exists(path):
        return None
    try:
        old = manifest_lib.read_manifest(path)
    except manifest_lib.ManifestError:
        old = {}
    if old.get("build_fingerprint") == fingerprint and not cfg.overwrite:
        logging.info("%s already holds this build (%d examples); nothing to do.",
                     cfg.output_dir, old["examples"])
        return old
    if not cfg.overwrite:
        raise BuildError(f"--output_dir {cfg.output_dir} already holds a different build "
                         f"({path}); pass --overwrite to replace it or choose another directory")
    fileio.remove(path)
    for shard in old.get("shards", []):
        try:
            fileio.remove(fileio.join(cfg.output_dir, shard["name"]))
        except OSError:  # already gone: the marker went first, nothing reads it
            pass
    return None


def _out_of_space(e: BaseException) -> bool:
    """A full disk or an exhausted quota. TensorFlow reports ENOSPC and EDQUOT as
    ResourceExhaustedError; an OOM is one too, but says so."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(e, tf.errors.ResourceExhaustedError):
        return not (e.message or "").startswith("OOM")
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def _failed_path(e: BaseException) -> Optional[str]:
    """The file a filesystem error names, when it names one."""
    if isinstance(e, OSError):
        return e.filename if isinstance(e.filename, str) else None
    first = (getattr(e, "message", None) or "").strip().split("\n")[0]
    return first.split("; ", 1)[0] if "; " in first else None


@contextlib.contextmanager
def out_of_space_errors(cfg: BuildConfig, writing: str, cleanup: Optional[str] = None):
    """A full disk while `writing` (its name in the message) as a one-line BuildError
    that names the directory that is full. The finished pieces under `.building/` stay
    for the rerun; `cleanup` (what a rerun rebuilds from them anyway) is removed to give
    back the space it took."""
    try:
        yield
    except Exception as e:  # pylint: disable=broad-except
        if not _out_of_space(e):
            raise
        if cleanup:
            discard(cleanup)
        failed = _failed_path(e)
        # Workers stage their pieces in a local temp directory for a remote output dir:
        # then that disk is the full one, not --output_dir's.
        if failed and fileio.is_remote(cfg.output_dir) and not fileio.is_remote(failed):
            where = f"local staging directory {os.path.dirname(failed)}"
        else:
            where = f"--output_dir {cfg.output_dir}"
        raise BuildError(
            f"{where}: could not write {writing} ({fileio.error_reason(e)}); the chunks "
            f"encoded so far are kept in {fileio.join(cfg.output_dir, STATE_DIR)}: free "
            "space and rerun the same command to resume") from None


def warn_empty_shards(cfg: BuildConfig, counts: Sequence[int]):
    """One log line when shards hold no example (written all the same, as empty files:
    --num_shards fixes the file names and how many hosts can split the data)."""
    empty = sum(1 for c in counts if c == 0)
    if not empty:
        return
    examples = sum(counts)
    hint = (f"; --num_shards={examples} or fewer gives no empty shard"
            if examples < cfg.num_shards else "")
    logging.warning("%d of the %d shards (--num_shards) hold no example (the build has %d "
                    "examples): written as empty files, listed with 0 examples in %s%s",
                    empty, cfg.num_shards, examples, manifest_lib.MANIFEST_NAME, hint)


def discard(path: str):
    """Removes a directory tree, best effort: a failure is logged, not raised (cleanup
    once the output is complete, or while another error is on its way)."""
    try:
        fileio.rmtree(path)
    except Exception as e:  # pylint: disable=broad-except
        logging.warning("Could not remove %s: %s", path, fileio.error_reason(e))


def _prepare_state_dir(cfg: BuildConfig, fingerprint: str, state_dir: str):
    """Keeps the pieces of an unfinished run of this build (resume), else starts over."""
    state_file = fileio.join(state_dir, "state.json")
    state = {}
    if fileio.exists(state_file):
        try:
            state = fileio.read_json(state_file)
        except (OSError, ValueError):
            state = {}
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint \
            or not cfg.resume or cfg.overwrite:
        if fileio.exists(state_dir):
            logging.info("Discarding an unfinished build in %s", state_dir)
            # The state first: a kill mid-way (a bucket deletes file by file) leaves
            # pieces without a state that vouches for them, which the next run discards.
            fileio.remove(state_file)
            fileio.rmtree(state_dir)
    fileio.makedirs(fileio.join(state_dir, "pieces"))
    # The state vouches that the pieces to come belong to this build; each piece's own
    # marker vouches for that piece.
    fileio.write_atomic(state_file, json.dumps({"fingerprint": fingerprint}))


def build(cfg: BuildConfig, progress_stream=None) -> dict:
    """Builds the dataset described by `cfg`; returns the manifest."""
    vocab, vocab_data, source = open_inputs(cfg)
    fingerprint = build_fingerprint(cfg, source, vocab)
    state_dir = fileio.join(cfg.output_dir, STATE_DIR)
    with output_dir_errors(cfg):
        done = finished_build(cfg, fingerprint)
        if done is not None:
            return done
        _prepare_state_dir(cfg, fingerprint, state_dir)
    pieces_dir = fileio.join(state_dir, "pieces")
    offsets = np.concatenate([[0], np.cumsum(source.sizes)]).tolist()
    progress = Progress(sum(source.sizes), "tfrecord_builder", stream=progress_stream)
    totals = ChunkStats()
    vocab_counts = np.zeros([vocab.vocab_size], np.int64)
    pieces, reused = [], 0
    tokens_per_input = [0] * len(source.names)
    t0 = time.monotonic()
    with out_of_space_errors(cfg, "the encoded chunks"):
        runner = _Runner(cfg, vocab, vocab_data, pieces_dir)
        try:
            chunks = (chunk for i, name in enumerate(source.names)
                      for chunk in input_chunks(cfg, i, name))
            for chunk, stats, was_reused in runner.run(chunks):
                merge_stats(totals, stats, vocab_counts)
                pieces.append(_piece_paths(pieces_dir, chunk)[0])
                tokens_per_input[chunk.file_index] += stats.corpus_tokens
                reused += was_reused
                progress.update(offsets[chunk.file_index] + chunk.raw_pos, stats.corpus_tokens)
        except BaseException:
            progress.abandon()
            raise
        finally:
            runner.close()
    progress.close()
    encode_s = time.monotonic() - t0
    empty_inputs = [name for name, n in zip(source.names, tokens_per_input) if n == 0]
    require_examples(totals, source)

    shards_dir = fileio.join(state_dir, "shards")
    with out_of_space_errors(cfg, "the shards", cleanup=shards_dir):
        fileio.rmtree(shards_dir)
        counts = _assemble_shards(pieces, shards_dir, cfg.num_shards)
    warn_empty_shards(cfg, counts)
    with out_of_space_errors(cfg, "the finished build"):
        manifest = publish(cfg, shards_dir, vocab_counts, make_manifest(
            cfg, vocab, source, totals, counts, empty_inputs, fingerprint))
    discard(state_dir)
    logging.info("Wrote %d examples (%d tokens, retention %.4f) in %d shards to %s in %.1fs "
                 "(%d chunks reused; encode %.1fs)", totals.examples, totals.example_tokens,
                 manifest["retention"], cfg.num_shards, cfg.output_dir, time.monotonic() - t0,
                 reused, encode_s)
    return manifest


def require_examples(totals: ChunkStats, source: corpus.Source):
    """A build without a single example is an error naming its inputs."""
    if totals.examples == 0:
        raise BuildError(f"no text to build from: {', '.join(source.names)} "
                         "hold no tokenizable lines")


def publish(cfg: BuildConfig, shards_dir: str, vocab_counts: Sequence[int],
            manifest: dict) -> dict:
    """Moves the finished shards from `shards_dir` into --output_dir, then writes
    token_counts.txt, and the manifest last: it vouches for every file above."""
    for shard in manifest["shards"]:
        fileio.rename(fileio.join(shards_dir, shard["name"]),
                      fileio.join(cfg.output_dir, shard["name"]))
    fileio.write_atomic(fileio.join(cfg.output_dir, TOKEN_COUNTS_NAME),
                        "\n".join(map(str, np.asarray(vocab_counts).tolist())) + "\n")
    # The vocabulary beside the shards (vocab.txt, or spm.model; the manifest records its
    # name and sha256): a run on this build records it in its run directory
    # (pretraining/pretrain.py: record_vocab).
    vocab_path = cfg.spm_model or cfg.vocab_file
    if vocab_path:
        fileio.copy(vocab_path, fileio.join(
            cfg.output_dir, RUN_VOCAB_FILES[manifest["tokenizer"]["kind"]]))
    manifest_lib.write_manifest(cfg.output_dir, manifest)
    return manifest


def make_manifest(cfg: BuildConfig, vocab: VocabInfo, source: corpus.Source,
                  totals: ChunkStats, counts: Sequence[int], empty_inputs: Sequence[str],
                  fingerprint: str) -> dict:
    """The manifest of a build whose shard i holds counts[i] examples."""
    names = [shard_name(i, cfg.num_shards) for i in range(cfg.num_shards)]
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
        "features": {k: f"int64[{cfg.max_seq_length}]" for k in FEATURES},
        "inputs": list(source.names),
        "token_counts_file": TOKEN_COUNTS_NAME,
        "shards": [{"name": n, "examples": c} for n, c in zip(names, counts)],
        "build_fingerprint": fingerprint,
    }
