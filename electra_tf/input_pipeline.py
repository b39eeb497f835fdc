"""Pre-training input: finds the TFRecord shards, checks them against the run config, and
builds the tf.data pipeline that yields static-shape int32 batches for each replica.
"""

import dataclasses
import os
import struct
from typing import Dict, List, Optional, Sequence

import tensorflow as tf
from absl import logging
from google.protobuf.message import DecodeError

from tfrecord_builder import manifest as manifest_lib

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


class InputDataError(ValueError):
    """The input files are missing or do not hold what the config expects (one line)."""


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


# ----------------------------------------------------------------------------- files


def _split_patterns(file_pattern: str) -> List[str]:
    return [p.strip() for p in file_pattern.split(",") if p.strip()]


def _is_data_file(path: str) -> bool:
    name = os.path.basename(path.rstrip("/"))
    return not (name in _SIDE_FILES or name.startswith(".") or name.endswith(".tmp")
                or name.endswith("~"))


def _has_manifest(directory: str) -> bool:
    return tf.io.gfile.exists(os.path.join(directory, manifest_lib.MANIFEST_NAME))


def _manifest_shards(directory: str) -> List[str]:
    manifest = manifest_lib.read_manifest(directory)
    names = [s["name"] for s in manifest.get("shards", [])]
    # One listing instead of a stat per shard: thousands of stats are slow on GCS.
    present = set(tf.io.gfile.listdir(directory))
    missing = [n for n in names if n not in present]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise InputDataError(f"{directory}: manifest.json lists {len(names)} shards but "
                             f"{len(missing)} are missing ({shown}); the build directory is "
                             "incomplete, rebuild or copy it again")
    return [os.path.join(directory, n) for n in names]


def _resolve_one(pattern: str) -> List[str]:
    if tf.io.gfile.isdir(pattern):
        if _has_manifest(pattern):
            return _manifest_shards(pattern)
        pattern = os.path.join(pattern, _UNMANIFESTED_DIR_GLOB)
    return [f for f in tf.io.gfile.glob(pattern) if _is_data_file(f)]


def resolve_files(file_pattern: str) -> List[str]:
    """Returns the sorted shard files that `file_pattern` names.

    `file_pattern` is comma-separated; each part is a glob, or a directory: one with a
    manifest.json gives the manifest's shards (an error names any that are missing), one
    without gives its files whose names contain "tfrecord". Side files (manifest.json,
    token_counts.txt), dot files and temp files are never returned.
    """
    files = set()
    for pattern in _split_patterns(file_pattern):
        files.update(_resolve_one(pattern))
    if not files:
        raise InputDataError(f"no TFRecord files match {file_pattern!r}")
    return sorted(files)


def _manifest_dirs(file_pattern: str) -> List[str]:
    dirs = []
    for pattern in _split_patterns(file_pattern):
        if tf.io.gfile.isdir(pattern):
            candidates = [pattern]
        else:
            candidates = sorted({os.path.dirname(f) for f in _resolve_one(pattern)})
        for d in candidates:
            if d not in dirs and _has_manifest(d):
                dirs.append(d)
    return dirs


def check_data(file_pattern: str, vocab_size: Optional[int] = None,
               max_seq_length: Optional[int] = None) -> Optional[dict]:
    """Validates every manifest found for `file_pattern` against the run config.

    A manifest is looked for in each directory given and beside each matched file.
    Returns the first manifest found, or None (with a warning) for data without one, such
    as the official ELECTRA builder's. Raises ManifestError on a mismatch.
    """
    resolve_files(file_pattern)  # a clear error when nothing matches, before anything else
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
    return manifests[0]


def _first_record(path: str) -> Optional[bytes]:
    """The first record of an (uncompressed) TFRecord file, or None if it is empty.

    Read by hand rather than through tf.data so it works in any context (eager or inside
    a dataset function) and costs one small read.
    """
    with tf.io.gfile.GFile(path, "rb") as f:
        header = f.read(12)  # uint64 length + uint32 masked CRC of the length
        if not header:
            return None
        if len(header) < 12:
            raise InputDataError(f"{path}: truncated TFRecord header")
        (length,) = struct.unpack("<Q", header[:8])
        data = f.read(length)
        if len(data) != length:
            raise InputDataError(f"{path}: truncated first record (is it a TFRecord file?)")
        return data


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
        raise InputDataError(f"{path}: the first record is not a tf.train.Example ({e})") from None
    lengths = {}
    for name in FEATURE_NAMES:
        if name not in features:
            raise InputDataError(f"{path}: the first record has no {name!r} feature (it has "
                                 f"{sorted(features)}); not ELECTRA pre-training data")
        lengths[name] = len(features[name].int64_list.value)
    if len(set(lengths.values())) != 1:
        raise InputDataError(f"{path}: the first record's features differ in length {lengths}")
    return lengths["input_ids"]


def check_sequence_length(files: Sequence[str], max_seq_length: int):
    """Raises InputDataError naming the file and both lengths when the records' length is
    not `max_seq_length`; parse_example would otherwise fail mid-run with a shape error."""
    for path in list(files)[:_PEEK_FILES]:
        length = peek_sequence_length(path)
        if length is None:
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


# ----------------------------------------------------------------------------- dataset


def make_dataset(config: InputConfig,
                 input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
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
    """
    files = resolve_files(config.file_pattern)
    if config.check_data:
        check_data(config.file_pattern, vocab_size=config.vocab_size,
                   max_seq_length=config.max_seq_length)

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
        check_sequence_length(files, config.max_seq_length)

    # Hosts hold disjoint files; distinct seeds keep their shuffles from being lockstep.
    seed = None if config.seed is None else config.seed + pipeline_id

    ds = tf.data.Dataset.from_tensor_slices(files)
    if len(files) > 1:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=_READ_BUFFER_BYTES),
        cycle_length=min(config.cycle_length, len(files)), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE)
    if config.shuffle_buffer > 1:
        ds = ds.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if config.repeat:
        # Repeating after the shuffles (each reshuffled per epoch) keeps epochs exact: a
        # buffer larger than a small dataset would otherwise hold several copies of an
        # example at once. The drain at each epoch end is negligible on real data sizes.
        ds = ds.repeat()
    # Parsing a whole batch in one parse_example call is much cheaper than per record.
    ds = ds.batch(batch_size, drop_remainder=True)
    if config.skip_batches:
        replicas_per_pipeline = 1
        if input_context is not None:
            replicas_per_pipeline = max(1, input_context.num_replicas_in_sync // num_pipelines)
        ds = ds.skip(config.skip_batches * replicas_per_pipeline)
    ds = ds.map(lambda s: parse_batch(s, config.max_seq_length),
                num_parallel_calls=tf.data.AUTOTUNE)

    options = tf.data.Options()
    # Parallel interleave/map keep their round-robin order only when deterministic; the
    # non-deterministic default lets a slow file not stall the others.
    options.deterministic = config.deterministic
    ds = ds.with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE)
