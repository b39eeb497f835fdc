"""The input files: resolves globs and build directories to shards, checks them against
their manifest and the run config, and owns the bad-shard policy and the input errors."""

import concurrent.futures
import glob
import os
import struct
from typing import Callable, Dict, List, Optional, Sequence

from absl import logging

from electra_tf import fileio
from electra_tf.data import manifest as manifest_lib
from electra_tf.data import records as records_lib
from electra_tf.data.records import FEATURE_NAMES  # noqa: F401 (the schema, re-exported)

# Files a build directory holds beside its shards (its vocabulary: text.RUN_VOCAB_FILES).
_SIDE_FILES = frozenset({manifest_lib.MANIFEST_NAME, "token_counts.txt", "vocab.txt",
                         "spm.model"})
# Directories without a manifest (the official builder's output) are read through this
# glob rather than wholesale, so a stray README or vocab file is never parsed as records.
_UNMANIFESTED_DIR_GLOB = "*tfrecord*"
# Shards tried for a first record (a build with more shards than examples has empty ones).
_PEEK_FILES = 8
# TFRecord framing around each record's data: uint64 length, uint32 masked CRC of the
# length, then after the data a uint32 masked CRC of the data.
RECORD_OVERHEAD = 16
ON_BAD_SHARD = ("skip", "stop")


def traced(fn: Callable) -> Callable:
    """`fn` for tf.data (map, flat_map, interleave, scan, filter) traced as written, not
    converted by autograph first: the input functions use TF's own control flow, and
    converting them cost about half a second of every run's start."""
    import tensorflow as tf  # the tf.data pipelines' only
    return tf.autograph.experimental.do_not_convert(fn)


class InputDataError(ValueError):
    """The input files are missing or do not hold what the config expects (one line)."""


class BadShardError(InputDataError):
    """A shard is unreadable (missing, truncated, corrupted); the message names the file."""

    def __init__(self, message: str, path: Optional[str] = None):
        super().__init__(message)
        self.path = path


def check_policy(on_bad_shard: str, where: str = ""):
    if on_bad_shard not in ON_BAD_SHARD:
        raise ValueError(f"{where}on_bad_shard={on_bad_shard!r}: expected skip or stop")


def bad_shard(on_bad_shard: str, message: str, path: str):
    """Raises BadShardError (stop), or logs `message` as a warning (skip)."""
    if on_bad_shard == "quiet":  # a second look at what a first one already reported
        return
    if on_bad_shard == "stop":
        raise BadShardError(message + " (on_bad_shard=stop; on_bad_shard=skip would read "
                            "the other shards)", path)
    logging.warning("Skipping bad shard: %s", message)


def shown(paths: Sequence[str]) -> str:
    """Up to three names, then how many more."""
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def empty_file(listed: Optional[int], unlisted: str = "") -> str:
    """What is wrong with an empty shard, given the records its manifest lists (if any)."""
    return "empty file (0 bytes)" + (
        f" but manifest.json says it holds {listed} records" if listed else unlisted)


def map_files(fn: Callable, paths: Sequence[str]) -> list:
    """[fn(path) for path in paths], in parallel threads: each is a slow request on GCS."""
    if len(paths) <= 1:
        return [fn(p) for p in paths]
    with concurrent.futures.ThreadPoolExecutor(min(16, len(paths))) as pool:
        return list(pool.map(fn, paths))


def _split_patterns(file_pattern: str) -> List[str]:
    return [p.strip() for p in file_pattern.split(",") if p.strip()]


def _is_data_file(path: str) -> bool:
    name = os.path.basename(path.rstrip("/"))
    return not (name in _SIDE_FILES or name.startswith(".") or name.endswith(".tmp")
                or name.endswith("~"))


def _has_manifest(directory: str) -> bool:
    return fileio.exists(os.path.join(directory, manifest_lib.MANIFEST_NAME))


def _manifest_shards(directory: str, on_bad_shard: str = "stop") -> List[str]:
    manifest = manifest_lib.read_manifest(directory)
    names = [s["name"] for s in manifest.get("shards", [])]
    # One listing instead of a stat per shard: thousands of stats are slow on GCS.
    present = set(fileio.listdir(directory))
    missing = [n for n in names if n not in present]
    if missing and (on_bad_shard == "stop" or len(missing) == len(names)):
        raise InputDataError(f"{directory}: manifest.json lists {len(names)} shards but "
                             f"{len(missing)} are missing ({shown(missing)}); the build "
                             "directory is incomplete, rebuild or copy it again")
    for n in missing:
        bad_shard(on_bad_shard, f"{os.path.join(directory, n)}: missing (manifest.json "
                   "lists it)", os.path.join(directory, n))
    return [os.path.join(directory, n) for n in names if n in present]


def _resolve_one(pattern: str, on_bad_shard: str = "stop") -> List[str]:
    if fileio.isdir(pattern):
        if _has_manifest(pattern):
            return _manifest_shards(pattern, on_bad_shard)
        pattern = os.path.join(pattern, _UNMANIFESTED_DIR_GLOB)
    files = [f for f in fileio.glob(pattern) if _is_data_file(f)]
    if not files and not glob.has_magic(pattern):
        # A file named outright (as the trainer passes its shards) that is not there: a
        # glob would drop it silently.
        bad_shard(on_bad_shard, f"{pattern}: no such file", pattern)
    return files


