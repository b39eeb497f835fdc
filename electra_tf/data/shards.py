"""Bad shards: reads one shard to its first error, tells what is wrong with a file, keeps
the ShardLog of shards skipped or stopped on, and turns a read error into one line.

on_bad_shard="skip" (the default) warns naming a bad shard, counts it and reads on: runs on
preemptible machines restart, and "stop" would meet the same shard at every restart, while
the rest of one shard in hundreds is well under a percent of the data. A skipped shard is
read up to its first bad record, and the other shards' records then arrive in another order
than without the fault; each epoch reopens every shard (SkippedShard.times counts repeats),
so a resumed run reproduces the order only if the same shards are bad at the same points."""

import dataclasses
import re
import sys
import threading
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from absl import logging

from electra_tf import fileio
from electra_tf.data import records as records_lib
from electra_tf.data.files import (BadShardError, InputDataError, RECORD_OVERHEAD,
                                   bad_shard, empty_file, manifest_counts, map_files,
                                   shown, traced)

# Large sequential reads amortize the per-request latency of GCS; harmless locally.
_READ_BUFFER_BYTES = 8 << 20
# Records per block that a shard's end-of-read check counts at a time (see read_shard).
_CHECK_BLOCK = 256
# More bad shards than this fraction of a pipeline's is lost data (a deleted bucket, expired
# credentials), not a bad shard: training on what is left would quietly change the run.
MAX_BAD_SHARD_FRACTION = 0.5
_TRANSIENT = "a read failed, but the file reads correctly now (a transient error?)"


def _tf_error_line(message: str) -> str:
    """The informative line of a TF error message (no traceback or node lines)."""
    for line in message.splitlines():
        line = line.strip()
        if (line and not line.startswith(("File ", "[[", "Detected at node", "Graph execution"))
                and not line.startswith("{{function_node")):
            return line.split(" [Op:")[0][:300]
    return message.strip().splitlines()[0][:300] if message.strip() else "unknown error"


def shard_problem(path: str, expected_records: Optional[int] = None) -> Optional[str]:
    """What is wrong with the TFRecord file `path`, in a few words, or None if it reads through
    (every record's framing and CRCs) and holds `expected_records` when given. A host-side check
    for the error path only: it reads the whole file, about a second per few hundred MB."""
    if not fileio.uses_tensorflow():
        return _shard_problem_native(path, expected_records)
    import tensorflow as tf
    try:
        size = tf.io.gfile.stat(path).length
    except tf.errors.NotFoundError:
        return "missing (deleted or moved during the run?)"
    except tf.errors.OpError as e:
        return f"cannot be read ({_tf_error_line(e.message)})"
    if size == 0:
        return empty_file(expected_records)
    n = 0
    try:
        for _ in tf.compat.v1.io.tf_record_iterator(path):
            n += 1
    except tf.errors.NotFoundError:
        return "missing (deleted or moved during the run?)"
    except tf.errors.OpError as e:
        m = (isinstance(e, tf.errors.DataLossError)
             and re.search(r"(corrupted|truncated) record at (\d+)", e.message))
        return _bad_record(m and m.group(1), m and m.group(2), n, size,
                           _tf_error_line(e.message))
    return _count_problem(n, expected_records)


def _bad_record(kind: Optional[str], offset, n: int, size: int, line: str) -> str:
    """The words for a read that failed after `n` good records: a `kind` of record
    ('truncated', 'corrupted') at byte `offset` of a file of `size` bytes, else `line`."""
    if kind == "truncated":
        return (f"truncated: record {n + 1} (at byte {offset}) is cut off at the "
                f"end of the file ({size} bytes), after {n} good records")
    if kind == "corrupted":
        return (f"corrupted record {n + 1} at byte {offset} (bad CRC or garbage "
                f"bytes), after {n} good records")
    return f"unreadable after {n} good records ({line})"


def _count_problem(n: int, expected_records: Optional[int]) -> Optional[str]:
    if expected_records is not None and n != expected_records:
        return f"holds {n} records but manifest.json says {expected_records}"
    return None


