"""electra_tf.events (TensorBoard event files without TensorFlow) against tf.summary: the
same events for the same scalars (all but the wall time byte for byte), read back alike by
TensorFlow's summary_iterator and TensorBoard's EventAccumulator; the writer's buffering on
local and remote paths (without TensorFlow: test_events_notf.py)."""

import glob
import os
import re
import socket
import struct

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2, summary_pb2

from electra_tf import events, fileio, wire
from electra_tf.data import records
from electra_tf.training import loop

# (tag, value, step): zero step and value (left out of an Event), an int, float32
# rounding, inf and nan, a large step and a negative value.
SCALARS = [("loss", 1.25, 7), ("perf/mfu", 0.123456789, 7), ("zero", 0.0, 0), ("int", 3, 1),
           ("huge", 1e38, 2 ** 40), ("inf", float("inf"), 3), ("nan", float("nan"), 5),
           ("neg", -2.5, 9), ("loss", np.float64(0.1), 8)]
NAME = re.compile(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)\.v2")


def _records(directory, path=None):
    """[the records of the one event file in `directory`, or of `path`] (CRCs checked),
    its name."""
    (path,) = [path] if path else glob.glob(os.path.join(directory, "events.out.tfevents.*"))
    with open(path, "rb") as f:
        return list(records.read_records(f, path)), os.path.basename(path)


def _without_wall_time(record: bytes) -> bytes:
    """An event's bytes after its wall time (field 1, a double: 9 bytes, always first)."""
    assert record[0] == 0x09
    return record[9:]


def _tf_events(directory):
    writer = tf.summary.create_file_writer(directory)
    for tag, value, step in SCALARS:
        with writer.as_default(step=step):
            tf.summary.scalar(tag, value)
    writer.close()


def _our_events(directory):
    writer = events.EventFileWriter(directory)
    for tag, value, step in SCALARS:
        writer.scalar(tag, value, step)
    writer.close()


def test_encoders_are_protobufs_encoding():
    event = event_pb2.Event(wall_time=12.5, step=-3, file_version="brain.Event:2")
    assert event.SerializeToString() == (wire.encode_double_field(1, 12.5) +
                                         wire.encode_varint_field(2, -3) +
                                         wire.encode_bytes_field(3, "brain.Event:2"))
    value = summary_pb2.Summary.Value(tag="é", simple_value=0.1)
    assert value.SerializeToString() == (wire.encode_bytes_field(1, "é") +
                                         wire.encode_float_field(2, 0.1))
    for n in (0, 1, 127, 128, 300, 2 ** 35, 2 ** 63 - 1, 2 ** 64 - 1):
        assert wire.varint(wire.encode_varint(n), 0) == (n, len(wire.encode_varint(n)))
    assert wire.encode_varint(-1) == b"\xff" * 9 + b"\x01"


def test_events_are_tf_summarys_but_for_the_wall_time(tmp_path):
    _tf_events(str(tmp_path / "tf"))
    _our_events(str(tmp_path / "ours"))
    theirs, their_name = _records(tmp_path / "tf")
    ours, our_name = _records(tmp_path / "ours")
    assert len(ours) == len(theirs) == 1 + len(SCALARS)
    assert [_without_wall_time(r) for r in ours] == [_without_wall_time(r) for r in theirs]
    # The first event at whole seconds, which the file's name carries too.
    seconds = struct.unpack("<d", ours[0][1:9])[0]
    assert seconds == int(seconds) and NAME.fullmatch(our_name).group(1) == f"{int(seconds):010d}"
    assert NAME.fullmatch(our_name).groups()[1:3] == (socket.gethostname(), str(os.getpid()))
    assert NAME.fullmatch(their_name).groups()[1:3] == NAME.fullmatch(our_name).groups()[1:3]
    # Scalars' wall times: in order, after the file's.
    times = [struct.unpack("<d", r[1:9])[0] for r in ours[1:]]
    assert times == sorted(times) and times[0] >= seconds


