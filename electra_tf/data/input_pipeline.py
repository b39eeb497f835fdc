"""Pre-training input: finds the TFRecord shards, checks them against the run config, and
builds the tf.data pipeline that yields static-shape int32 batches for each replica.
"""

import concurrent.futures
import dataclasses
import os
import random
import re
import struct
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging
from google.protobuf.message import DecodeError

from electra_tf.data import manifest as manifest_lib

FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids")

# Files a build directory holds beside its shards.
_SIDE_FILES = frozenset({manifest_lib.MANIFEST_NAME, "token_counts.txt"})
# Directories without a manifest (the official builder's output) are read through this
# glob rather than wholesale, so a stray README or vocab file is never parsed as records.
_UNMANIFESTED_DIR_GLOB = "*tfrecord*"
# Large sequential reads amortize the per-request latency of GCS; harmless locally.
_READ_BUFFER_BYTES = 8 << 20
# How many shards to try when looking for a first record (shards can be empty when a
# build has more shards than examples).
_PEEK_FILES = 8


# Records per block that a shard's end-of-read check counts at a time (see _read_shard).
_CHECK_BLOCK = 256
# TFRecord framing around each record's data: uint64 length, uint32 masked CRC of the
# length, then after the data a uint32 masked CRC of the data.
_RECORD_OVERHEAD = 16
ON_BAD_SHARD = ("skip", "stop")
# With on_bad_shard="skip", an input pipeline stops anyway once more than this fraction of
# its shards has proved unreadable: that is no longer a bad shard but lost data (a deleted
# bucket, expired credentials), and training on what is left would quietly change the run.
MAX_BAD_SHARD_FRACTION = 0.5


class InputDataError(ValueError):
    """The input files are missing or do not hold what the config expects (one line)."""


class BadShardError(InputDataError):
    """A shard is unreadable (missing, truncated, corrupted); the message names the file."""

    def __init__(self, message: str, path: Optional[str] = None):
        super().__init__(message)
        self.path = path


def _check_policy(on_bad_shard: str):
    if on_bad_shard not in ON_BAD_SHARD:
        raise ValueError(f"on_bad_shard={on_bad_shard!r}: expected skip or stop")


def _bad_shard(on_bad_shard: str, message: str, path: str):
    """Raises BadShardError (stop), or logs `message` as a warning (skip)."""
    if on_bad_shard == "quiet":  # a second look at what a first one already reported
        return
    if on_bad_shard == "stop":
        raise BadShardError(message + " (on_bad_shard=stop; on_bad_shard=skip would read "
                            "the other shards)", path)
    logging.warning("Skipping bad shard: %s", message)


