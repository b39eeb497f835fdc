"""What a JAX-only machine runs of the training loop with TensorFlow unimportable: its
TensorBoard summaries (electra_tf/events.py; local, and remote through the native file
layer, rewritten whole at each flush), the run lease, the learning-rate schedule and the
CPU's timed matmul (JAX's); an event file on gs:// (the Cloud Storage emulator).
test_events.py holds the event files to tf.summary's."""

import json
import os
import re
import struct
import subprocess
import sys

import pytest

from electra_tf import wire
from electra_tf.data import records
from conftest import REPO
from gcs_emulator import gcs_emulator  # noqa: F401  (pytest fixture)

_CHILD = """
import sys; sys.modules['tensorflow'] = None; sys.modules['tensorflow_text'] = None
import json, os
from electra_tf import fileio
from electra_tf.data import records
from electra_tf.training import hardware, lease, loop, schedule

def count(writer):
    with fileio.open_file(writer.path, "rb") as f:
        return len(list(records.read_records(f, writer.path)))

out = loop.LoopOutput(loss=0.5, metrics={"disc_loss": 0.25}, grad_norm=2.0,
                      skipped_steps=0)
logdir = sys.argv[1]
writer = loop.summary_writer(logdir, chief=True)
loop.write_scalars(writer, 10, out, {"learning_rate": 1e-4})
writer.close()
remote = loop.summary_writer("memory://run/train", chief=True)
loop.write_scalars(remote, 1, out, {})
counts = [count(remote)]
remote.scalar("x", 1.0, 2)
counts.append(count(remote))  # not flushed yet
loop.write_scalars(remote, 3, out, {})
counts.append(count(remote))
with lease.RunLease(logdir) as held:
    held.check()
    holder = lease.read_holder(logdir).pid
print(json.dumps({
    "counts": counts, "holder": holder,
    "lease_left": os.path.exists(os.path.join(logdir, "lease.json")),
    "lr": float(schedule.WarmupPolynomialDecay(1e-3, 100, 10).compute(5.0, min, pow)),
    "flops": hardware.measure_matmul_flops(64, "float32", repeats=1),
    "tensorflow": sys.modules.get("tensorflow") is not None}))
"""


def _scalars(path):
    """[(tag, float32 value, step)] of an event file's scalar events, decoded with wire."""
    out = []
    with open(path, "rb") as f:
        for event in records.read_records(f, path):
            step, summary = 0, None
            for number, kind, start, end in wire.fields(event):
                if number == 2:
                    step = wire.varint_field(event, start, end)
                elif number == 5:
                    summary = event[start:end]
            if summary is None:
                continue
            ((_, _, vs, ve),) = wire.fields(summary)
            value = {n: summary[s:e] for n, _, s, e in wire.fields(summary, vs, ve)}
            content = {n: value[8][s:e] for n, _, s, e in wire.fields(value[8])}
            out.append((value[1].decode(), struct.unpack("<f", content[4])[0], step))
    return out


@pytest.mark.subprocess
@pytest.mark.jax
@pytest.mark.every_leg
def test_loop_summaries_lease_and_matmul_without_tensorflow(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="jax")
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # The version event and 2 scalars a write_scalars; the unflushed one not yet there.
    assert got["counts"] == [3, 3, 6]
    assert got["holder"] > 0 and not got["lease_left"] and not got["tensorflow"]
    assert got["lr"] == pytest.approx(1e-3 * 0.95 * 0.5) and got["flops"] > 0
    (name,) = [n for n in os.listdir(tmp_path) if n.startswith("events.out.tfevents.")]
    assert re.fullmatch(r"events\.out\.tfevents\.\d{10}\..+\.\d+\.0\.v2", name)
    assert _scalars(os.path.join(tmp_path, name)) == [
        ("loss", 0.5, 10), ("disc_loss", 0.25, 10),
        ("learning_rate", struct.unpack("<f", struct.pack("<f", 1e-4))[0], 10)]


_GCS_CHILD = """
import sys; sys.modules['tensorflow'] = None; sys.modules['tensorflow_text'] = None
import json
from electra_tf import events, fileio
from electra_tf.data import records

def count(path):
    with fileio.open_file(path, "rb") as f:
        return len(list(records.read_records(f, path)))

writer = events.EventFileWriter(sys.argv[1])
counts = [count(writer.path)]
writer.scalar("loss", 1.0, 1)
writer.flush()
counts.append(count(writer.path))
writer.scalar("loss", 2.0, 2)
counts.append(count(writer.path))
writer.close()
counts.append(count(writer.path))
print(json.dumps({"counts": counts, "files": fileio.glob(sys.argv[1] + "/*")}))
"""


@pytest.mark.subprocess
@pytest.mark.jax
def test_gcs_event_file_is_readable_at_each_flush(gcs_emulator):  # noqa: F811
    """gs:// through fsspec (gcsfs) on the Cloud Storage emulator, TensorFlow unimportable:
    the object is there from the start, and each flush, not only close, uploads it."""
    root = "gs://electra-test/events/train"
    env = dict(os.environ,
               STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{gcs_emulator.emulator_port}")
    done = subprocess.run([sys.executable, "-c", _GCS_CHILD, root], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["counts"] == [1, 2, 2, 3]
    (path,) = got["files"]
    assert path.startswith(root + "/events.out.tfevents.") and path.endswith(".v2")
