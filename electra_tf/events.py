"""TensorBoard event files without TensorFlow: the bytes `tf.summary.create_file_writer`
and `tf.summary.scalar` write, from our own encoder (`wire.py`) and TFRecord framing
(`wire.frame_record`), through `fileio` (local paths, gs://).

A file is named as TensorFlow 2 names it, `events.out.tfevents.<unix seconds, 10
digits>.<host>.<pid>.<writer number in this process>.v2`, and holds TFRecords of `Event`
messages: first `file_version: "brain.Event:2"` with the writer's source metadata at whole
seconds, then one event per scalar: wall time (microseconds), step (left out at 0) and a
summary value {tag, tensor: a float32 scalar's bytes, metadata: the "scalars" plugin}.
tests/test_events.py holds the events to tf.summary's.

Writes are buffered and reach the file at `flush()` and `close()`. A local file, or one
opened through TensorFlow's filesystem layer (whose gs:// files upload whole at each flush),
stays open; an object store reached without TensorFlow shows an object only once it is
closed, so there each flush rewrites the object whole (a run's events are small).
"""

import itertools
import os
import socket
import time
from typing import List, Optional

import numpy as np

from electra_tf import fileio, wire

FILE_VERSION = "brain.Event:2"
SOURCE_WRITER = "tensorflow.core.util.events_writer"
SCALARS_PLUGIN = "scalars"
SUFFIX = ".v2"
_DT_FLOAT = 1  # tensorflow.DataType
_writer_numbers = itertools.count()  # TensorFlow numbers its writers per process too

# Event fields (tensorflow/core/util/event.proto) and those of what it holds.
_EVENT_WALL_TIME, _EVENT_STEP, _EVENT_FILE_VERSION, _EVENT_SUMMARY = 1, 2, 3, 5
_EVENT_SOURCE_METADATA = 10
_VALUE_TAG, _VALUE_TENSOR, _VALUE_METADATA = 1, 8, 9
_TENSOR_DTYPE, _TENSOR_SHAPE, _TENSOR_CONTENT = 1, 2, 4


def event_file_name(wall_time: float, number: int) -> str:
    return (f"events.out.tfevents.{int(wall_time):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{number}{SUFFIX}")


def _event(wall_time: float, step: int, *fields: bytes) -> bytes:
    """An Event: its wall time and step (proto3 leaves zeros out), then `fields`."""
    head = wire.encode_double_field(_EVENT_WALL_TIME, wall_time) if wall_time else b""
    if step:
        head += wire.encode_varint_field(_EVENT_STEP, step)
    return head + b"".join(fields)


def version_event(wall_time: float) -> bytes:
    """The event every file starts with (at whole seconds, as TensorFlow writes it)."""
    return _event(float(int(wall_time)), 0,
                  wire.encode_bytes_field(_EVENT_FILE_VERSION, FILE_VERSION),
                  wire.encode_bytes_field(_EVENT_SOURCE_METADATA,
                                          wire.encode_bytes_field(1, SOURCE_WRITER)))


# SummaryMetadata{plugin_data{plugin_name: "scalars"}} (the plugin's content is empty).
_SCALAR_METADATA = wire.encode_bytes_field(
    _VALUE_METADATA, wire.encode_bytes_field(1, wire.encode_bytes_field(1, SCALARS_PLUGIN)))


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """The event of `tf.summary.scalar(tag, value, step)`: a float32 scalar tensor."""
    tensor = (wire.encode_varint_field(_TENSOR_DTYPE, _DT_FLOAT) +
              wire.encode_bytes_field(_TENSOR_SHAPE, b"") +  # a scalar's (empty) shape
              wire.encode_bytes_field(_TENSOR_CONTENT,
                                      np.asarray(value, "<f4").reshape(()).tobytes()))
    summary_value = (wire.encode_bytes_field(_VALUE_TAG, tag) +
                     wire.encode_bytes_field(_VALUE_TENSOR, tensor) + _SCALAR_METADATA)
    summary = wire.encode_bytes_field(1, summary_value)
    return _event(wall_time, int(step), wire.encode_bytes_field(_EVENT_SUMMARY, summary))


def _now() -> float:
    return time.time_ns() // 1000 / 1e6  # microseconds, as TensorFlow's clock


class _Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class EventFileWriter(_Closing):
    """Scalars for TensorBoard in a new event file under `logdir` (created with it, and
    the directory too); `scalar` buffers, `flush` and `close` (or the `with` block's end)
    write."""

    def __init__(self, logdir: str):
        fileio.makedirs(logdir)
        now = _now()
        self.path = fileio.join(logdir, event_file_name(now, next(_writer_numbers)))
        self._pending: List[bytes] = [wire.frame_record(version_event(now))]
        # Without TensorFlow's layer an object store's file is rewritten whole (`_written`).
        self._written: Optional[List[bytes]] = (
            [] if fileio.is_remote(self.path) and not fileio.uses_tensorflow() else None)
        self._file = None
        self._closed = False
        self.flush()

    def scalar(self, tag: str, value: float, step: int):
        self._pending.append(wire.frame_record(scalar_event(tag, value, step, _now())))

    def flush(self):
        if self._closed or not self._pending:
            return
        data = b"".join(self._pending)
        if self._written is not None:
            with fileio.open_file(self.path, "wb") as f:
                f.write(b"".join(self._written) + data)
            self._written.append(data)
        else:
            if self._file is None:
                self._file = fileio.open_file(self.path, "wb")
            self._file.write(data)
            self._file.flush()
        self._pending = []

    def close(self):
        self.flush()
        if self._file is not None:
            self._file.close()
        self._file, self._written, self._closed = None, None, True


class NoopWriter(_Closing):
    """What a process that writes no events (a non-chief worker) holds."""
    path = None

    def scalar(self, tag: str, value: float, step: int):
        """Nothing: only the chief writes events."""

    def flush(self):
        """Nothing to flush."""

    def close(self):
        """Nothing to close."""


def writer(logdir: Optional[str]):
    """An `EventFileWriter` under `logdir`; a `NoopWriter` for None."""
    return NoopWriter() if logdir is None else EventFileWriter(logdir)