@dataclasses.dataclass(frozen=True)
class InputConfig:
    """What to read and how to batch it.

    batch_size is the GLOBAL batch (all replicas together); each input pipeline yields
    per-replica batches of `input_context.get_per_replica_batch_size(batch_size)`, or of
    batch_size itself when no input context is given (one replica).
    """
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
    # A shard that turns out unreadable (missing, truncated, a corrupted record): "skip"
    # logs one warning naming it, counts it (in make_dataset's ShardLog), and reads on with
    # the other shards; "stop" ends the read with an error naming it (explain_read_error).
    #
    # "skip" is the default because the runs this is for last days on preemptible
    # machines under a supervisor that restarts them: with "stop", one bad shard becomes
    # a restart loop that makes no progress (a resumed run replays the same data order
    # and meets the same shard again) until a person looks, while losing what is left of
    # one shard out of hundreds changes pre-training data by well under a percent. It is
    # never silent: one warning per bad shard naming the file and what is wrong, a count
    # for the train loop to log, and a stop anyway when more than MAX_BAD_SHARD_FRACTION
    # of a pipeline's shards are bad (or none is left), which is lost data, not a bad shard.
    #
    # What "skip" does to the data: a shard is read up to its first bad record and the
    # rest of it is dropped for that epoch (a missing shard contributes nothing); every
    # other shard's records all arrive, but from that point on their order differs from a
    # run without the fault (the interleave fills the freed slot sooner and the shuffle
    # buffer sees a different stream). Each epoch reopens every shard, so a shard that
    # reads again (a transient error) comes back, and one still bad is skipped again
    # (counted in SkippedShard.times, logged once). A resumed run (skip_batches)
    # reproduces the order only if the same shards are bad at the same points.
    # Up-front checks (resolve_files, check_data, check_sequence_length) follow the same
    # policy: "stop" raises naming the file, "skip" warns and leaves the file out.
    on_bad_shard: str = "skip"

    def __post_init__(self):
        if not self.file_pattern or not self.file_pattern.strip(" ,"):
            raise ValueError("InputConfig.file_pattern is empty")
        if self.skip_batches < 0:
            raise ValueError(f"InputConfig.skip_batches={self.skip_batches}: must be >= 0")
        for name in ("max_seq_length", "batch_size", "cycle_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"InputConfig.{name}={getattr(self, name)}: must be at least 1")
        if self.shuffle_buffer < 0:
            raise ValueError(f"InputConfig.shuffle_buffer={self.shuffle_buffer}: must be >= 0")
        if self.deterministic and self.seed is None:
            # Unseeded shuffles differ per run, so "deterministic" would silently not be.
            raise ValueError("InputConfig.deterministic=True needs a seed")
        if self.on_bad_shard not in ON_BAD_SHARD:
            raise ValueError(f"InputConfig.on_bad_shard={self.on_bad_shard!r}: expected skip "
                             "or stop")


# ----------------------------------------------------------------------------- files


def _split_patterns(file_pattern: str) -> List[str]:
    return [p.strip() for p in file_pattern.split(",") if p.strip()]


def _is_data_file(path: str) -> bool:
    name = os.path.basename(path.rstrip("/"))
    return not (name in _SIDE_FILES or name.startswith(".") or name.endswith(".tmp")
                or name.endswith("~"))


def _has_manifest(directory: str) -> bool:
    return tf.io.gfile.exists(os.path.join(directory, manifest_lib.MANIFEST_NAME))


def _manifest_shards(directory: str, on_bad_shard: str = "stop") -> List[str]:
    manifest = manifest_lib.read_manifest(directory)
    names = [s["name"] for s in manifest.get("shards", [])]
    # One listing instead of a stat per shard: thousands of stats are slow on GCS.
    present = set(tf.io.gfile.listdir(directory))
    missing = [n for n in names if n not in present]
    if missing and (on_bad_shard == "stop" or len(missing) == len(names)):
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise InputDataError(f"{directory}: manifest.json lists {len(names)} shards but "
                             f"{len(missing)} are missing ({shown}); the build directory is "
                             "incomplete, rebuild or copy it again")
    for n in missing:
        _bad_shard(on_bad_shard, f"{os.path.join(directory, n)}: missing (manifest.json "
                   "lists it)", os.path.join(directory, n))
    return [os.path.join(directory, n) for n in names if n in present]


_GLOB_CHARS = frozenset("*?[")


def _resolve_one(pattern: str, on_bad_shard: str = "stop") -> List[str]:
    if tf.io.gfile.isdir(pattern):
        if _has_manifest(pattern):
            return _manifest_shards(pattern, on_bad_shard)
        pattern = os.path.join(pattern, _UNMANIFESTED_DIR_GLOB)
    files = [f for f in tf.io.gfile.glob(pattern) if _is_data_file(f)]
    if not files and not _GLOB_CHARS & set(pattern):
        # A file named outright (as the trainer passes its shards) that is not there: a
        # glob would drop it silently.
        _bad_shard(on_bad_shard, f"{pattern}: no such file", pattern)
    return files


def resolve_files(file_pattern: str, on_bad_shard: str = "stop") -> List[str]:
    """Returns the sorted shard files that `file_pattern` names.

    `file_pattern` is comma-separated; each part is a glob, a file, or a directory: one
    with a manifest.json gives the manifest's shards, one without gives its files whose
    names contain "tfrecord". Side files (manifest.json, token_counts.txt), dot files and
    temp files are never returned. A missing manifest shard or named file is an error
    naming it, or with on_bad_shard="skip" a warning (left out), unless nothing is left.
    """
    _check_policy(on_bad_shard)
    files = set()
    for pattern in _split_patterns(file_pattern):
        files.update(_resolve_one(pattern, on_bad_shard))
    if not files:
        raise InputDataError(f"no TFRecord files match {file_pattern!r}")
    return sorted(files)


def _manifest_dirs(file_pattern: str) -> List[str]:
    dirs = []
    for pattern in _split_patterns(file_pattern):
        if tf.io.gfile.isdir(pattern):
            candidates = [pattern]
        else:
            candidates = sorted({os.path.dirname(f) for f in _resolve_one(pattern, "quiet")})
        for d in candidates:
            if d not in dirs and _has_manifest(d):
                dirs.append(d)
    return dirs


def check_data(file_pattern: str, vocab_size: Optional[int] = None,
               max_seq_length: Optional[int] = None,
               on_bad_shard: str = "stop") -> Optional[dict]:
    """Validates every manifest found for `file_pattern` against the run config.

    A manifest is looked for in each directory given and beside each matched file.
    Returns the first manifest found, or None (with a warning) for data without one, such
    as the official ELECTRA builder's. Raises ManifestError on a mismatch. The shards a
    manifest lists are checked against their sizes (one stat each, in parallel): one too
    small for its records (empty, or truncated) is a BadShardError naming it, or with
    on_bad_shard="skip" a warning.
    """
    resolve_files(file_pattern, on_bad_shard)  # a clear error when nothing matches, first
    dirs = _manifest_dirs(file_pattern)
    if not dirs:
        logging.warning("No manifest.json beside %s (data from another builder?): vocab_size "
                        "cannot be checked; the sequence length is checked on the first record.",
                        file_pattern)
        return None
    manifests = []
    for d in dirs:
        path = os.path.join(d, manifest_lib.MANIFEST_NAME)
        manifest = manifest_lib.read_manifest(path)
        manifest_lib.validate_manifest(manifest, vocab_size=vocab_size,
                                       max_seq_length=max_seq_length, where=path)
        _check_shard_sizes(d, manifest, on_bad_shard)
        manifests.append(manifest)
    return manifests[0]


def _stat_lengths(paths: Sequence[str]) -> List[Optional[int]]:
    """File sizes (None for a missing file), stat'ed in parallel: GCS stats are slow."""
    def length(path):
        try:
            return tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError:
            return None
    if len(paths) <= 1:
        return [length(p) for p in paths]
    with concurrent.futures.ThreadPoolExecutor(min(16, len(paths))) as pool:
        return list(pool.map(length, paths))


def _check_shard_sizes(directory: str, manifest: dict, on_bad_shard: str):
    shards = [(os.path.join(directory, s["name"]), int(s.get("examples", 0)))
              for s in manifest.get("shards", [])]
    for (path, examples), size in zip(shards, _stat_lengths([p for p, _ in shards])):
        if size is None:
            continue  # resolve_files has reported it
        if examples and size == 0:
            _bad_shard(on_bad_shard, f"{path}: empty file (0 bytes) but manifest.json says "
                       f"it holds {examples} records", path)
        elif size < examples * (_RECORD_OVERHEAD + 1):
            _bad_shard(on_bad_shard, f"{path}: truncated, {size} bytes cannot hold the "
                       f"{examples} records manifest.json lists", path)


def _first_record(path: str) -> Optional[bytes]:
    """The first record of an (uncompressed) TFRecord file, or None if it is empty.

    Read by hand rather than through tf.data so it works in any context (eager or inside
    a dataset function) and costs one small read.
    """
    try:
        f = tf.io.gfile.GFile(path, "rb")
        header = f.read(12)  # uint64 length + uint32 masked CRC of the length
    except tf.errors.NotFoundError:
        raise BadShardError(f"{path}: no such file", path) from None
    with f:
        if not header:
            return None
        if len(header) < 12:
            raise BadShardError(f"{path}: truncated TFRecord header ({len(header)} bytes; "
                                "is it a TFRecord file?)", path)
        (length,) = struct.unpack("<Q", header[:8])
        size = tf.io.gfile.stat(path).length
        if length + 16 > size:  # not read: a garbage length could be any size
            if length >= 1 << 31:
                raise BadShardError(f"{path}: corrupted first record header (a length of "
                                    f"{length} bytes; is it a TFRecord file?)", path)
            raise BadShardError(f"{path}: truncated first record (the file has {size} bytes, "
                                f"the record needs {length + 16}; is it a TFRecord file?)", path)
        return f.read(length)


def peek_sequence_length(path: str) -> Optional[int]:
    """The sequence length of the first record of `path` (None if the file is empty).

    Raises InputDataError if the record is not an ELECTRA pre-training example.
    """
    data = _first_record(path)
    if data is None:
        return None
    try:
        features = tf.train.Example.FromString(data).features.feature
    except DecodeError as e:
        raise BadShardError(f"{path}: the first record is not a tf.train.Example ({e})",
                            path) from None
    lengths = {}
    for name in FEATURE_NAMES:
        if name not in features:
            raise InputDataError(f"{path}: the first record has no {name!r} feature (it has "
                                 f"{sorted(features)}); not ELECTRA pre-training data")
        lengths[name] = len(features[name].int64_list.value)
    if len(set(lengths.values())) != 1:
        raise InputDataError(f"{path}: the first record's features differ in length {lengths}")
    return lengths["input_ids"]


def check_sequence_length(files: Sequence[str], max_seq_length: int,
                          on_bad_shard: str = "stop"):
    """Raises InputDataError naming the file and both lengths when the records' length is
    not `max_seq_length`; parse_example would otherwise fail mid-run with a shape error.

    Looks at the first record of the first files. A file that is empty (and not listed
    with 0 records by a manifest beside it) or whose first record is unreadable is a
    BadShardError naming it, or with on_bad_shard="skip" a warning.
    """
    expected = None
    for path in list(files)[:_PEEK_FILES]:
        try:
            length = peek_sequence_length(path)
        except BadShardError as e:
            _bad_shard(on_bad_shard, str(e), path)
            continue
        if length is None:
            if expected is None:
                expected = _expected_records(files)
            if expected.get(path) != 0:  # unknown (no manifest), or records were expected
                listed = expected.get(path)
                _bad_shard(on_bad_shard, f"{path}: empty file (0 bytes)" + (
                    f" but manifest.json says it holds {listed} records" if listed else
                    "; not a shard with records, leave it out of the pattern"), path)
            continue
        if length != max_seq_length:
            raise InputDataError(
                f"{path}: records hold sequences of length {length} but max_seq_length="
                f"{max_seq_length}; rebuild the data with --max_seq_length={max_seq_length} "
                "or change the flag")
        return


def shard_files(files: Sequence[str], num_input_pipelines: int,
                input_pipeline_id: int) -> List[str]:
    """The files one input pipeline reads: every num_input_pipelines-th file, as
    Dataset.shard does, so pipelines read disjoint sets that together cover all files."""
    if len(files) < num_input_pipelines:
        raise InputDataError(
            f"{len(files)} input files cannot be split over {num_input_pipelines} input "
            f"pipelines (hosts); rebuild the data with --num_shards >= {num_input_pipelines}")
    return list(files)[input_pipeline_id::num_input_pipelines]


# ----------------------------------------------------------------------------- bad shards


def _expected_records(files: Sequence[str]) -> Dict[str, int]:
    """{file: record count} for the files a manifest beside them lists (one manifest read
    per directory); files without a manifest are absent."""
    counts = {}
    for d in sorted({os.path.dirname(f) for f in files}):
        if not _has_manifest(d):
            continue
        try:
            manifest = manifest_lib.read_manifest(d)
        except manifest_lib.ManifestError as e:
            logging.warning("%s", e)
            continue
        for shard in manifest.get("shards", []):
            counts[os.path.join(d, shard["name"])] = int(shard.get("examples", 0))
    return {f: counts[f] for f in files if f in counts}


def _tf_error_line(message: str) -> str:
    """The informative line of a TF error message (no traceback or node lines)."""
    for line in message.splitlines():
        line = line.strip()
        if (line and not line.startswith(("File ", "[[", "Detected at node", "Graph execution"))
                and not line.startswith("{{function_node")):
            return line.split(" [Op:")[0][:300]
    return message.strip().splitlines()[0][:300] if message.strip() else "unknown error"


def shard_problem(path: str, expected_records: Optional[int] = None) -> Optional[str]:
    """What is wrong with the TFRecord file `path`, in a few words, or None if it reads
    through (every record's framing and CRCs) and holds `expected_records` when given.

    A host-side check for the error path only: it reads the whole file (TensorFlow's
    record reader checks the CRCs), about a second per few hundred MB.
    """
    try:
        size = tf.io.gfile.stat(path).length
    except tf.errors.NotFoundError:
        return "missing (deleted or moved during the run?)"
    except tf.errors.OpError as e:
        return f"cannot be read ({_tf_error_line(e.message)})"
    if size == 0:
        return "empty file (0 bytes)" + (
            f" but manifest.json says it holds {expected_records} records"
            if expected_records else "")
    n = 0
    try:
        for _ in tf.compat.v1.io.tf_record_iterator(path):
            n += 1
    except tf.errors.DataLossError as e:
        m = re.search(r"(corrupted|truncated) record at (\d+)", e.message)
        if m and m.group(1) == "truncated":
            return (f"truncated: record {n + 1} (at byte {m.group(2)}) is cut off at the "
                    f"end of the file ({size} bytes), after {n} good records")
        if m:
            return (f"corrupted record {n + 1} at byte {m.group(2)} (bad CRC or garbage "
                    f"bytes), after {n} good records")
        return f"unreadable after {n} good records ({_tf_error_line(e.message)})"
    except tf.errors.NotFoundError:
        return "missing (deleted or moved during the run?)"
    except tf.errors.OpError as e:
        return f"unreadable after {n} good records ({_tf_error_line(e.message)})"
    if expected_records is not None and n != expected_records:
        return f"holds {n} records but manifest.json says {expected_records}"
    return None


@dataclasses.dataclass
class SkippedShard:
    """A shard that on_bad_shard="skip" passed over: its path, what was wrong (found by
    `shard_problem` the first time), and in how many epochs it ended early."""
    path: str
    reason: str
    times: int = 1


@dataclasses.dataclass(frozen=True)
class ShardEnd:
    """A shard that ended before its expected record count (manifest; -1: none) or size
    (stat, for files no manifest lists; -1: none), as `_read_shard` found it: `records`
    and `bytes` (records' data plus framing) were read. `too_many`: it was skipped, but
    its pipeline has now lost more than MAX_BAD_SHARD_FRACTION of its shards."""
    path: str
    records: int
    expected_records: int
    bytes: int
    expected_bytes: int
    too_many: bool = False


class ShardLog:
    """What the input pipelines of one run report about bad shards: the shards skipped
    (on_bad_shard="skip") and the ShardEnd that stopped the input, if one did.

    Give the same log to every `make_dataset` of a run (its input pipelines) and to
    `explain_read_error`. The reports come from tf.data's threads through a Python
    callback, so they reach the log only when the input pipeline runs in this Python
    process (TPU VMs, GPU and CPU hosts), not on a remote tf.data worker.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._shards: Dict[str, SkippedShard] = {}
        self._pipelines: List[Tuple[int, set]] = []  # (number of files, bad files)
        self._stopped: Optional[ShardEnd] = None

    def new_pipeline(self, num_files: int) -> int:
        with self._lock:
            self._pipelines.append((num_files, set()))
            return len(self._pipelines) - 1

    def report(self, pipeline: int, end: ShardEnd, on_bad_shard: str) -> bool:
        """Records that a shard ended early; True when that stops the input (stop, or
        too many of its pipeline's shards are bad)."""
        if on_bad_shard == "stop":
            return self._stop(end)
        path, expected = end.path, end.expected_records
        with self._lock:
            known = self._shards.get(path)
            if known:
                known.times += 1
        if known:
            logging.info("Bad shard %s skipped again (%d times): %s", path, known.times,
                         known.reason)
        else:
            reason = shard_problem(path, expected if expected >= 0 else None) or (
                "a read failed, but the file reads correctly now (a transient error?)")
            with self._lock:
                self._shards.setdefault(path, SkippedShard(path, reason, 0)).times += 1
                count = len(self._shards)
            logging.warning("Skipping bad shard %s: %s; read %d%s of its records this epoch "
                            "(on_bad_shard=skip; %d bad shard(s) skipped so far)", path, reason,
                            end.records, f" of {expected}" if expected >= 0 else "", count)
        with self._lock:
            num_files, bad = self._pipelines[pipeline]
            bad.add(path)
            too_many = len(bad) > MAX_BAD_SHARD_FRACTION * num_files
        return too_many and self._stop(dataclasses.replace(end, too_many=True))

    def _stop(self, end: ShardEnd) -> bool:
        with self._lock:
            if self._stopped is None:  # the first is the one the read fails on
                self._stopped = end
        return True

    def skipped(self) -> List[SkippedShard]:
        """The shards skipped so far, in the order they were first found bad; each was
        logged once as a warning naming it. A longer list than last time: new bad shards."""
        with self._lock:
            return [dataclasses.replace(s) for s in self._shards.values()]

    @property
    def stopped(self) -> Optional[ShardEnd]:
        """The shard end that stopped the input (None while it reads on)."""
        with self._lock:
            return self._stopped


# The message of the op that stops the input on a bad shard; the facts are in the log.
_SHARD_END_MESSAGE = ("an input shard ended before its expected records; the ShardLog "
                      "given to make_dataset says which")


def _read_shard(path, expected_records, expected_bytes, on_bad_shard: str, log: ShardLog,
                pipeline: int):
    """The records of one shard, read to its first error; a shard that ends before its
    expected record count (manifest) or size (stat) is reported to `log`, which skips it
    or stops the input (an op error with _SHARD_END_MESSAGE).

    Nothing runs in Python on the normal path, and the checks run on blocks of
    _CHECK_BLOCK records (per-record dataset functions would cost ~10x the read); the
    verdict comes once, on a trailer block after the shard's last records.
    """
    # ignore_errors ends a shard at its first bad record (the reader moves on to its next
    # file), but a file it cannot OPEN it retries forever: TFRecordDataset does not move
    # past it, so a deleted shard would hang the run. Hence the shard is looked up first
    # (one listing per shard per epoch) and a missing one reads as no file at all; only a
    # shard deleted in the moment between the look-up and the open is still retried.
    found = tf.io.matching_files(path)
    blocks = tf.data.TFRecordDataset(found, buffer_size=_READ_BUFFER_BYTES).ignore_errors()
    blocks = blocks.batch(_CHECK_BLOCK).map(lambda r: (r, False)).concatenate(
        tf.data.Dataset.from_tensors((tf.zeros([0], tf.string), True)))

    def count(state, element):
        block, is_trailer = element
        n, nbytes = state
        k = tf.size(block, out_type=tf.int64)
        n += k
        nbytes += tf.reduce_sum(tf.cast(tf.strings.length(block), tf.int64)) + (
            _RECORD_OVERHEAD * k)
        return (n, nbytes), (block, is_trailer, n, nbytes)

    zero = tf.constant(0, tf.int64)
    counted = blocks.scan((zero, zero), count)

    def ended_early(p, n, e, nb, eb):
        return log.report(pipeline, ShardEnd(p.decode(), int(n), int(e), int(nb), int(eb)),
                          on_bad_shard)

    def on_short(n, nbytes):
        stop = tf.numpy_function(ended_early, [path, n, expected_records, nbytes,
                                               expected_bytes], tf.bool, stateful=True)
        stop = tf.reshape(stop, [])

        def fail():
            with tf.control_dependencies([tf.debugging.Assert(False, [_SHARD_END_MESSAGE])]):
                return tf.constant(False)
        return tf.cond(stop, fail, lambda: tf.constant(False))

    def at_trailer(n, nbytes):
        short = tf.logical_or(n < expected_records, nbytes < expected_bytes)
        return tf.cond(short, lambda: on_short(n, nbytes), lambda: tf.constant(False))

    def keep(block, is_trailer, n, nbytes):
        return tf.cond(is_trailer, lambda: at_trailer(n, nbytes), lambda: tf.constant(True))

    return counted.filter(keep).map(lambda block, is_trailer, n, nbytes: block).unbatch()


def _shown(paths: Sequence[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def explain_read_error(error: BaseException, files: Sequence[str],
                       log: Optional[ShardLog] = None) -> Optional[InputDataError]:
    """The one-line InputDataError for an error that reading the input raised (inside
    `next(iterator)`, often in a tf.function), or None when it did not come from the input.
    `log` is the ShardLog the input's make_dataset reported into.

        try:
            loop(iterator, n)
        except tf.errors.OpError as e:
            bad = input_pipeline.explain_read_error(e, files, log)
            if bad is None:
                raise
            raise bad from None

    A shard that ended early and stopped the input is named from the log's ShardEnd
    (BadShardError, with what a host-side check finds wrong with it). Errors from the
    TFRecord reader itself name no file ("corrupted record at 462"): the files are then
    checked host-side, in order, until one is bad (reads them all in the worst case; only
    on this error path). OutOfRangeError (the input ran out: every shard skipped) is an
    InputDataError listing the skipped shards.
    """
    message = getattr(error, "message", None) or str(error)
    skipped = [s.path for s in log.skipped()] if log is not None else []
    end = log.stopped if log is not None else None
    expected = _expected_records(files)
    if end is not None and _SHARD_END_MESSAGE in message:
        path, n, exp = end.path, end.records, end.expected_records
        if end.too_many:
            return BadShardError(
                f"{len(skipped)} bad shard(s) (more than {MAX_BAD_SHARD_FRACTION:.0%} of an "
                f"input pipeline's), the last {path}: lost data, not a bad shard; stopping "
                f"(bad: {_shown(skipped)})", path)
        reason = shard_problem(path, exp if exp >= 0 else expected.get(path)) or (
            "a read failed, but the file reads correctly now (a transient error?)")
        return BadShardError(f"{path}: {reason}; read {n}" + (f" of {exp}" if exp >= 0 else "")
                             + " records (on_bad_shard=stop)", path)
    line = _SHARD_END_MESSAGE if _SHARD_END_MESSAGE in message else _tf_error_line(message)
    if isinstance(error, tf.errors.OutOfRangeError):
        if skipped:
            return InputDataError(f"the input ran out of records: {len(skipped)} shard(s) "
                                  f"were skipped as unreadable ({_shown(skipped)})")
        return InputDataError(f"the input ran out of records ({line})")
    for path in sorted(files, key=len, reverse=True):
        if path in message:
            reason = shard_problem(path, expected.get(path)) or line
            return BadShardError(f"{path}: {reason}", path)
    # A shard end without its record (the input reported into another log, or ran in
    # another process) is found host-side, as reader errors are.
    if not (isinstance(error, (tf.errors.DataLossError, tf.errors.NotFoundError))
            or _SHARD_END_MESSAGE in message):
        return None
    for path in files:
        reason = shard_problem(path, expected.get(path))
        if reason:
            return BadShardError(f"{path}: {reason} ({line})", path)
    return InputDataError(f"reading the input failed ({line}) but every one of the "
                          f"{len(files)} input files reads correctly now")


# ----------------------------------------------------------------------------- features


def feature_spec(max_seq_length: int) -> Dict[str, tf.io.FixedLenFeature]:
    return {name: tf.io.FixedLenFeature([max_seq_length], tf.int64) for name in FEATURE_NAMES}


def element_spec(batch_size: int, max_seq_length: int) -> Dict[str, tf.TensorSpec]:
    """The model's input dict as TensorSpecs, e.g. for tf.function input signatures."""
    return {name: tf.TensorSpec([batch_size, max_seq_length], tf.int32)
            for name in FEATURE_NAMES}


def parse_batch(serialized: tf.Tensor, max_seq_length: int) -> Dict[str, tf.Tensor]:
    """A batch of serialized examples -> the model's input dict of int32 tensors."""
    parsed = tf.io.parse_example(serialized, feature_spec(max_seq_length))
    # int64 is slow or unsupported on TPU and ids fit easily in int32.
    return {name: tf.cast(parsed[name], tf.int32) for name in FEATURE_NAMES}


# ----------------------------------------------------------------------------- order

# The count a shard without a manifest is given (it is read to its end).
_UNKNOWN_COUNT = 1 << 62


@dataclasses.dataclass(frozen=True)
class StreamPosition:
    """Where record `records` of a pipeline's stream is, found from the shards' record
    counts alone (`StreamOrder.locate`): the epoch; the group of shards being read, with
    the round of its round robin (records each of its shards had given) and how many of
    that round's records were taken; the shuffle window and how many of its records were
    consumed."""
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
    time: the shards of a group give one record each in turn (round robin; a shard that
    has run out leaves the turn) until all are done, then the next group opens. The
    epoch's stream is then shuffled in consecutive windows of `window` records, each by a
    permutation drawn from (key, e, window index); window 1 is no shuffle. The next epoch
    follows with fresh draws. Resuming at record p therefore costs the shard counts'
    arithmetic, reading the current group's shards up to their place (never the shards
    before them) and one window; not the p records before.

    With the manifest's counts exact, a shard that ends early (skipped as bad) leaves the
    other shards' order unchanged; the stream after it is shorter, so a resumed run
    reproduces the order only if the same shards are bad at the same points.
    """
    num_shards: int
    cycle_length: int
    window: int
    key: Tuple[int, int]

    def _epoch_seed(self, epoch) -> tf.Tensor:
        return tf.random.experimental.stateless_fold_in(
            tf.constant(self.key, tf.int32), tf.cast(epoch, tf.int32), alg="philox")

    def _permutation(self, size, seed) -> tf.Tensor:
        return tf.argsort(tf.random.stateless_uniform(size, seed=seed, alg="philox"),
                          stable=True)

    def shard_order(self, epoch) -> tf.Tensor:
        """The epoch's permutation of the shards, int32 [num_shards] (graph or eager)."""
        seed = tf.random.experimental.stateless_fold_in(self._epoch_seed(epoch), 0,
                                                        alg="philox")
        return self._permutation([self.num_shards], seed)

    def group_shards(self, epoch: int, group: int) -> List[int]:
        """The shards (indices) of group `group` of epoch `epoch`."""
        with tf.init_scope():
            order = self.shard_order(epoch).numpy()
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
        with tf.init_scope():  # eager even when called while a graph is built
            ordered = counts[self.shard_order(epoch).numpy()]
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

    def dataset(self, counts: Sequence[int], read,
                position: Optional[StreamPosition] = None,
                repeat: bool = True) -> tf.data.Dataset:
        """The stream of serialized records from `position` (the start by default).

        counts: each shard's record count for the order (-1: unknown, read to its end);
        read(i): the dataset of shard i's records (given as an int64 tensor).
        """
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
            return ds.interleave(lambda i, k: read(i).skip(k), cycle_length=c,
                                 block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=True)

        def epoch_records(epoch, group, r, j, window):
            grid = tf.reshape(tf.concat([tf.cast(self.shard_order(epoch), tf.int64),
                                         tf.fill([pad], tf.constant(-1, tf.int64))], 0),
                              [num_groups, c])

            def group_args(g):
                shards = grid[g]
                active = shards >= 0
                shards = tf.maximum(shards, 0)
                first = tf.equal(g, group)
                n = tf.where(active, tf.gather(counts_t, shards), 0)
                return (shards, n, active, tf.where(first, r, tf.constant(0, tf.int64)),
                        tf.where(first, j, tf.constant(0, tf.int64)))

            ds = tf.data.Dataset.range(group, num_groups).map(group_args).flat_map(
                group_records)
            if self.window > 1:
                seed = self._epoch_seed(epoch)

                def shuffle(k, records):
                    s = tf.random.experimental.stateless_fold_in(
                        seed, tf.cast(k, tf.int32) + 1, alg="philox")
                    return tf.gather(records, self._permutation(tf.shape(records), s))

                ds = ds.batch(self.window).enumerate(start=window).map(shuffle)
                ds = ds.prefetch(2).unbatch()  # windows ahead hide a group's opening reads
            return ds

        p = position or StreamPosition(0, 0, 0, 0, 0, 0)
        as_int = lambda v: tf.constant(v, tf.int64)  # noqa: E731
        first = epoch_records(as_int(p.epoch), as_int(p.group), as_int(p.round),
                              as_int(p.slot), as_int(p.window)).skip(p.offset)
        if not repeat:
            return first if p.epoch == 0 else first.take(0)
        zero = as_int(0)
        rest = tf.data.Dataset.counter(p.epoch + 1).flat_map(
            lambda e: epoch_records(e, zero, zero, zero, zero))
        return first.concatenate(rest)


def check_resume_shards(paths: Sequence[str], counts: Dict[str, int], counted: set,
                        on_bad_shard: str):
    """A resumed stream's position comes from the manifest's record counts: the shards
    open at that position (`paths`, one group) are read through and must hold exactly
    their counts, or the run would continue on other records than it would have without
    the interruption. A count that disagrees stops the run (InputDataError naming the
    shard); a shard that fails to read is a bad shard (on_bad_shard). Files whose counts
    were `counted` just now need no second read."""
    listed = [p for p in paths if p not in counted and p in counts]
    if not listed:
        return
    start = time.perf_counter()
    found = count_records(listed)  # in parallel, to the end or the first bad record
    for path in listed:
        if found[path] == counts[path]:
            continue
        problem = f"holds {found[path]} records but manifest.json says {counts[path]}"
        if found[path] < counts[path]:  # a read error, or a shard the manifest over-counts
            problem = shard_problem(path, counts[path]) or problem
        if problem.startswith("holds "):  # read through: the manifest's count is wrong
            raise InputDataError(
                f"{path}: {problem}; the resume position is computed from manifest.json's "
                "counts, so this run would continue on other data than it would have "
                "uninterrupted: rebuild the data, or start a new --model_dir")
        _bad_shard(on_bad_shard, f"{path}: {problem}", path)
    logging.info("Resume position: the %d shard(s) open there hold their manifest counts "
                 "(read through in %.1f s)", len(listed), time.perf_counter() - start)


def count_records(paths: Sequence[str]) -> Dict[str, int]:
    """{path: records read before its end or first unreadable record}, read in parallel
    (for files no manifest lists; a missing file counts 0)."""
    def count(path):
        ds = tf.data.TFRecordDataset(tf.io.matching_files(path),
                                     buffer_size=_READ_BUFFER_BYTES).ignore_errors()
        return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    if len(paths) <= 1:
        return {p: count(p) for p in paths}
    with concurrent.futures.ThreadPoolExecutor(min(16, len(paths))) as pool:
        return dict(zip(paths, pool.map(count, paths)))


# ----------------------------------------------------------------------------- dataset


def make_dataset(config: InputConfig,
                 input_context: Optional[tf.distribute.InputContext] = None,
                 log: Optional[ShardLog] = None) -> tf.data.Dataset:
    """The batched dataset of one input pipeline (one host).

    With an input context (from distribute_datasets_from_function) the pipeline reads its
    share of the files and yields per-replica batches; without one it reads every file and
    yields config.batch_size. Batches are always full (drop_remainder) so shapes are static
    for XLA. With repeat=False one pass reads every example of its files exactly once,
    minus fewer than one batch left at the end.

        cfg = InputConfig(file_pattern="cache/tfrecords/enwiki_sample-seq128",
                          max_seq_length=128, batch_size=128, vocab_size=30522)
        dist_ds = strategy.distribute_datasets_from_function(lambda ctx: make_dataset(cfg, ctx))

    Each element is the model's input dict {"input_ids", "input_mask", "segment_ids"},
    int32 [per_replica_batch, max_seq_length] (see `element_spec`).

    A shard that turns out unreadable while it is read (see InputConfig.on_bad_shard) is
    reported into `log` (a fresh one of this dataset's own when none is given): skipped
    and listed in `log.skipped()`, or it fails the read with an error that
    `explain_read_error(error, files, log)` turns into a one-line BadShardError naming it.
    The report needs the pipeline to run in this Python process (see ShardLog).
    """
    files = resolve_files(config.file_pattern, config.on_bad_shard)
    if config.check_data:
        check_data(config.file_pattern, vocab_size=config.vocab_size,
                   max_seq_length=config.max_seq_length, on_bad_shard=config.on_bad_shard)

    num_pipelines, pipeline_id, batch_size = 1, 0, config.batch_size
    if input_context is not None:
        num_pipelines = input_context.num_input_pipelines
        pipeline_id = input_context.input_pipeline_id
        batch_size = input_context.get_per_replica_batch_size(config.batch_size)
    files = shard_files(files, num_pipelines, pipeline_id)
    logging.info("Input pipeline %d of %d: %d file(s), %s", pipeline_id, num_pipelines,
                 len(files), ", ".join(os.path.basename(f) for f in files[:8]) +
                 (", ..." if len(files) > 8 else ""))
    if config.check_data:
        check_sequence_length(files, config.max_seq_length, config.on_bad_shard)

    # Hosts hold disjoint files; their own keys keep their orders from being lockstep.
    seed = config.seed
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)  # a fresh order per pipeline
    key = (seed % (1 << 31), pipeline_id)

    # What each shard should yield, to tell a shard that ended early (a read error,
    # skipped or stopped on in _read_shard) from one read through: the manifest's record
    # count, or else the file's size now (one stat per file without a manifest).
    counts = _expected_records(files)
    unlisted = [f for f in files if f not in counts]
    sizes = dict(zip(unlisted, _stat_lengths(unlisted)))
    expected_records = [counts.get(f, -1) for f in files]
    expected_bytes = [-1 if f in counts else (sizes[f] if sizes[f] is not None else 1)
                      for f in files]
    log = log if log is not None else ShardLog()
    pipeline = log.new_pipeline(len(files))

    order = StreamOrder(num_shards=len(files), cycle_length=min(config.cycle_length, len(files)),
                        window=config.shuffle_buffer if config.shuffle_buffer > 1 else 1,
                        key=key)
    records = 0
    if config.skip_batches:
        replicas_per_pipeline = 1
        if input_context is not None:
            replicas_per_pipeline = max(1, input_context.num_replicas_in_sync // num_pipelines)
        records = config.skip_batches * replicas_per_pipeline * batch_size
    if records and unlisted:
        # The position needs every shard's record count: without a manifest they are
        # counted once, a read of the data (not of the `records` consumed before).
        start = time.perf_counter()
        found = count_records(unlisted)
        logging.warning("No manifest.json lists %d of the %d input files: counted their "
                        "records to find the resume position (%.1f s; a manifest would "
                        "spare this read).", len(unlisted), len(files),
                        time.perf_counter() - start)
        counts = dict(counts, **found)
    position = order.locate(records, [counts.get(f, -1) for f in files]) if records else None
    if position is not None:
        check_resume_shards([files[i] for i in order.group_shards(position.epoch,
                                                                  position.group)],
                            counts, set(unlisted), config.on_bad_shard)

    files_t = tf.constant(files)
    expected_records = tf.constant(expected_records, tf.int64)
    expected_bytes = tf.constant(expected_bytes, tf.int64)

    def read(i):
        return _read_shard(tf.gather(files_t, i), tf.gather(expected_records, i),
                           tf.gather(expected_bytes, i), config.on_bad_shard, log,
                           pipeline)

    ds = order.dataset([counts.get(f, -1) for f in files], read, position,
                       repeat=config.repeat)
    # Parsing a whole batch in one parse_example call is much cheaper than per record.
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda s: parse_batch(s, config.max_seq_length),
                num_parallel_calls=tf.data.AUTOTUNE)

    options = tf.data.Options()
    # The record order is fixed by the seed; a non-deterministic map may still hand the
    # parsed batches over out of order, which lets a slow batch not stall the others.
    options.deterministic = config.deterministic
    ds = ds.with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE)