def _shard_problem_native(path: str, expected_records: Optional[int]) -> Optional[str]:
    """`shard_problem` through our own reader (`data.records`), without TensorFlow."""
    try:
        size = fileio.size(path)
    except FileNotFoundError:
        return "missing (deleted or moved during the run?)"
    except OSError as e:
        return f"cannot be read ({fileio.error_reason(e)})"
    if size == 0:
        return empty_file(expected_records)
    n = 0
    try:
        with fileio.open_file(path, "rb") as f:
            for _ in records_lib.read_records(f, path):
                n += 1
    except FileNotFoundError:
        return "missing (deleted or moved during the run?)"
    except OSError as e:
        return f"unreadable after {n} good records ({fileio.error_reason(e)})"
    except records_lib.RecordError as e:
        m = re.search(r"at byte (\d+): (truncated|corrupted)", str(e))
        return _bad_record(m and m.group(2), m and m.group(1), n, size, str(e))
    return _count_problem(n, expected_records)


@dataclasses.dataclass
class SkippedShard:
    """A shard that on_bad_shard="skip" passed over: its path, what was wrong (found by
    `shard_problem` the first time), and in how many epochs it ended early."""
    path: str
    reason: str
    times: int = 1


@dataclasses.dataclass(frozen=True)
class ShardEnd:
    """A shard that ended before its expected record count (manifest) or size (stat; -1: none),
    as `read_shard` found it: it gave `records` and `bytes` (with framing). `too_many`: skipped,
    but its pipeline has lost more than MAX_BAD_SHARD_FRACTION of its shards."""
    path: str
    records: int
    expected_records: int
    bytes: int
    expected_bytes: int
    too_many: bool = False


class ShardLog:
    """What the input pipelines of one run (each `make_dataset`) report about bad shards, for
    `explain_read_error`: the shards skipped and the ShardEnd that stopped the input. Reports come
    through a Python callback: only from pipelines in this process, not a remote tf.data worker."""

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
        """Records that a shard ended early; True when that stops the input (stop, too many bad)."""
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
            reason = shard_problem(path, expected if expected >= 0 else None) or _TRANSIENT
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


def read_shard(path, expected_records, expected_bytes, on_bad_shard: str, log: ShardLog,
                pipeline: int):
    """The records of one shard, read to its first error; a shard that ends before its expected
    record count (manifest) or size (stat) is reported to `log`, which skips it or stops the
    input (an op error with _SHARD_END_MESSAGE). Counted per block of _CHECK_BLOCK records (per
    record: ~10x the read), judged on a trailer block: no Python on the normal path."""
    import tensorflow as tf  # the tf.data pipeline's reader (`shard_records`: without it)
    # ignore_errors ends a shard at its first bad record, but a file it cannot OPEN is
    # retried forever (a deleted shard would hang the run): the shard is looked up first
    # (one listing per epoch), so a missing one reads as no file at all.
    found = tf.io.matching_files(path)
    blocks = tf.data.TFRecordDataset(found, buffer_size=_READ_BUFFER_BYTES).ignore_errors()
    blocks = blocks.batch(_CHECK_BLOCK).map(traced(lambda r: (r, False))).concatenate(
        tf.data.Dataset.from_tensors((tf.zeros([0], tf.string), True)))

    def count(state, element):
        block, is_trailer = element
        n, nbytes = state
        k = tf.size(block, out_type=tf.int64)
        n += k
        nbytes += tf.reduce_sum(tf.cast(tf.strings.length(block), tf.int64)) + (
            RECORD_OVERHEAD * k)
        return (n, nbytes), (block, is_trailer, n, nbytes)

    zero = tf.constant(0, tf.int64)
    counted = blocks.scan((zero, zero), traced(count))

    def ended_early(p, n, e, nb, eb):
        return log.report(pipeline, ShardEnd(p.decode(), int(n), int(e), int(nb), int(eb)),
                          on_bad_shard)

    def on_short(n, nbytes):  # the trailer is dropped, or the input stops here
        stop = tf.numpy_function(ended_early, [path, n, expected_records, nbytes,
                                               expected_bytes], tf.bool, stateful=True)
        stop = tf.reshape(stop, [])
        with tf.control_dependencies([tf.debugging.Assert(~stop, [_SHARD_END_MESSAGE])]):
            return tf.constant(False)

    def keep(block, is_trailer, n, nbytes):
        short = is_trailer & ((n < expected_records) | (nbytes < expected_bytes))
        return tf.cond(short, lambda: on_short(n, nbytes), lambda: ~is_trailer)

    return counted.filter(traced(keep)).map(
        traced(lambda block, is_trailer, n, nbytes: block)).unbatch()