def resolve_files(file_pattern: str, on_bad_shard: str = "stop") -> List[str]:
    """The sorted shards the comma-separated globs, files and directories (their manifest's
    shards, else their "*tfrecord*" files) of `file_pattern` name, never side, dot or temp
    files. A missing manifest shard or named file is a bad shard; no file left, an error."""
    check_policy(on_bad_shard)
    files = set()
    for pattern in _split_patterns(file_pattern):
        files.update(_resolve_one(pattern, on_bad_shard))
    if not files:
        raise InputDataError(f"no TFRecord files match {file_pattern!r}")
    return sorted(files)


def _manifest_dirs(file_pattern: str) -> List[str]:
    dirs = []
    for pattern in _split_patterns(file_pattern):
        for d in ([pattern] if fileio.isdir(pattern) else
                  sorted({os.path.dirname(f) for f in _resolve_one(pattern, "quiet")})):
            if d not in dirs and _has_manifest(d):
                dirs.append(d)
    return dirs


def check_data(file_pattern: str, vocab_size: Optional[int] = None,
               max_seq_length: Optional[int] = None,
               on_bad_shard: str = "stop") -> Optional[dict]:
    """Validates every manifest in or beside the pattern's files against the run config
    (ManifestError), and its shards' sizes: one too small for its records is a bad shard.
    Returns the first manifest, or None (a warning) for data without one."""
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
        manifests.append(manifest)
        shards = [(os.path.join(d, s["name"]), int(s.get("examples", 0)))
                  for s in manifest.get("shards", [])]
        for (shard, examples), size in zip(shards, stat_lengths([p for p, _ in shards])):
            if size is None:
                continue  # resolve_files has reported it
            if examples and size == 0:
                bad_shard(on_bad_shard, f"{shard}: {empty_file(examples)}", shard)
            elif size < examples * (RECORD_OVERHEAD + 1):
                bad_shard(on_bad_shard, f"{shard}: truncated, {size} bytes cannot hold the "
                          f"{examples} records manifest.json lists", shard)
    return manifests[0]


def stat_lengths(paths: Sequence[str]) -> List[Optional[int]]:
    """File sizes (None for a missing file), stat'ed in parallel."""
    def length(path):
        try:
            return fileio.size(path)
        except FileNotFoundError:
            return None
    return map_files(length, paths)


def peek_sequence_length(path: str) -> Optional[int]:
    """The sequence length of the first record of `path` (None if the file is empty);
    InputDataError if it is not an ELECTRA pre-training example. The record is read by hand,
    not through tf.data, so this works in any context and costs one small read."""
    try:
        f = fileio.open_file(path, "rb")
        header = f.read(12)  # uint64 length + uint32 masked CRC of the length
    except FileNotFoundError:
        raise BadShardError(f"{path}: no such file", path) from None
    with f:
        if not header:
            return None
        if len(header) < 12:
            raise BadShardError(f"{path}: truncated TFRecord header ({len(header)} bytes; "
                                "is it a TFRecord file?)", path)
        (length,) = struct.unpack("<Q", header[:8])
        size = fileio.size(path)
        if length + 16 > size:  # not read: a garbage length could be any size
            if length >= 1 << 31:
                raise BadShardError(f"{path}: corrupted first record header (a length of "
                                    f"{length} bytes; is it a TFRecord file?)", path)
            raise BadShardError(f"{path}: truncated first record (the file has {size} bytes, "
                                f"the record needs {length + 16}; is it a TFRecord file?)", path)
        data = f.read(length)
    try:
        features = records_lib.int64_list_lengths(data)
    except (ValueError, IndexError) as e:
        raise BadShardError(f"{path}: the first record is not a tf.train.Example ({e})",
                            path) from None
    lengths = {}
    for name in FEATURE_NAMES:
        if name not in features:
            raise InputDataError(f"{path}: the first record has no {name!r} feature (it has "
                                 f"{sorted(features)}); not ELECTRA pre-training data")
        lengths[name] = features[name]
    if len(set(lengths.values())) != 1:
        raise InputDataError(f"{path}: the first record's features differ in length {lengths}")
    return lengths["input_ids"]


def check_sequence_length(files: Sequence[str], max_seq_length: int,
                          on_bad_shard: str = "stop"):
    """InputDataError naming the file and both lengths when the first files' first records
    are not `max_seq_length` long (parse_example would fail mid-run); an empty file (unless
    its manifest lists 0 records) or an unreadable first record is a bad shard."""
    expected = None
    for path in list(files)[:_PEEK_FILES]:
        try:
            length = peek_sequence_length(path)
        except BadShardError as e:
            bad_shard(on_bad_shard, str(e), path)
            continue
        if length is None:
            if expected is None:
                expected = manifest_counts(files)
            listed = expected.get(path)
            if listed != 0:  # unknown (no manifest), or records were expected
                bad_shard(on_bad_shard, f"{path}: " + empty_file(
                    listed, "; not a shard with records, leave it out of the pattern"), path)
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


def manifest_counts(files: Sequence[str]) -> Dict[str, int]:
    """{file: record count} of the `files` a manifest beside them lists (one read a directory)."""
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