def test_summary_iterator_and_event_accumulator_read_the_same(tmp_path):
    _tf_events(str(tmp_path / "tf"))
    _our_events(str(tmp_path / "ours"))

    def iterated(directory):
        (path,) = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
        out = []
        for event in tf.compat.v1.train.summary_iterator(path):
            if event.file_version:
                assert event.file_version == "brain.Event:2" and event.step == 0
                continue
            (value,) = event.summary.value
            assert value.metadata.plugin_data.plugin_name == "scalars"
            out.append((value.tag, tf.make_ndarray(value.tensor), event.step))
        return out

    got = iterated(str(tmp_path / "ours"))
    assert [(t, s) for t, _, s in got] == [(t, s) for t, _, s in SCALARS]
    for (_, value, _), (_, written, _) in zip(got, SCALARS):
        assert value.dtype == np.float32 and value.shape == ()
        np.testing.assert_array_equal(value, np.float32(written))
    assert str(got) == str(iterated(str(tmp_path / "tf")))

    def accumulated(directory):
        acc = event_accumulator.EventAccumulator(directory, size_guidance={"tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        assert tags["scalars"] == [] and acc.file_version == 2.0
        return {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in
                      acc.Tensors(tag)] for tag in tags["tensors"]}, acc.SummaryMetadata

    ours, our_metadata = accumulated(str(tmp_path / "ours"))
    theirs, their_metadata = accumulated(str(tmp_path / "tf"))
    assert str(ours) == str(theirs)
    assert sorted(ours) == sorted({t for t, _, _ in SCALARS})
    assert ours["loss"] == [(7, 1.25), (8, float(np.float32(0.1)))]
    for tag in ours:
        assert our_metadata(tag) == their_metadata(tag)
        assert our_metadata(tag).plugin_data.plugin_name == "scalars"


def test_buffered_until_flush_and_close(tmp_path):
    writer = events.EventFileWriter(str(tmp_path / "logs" / "train"))  # makes the dirs
    assert len(_records(tmp_path / "logs" / "train")[0]) == 1  # the version, at once
    writer.scalar("a", 1.0, 1)
    writer.scalar("a", 2.0, 2)
    assert len(_records(tmp_path / "logs" / "train")[0]) == 1
    writer.flush()
    assert len(_records(tmp_path / "logs" / "train")[0]) == 3
    writer.scalar("a", 3.0, 3)
    writer.close()
    writer.close()
    writer.flush()
    got, _ = _records(tmp_path / "logs" / "train")
    assert len(got) == 4
    # A second writer in the same directory (and second): a file of its own.
    with events.EventFileWriter(str(tmp_path / "logs" / "train")) as second:
        second.scalar("b", 1.0, 1)
    assert len(_records(None, second.path)[0]) == 2
    assert len(glob.glob(str(tmp_path / "logs" / "train" / "events.out.tfevents.*"))) == 2


def test_ram_paths_through_tensorflows_layer(tmp_path):
    """A remote path under TensorFlow's layer: the file stays open and each flush is read
    back whole (ram:// appends where a file is reopened: it must not be)."""
    root = f"ram://events-{os.getpid()}/train"
    writer = events.EventFileWriter(root)
    writer.scalar("x", 1.0, 1)
    writer.flush()
    with fileio.open_file(writer.path, "rb") as f:
        assert len(list(records.read_records(f, writer.path))) == 2
    writer.scalar("x", 2.0, 2)
    writer.close()
    with fileio.open_file(writer.path, "rb") as f:
        got = [event_pb2.Event.FromString(r) for r in records.read_records(f, writer.path)]
    assert [e.step for e in got] == [0, 1, 2]
    assert [float(tf.make_ndarray(e.summary.value[0].tensor)) for e in got[1:]] == [1.0, 2.0]


def test_noop_writer():
    writer = loop.summary_writer("/nonexistent/never/made", chief=False)
    writer.scalar("a", 1.0, 1)
    writer.flush()
    writer.close()
    assert writer.path is None and not os.path.exists("/nonexistent/never/made")