def shard_records(path: str, expected_records: int, expected_bytes: int, on_bad_shard: str,
                  log: ShardLog, pipeline: int) -> Iterator[bytes]:
    """`read_shard` in plain Python (`data.records`' reader, no TensorFlow): the records of
    one shard up to its first error; a shard that ends before its expected records or bytes
    (-1: none) is reported to `log`, and where that stops the input, the stop is raised
    here as `explain_stop`'s BadShardError."""
    n = nbytes = 0
    try:
        with fileio.open_file(path, "rb") as f:
            for record in records_lib.read_records(f, path):
                n += 1
                nbytes += len(record) + RECORD_OVERHEAD
                yield record
    except (OSError, records_lib.RecordError):
        pass  # the shard ends here, as tf.data's ignore_errors ends it
    if n < expected_records or nbytes < expected_bytes:
        end = ShardEnd(path, n, expected_records, nbytes, expected_bytes)
        if log.report(pipeline, end, on_bad_shard):
            raise explain_stop(log)


def explain_stop(log: ShardLog) -> BadShardError:
    """The one-line error of the shard end that stopped the input (`log.stopped`)."""
    end = log.stopped
    skipped = [s.path for s in log.skipped()]
    path, n, exp = end.path, end.records, end.expected_records
    if end.too_many:
        return BadShardError(
            f"{len(skipped)} bad shard(s) (more than {MAX_BAD_SHARD_FRACTION:.0%} of an "
            f"input pipeline's), the last {path}: lost data, not a bad shard; stopping "
            f"(bad: {shown(skipped)})", path)
    reason = shard_problem(path, exp if exp >= 0 else manifest_counts([path]).get(path))
    return BadShardError(f"{path}: {reason or _TRANSIENT}; read {n}" +
                         (f" of {exp}" if exp >= 0 else "") + " records (on_bad_shard=stop)",
                         path)


def explain_read_error(error: BaseException, files: Sequence[str],
                       log: Optional[ShardLog] = None) -> Optional[InputDataError]:
    """The one-line InputDataError for an error reading the input, else None. A shard that stopped
    the input is named from `log`; reader errors name no file, so the files are checked host-side,
    in order, until one is bad; OutOfRangeError (every shard skipped) lists the skipped ones."""
    if isinstance(error, InputDataError):  # raised by the plain-Python input, explained
        return error
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "errors") or not isinstance(error, tf.errors.OpError):
        return None  # the tf.data input's read errors are TensorFlow's
    message = getattr(error, "message", None) or str(error)
    skipped = [s.path for s in log.skipped()] if log is not None else []
    if log is not None and log.stopped is not None and _SHARD_END_MESSAGE in message:
        return explain_stop(log)
    expected = manifest_counts(files)
    line = _SHARD_END_MESSAGE if _SHARD_END_MESSAGE in message else _tf_error_line(message)
    if isinstance(error, tf.errors.OutOfRangeError):
        if skipped:
            return InputDataError(f"the input ran out of records: {len(skipped)} shard(s) "
                                  f"were skipped as unreadable ({shown(skipped)})")
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


def check_resume_shards(paths: Sequence[str], counts: Dict[str, int], counted: set,
                        on_bad_shard: str):
    """The shards open at a resumed position (`paths`, one group) are read through: the
    position came from their manifest counts, so a count that disagrees stops the run
    (InputDataError naming the shard: it would go on with other records than uninterrupted);
    a shard that fails to read is a bad shard. Files `counted` just now are not reread."""
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
        bad_shard(on_bad_shard, f"{path}: {problem}", path)
    logging.info("Resume position: the %d shard(s) open there hold their manifest counts "
                 "(read through in %.1f s)", len(listed), time.perf_counter() - start)


def count_records(paths: Sequence[str]) -> Dict[str, int]:
    """{path: records before its end or first bad record (0 if missing)}, read in parallel."""
    if not fileio.uses_tensorflow():
        return dict(zip(paths, map_files(_count_native, paths)))
    import tensorflow as tf

    def count(path):
        ds = tf.data.TFRecordDataset(tf.io.matching_files(path),
                                     buffer_size=_READ_BUFFER_BYTES).ignore_errors()
        return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    return dict(zip(paths, map_files(count, paths)))


def _count_native(path: str) -> int:
    """`count_records` of one file through `data.records` (lengths and checksums)."""
    n = 0
    try:
        with fileio.open_file(path, "rb") as f:
            for _ in records_lib.read_records(f, path):
                n += 1
    except (OSError, records_lib.RecordError):
        pass  # counted to the first bad record, as tf.data's ignore_errors counts
    return n
