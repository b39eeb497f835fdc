"""The pre-training input without TensorFlow (`dataset.make_batches`, the JAX runtime's):
the same batches in the same order as tf.data's `make_dataset`, batch for batch, fresh and
resumed, per input pipeline (host); bad shards skipped or stopped on as there, with the
same ShardLog and the same one-line errors; and all of it with TensorFlow unimportable."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data import shards
from electra_tf.data.dataset import InputConfig, InputContext, make_batches, make_dataset
from electra_tf.data.files import BadShardError, resolve_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ = 128  # conftest.SMALL_SEQ: the data_dir build's


def _cfg(pattern, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("seed", 5)
    return InputConfig(file_pattern=pattern, max_seq_length=SEQ, deterministic=True,
                       check_data=False, **kw)


def _tf_batches(cfg, num, pipelines=1, pipeline=0, log=None):
    ctx = tf.distribute.InputContext(pipelines, pipeline, pipelines)
    it = iter(make_dataset(cfg, ctx, log))
    return [{k: v.numpy() for k, v in next(it).items()} for _ in range(num)]


def _host_batches(cfg, num, pipelines=1, pipeline=0, log=None):
    it = make_batches(cfg, InputContext(pipelines, pipeline, pipelines), log)
    return [next(it) for _ in range(num)]


def _assert_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k in w:
            assert g[k].dtype == np.int32 and g[k].shape == w[k].shape
            np.testing.assert_array_equal(g[k], w[k])


@pytest.mark.parametrize("cycle_length, window, skip_batches, pipelines", [
    (8, 10_000, 0, 1),  # the run's defaults
    (2, 100, 0, 1),  # round robin over pairs of shards, windows of 100
    (3, 64, 5, 1),  # resumed after 5 batches: inside a window, inside a round
    (1, 1, 7, 1),  # shard after shard, no shuffle, resumed
    (2, 50, 3, 2),  # the second of two input pipelines (hosts), resumed
])
def test_the_host_batches_are_tf_datas(data_dir, cycle_length, window, skip_batches,
                                       pipelines):
    cfg = _cfg(data_dir, cycle_length=cycle_length, shuffle_buffer=window,
               skip_batches=skip_batches, batch_size=8 * pipelines)
    pipeline = pipelines - 1
    want = _tf_batches(cfg, 60, pipelines, pipeline)  # past an epoch of a pipeline's shards
    _assert_equal(_host_batches(cfg, 60, pipelines, pipeline), want)


def test_a_resumed_stream_continues_the_uninterrupted_one(data_dir):
    """skip_batches=k gives batch k onwards of the uninterrupted stream."""
    whole = _host_batches(_cfg(data_dir), 30)
    _assert_equal(_host_batches(_cfg(data_dir, skip_batches=17), 13), whole[17:])


def _spoiled(data_dir, tmp_path, how):
    """A copy of the build with its second shard corrupted (a flipped byte in record 3's
    data) or truncated (cut inside record 3)."""
    out = tmp_path / "build"
    shutil.copytree(data_dir, out)
    path = resolve_files(str(out))[1]
    data = bytearray(open(path, "rb").read())
    offset = 0
    for _ in range(3):
        offset += 16 + int.from_bytes(data[offset:offset + 8], "little")
    if how == "corrupt":
        data[offset + 12 + 5] ^= 0xFF
    else:
        data = data[:offset + 20]
    with open(path, "wb") as f:
        f.write(bytes(data))
    return str(out), path


@pytest.mark.parametrize("how, words", [("corrupt", "corrupted record 4"),
                                        ("truncate", "truncated: record 4")])
def test_a_bad_shard_is_skipped_as_on_tf_data(data_dir, tmp_path, how, words):
    build, bad = _spoiled(data_dir, tmp_path, how)
    cfg = _cfg(build, cycle_length=2, shuffle_buffer=100)
    tf_log, host_log = shards.ShardLog(), shards.ShardLog()
    want = _tf_batches(cfg, 40, log=tf_log)
    _assert_equal(_host_batches(cfg, 40, log=host_log), want)
    assert [s.path for s in host_log.skipped()] == [bad]
    assert host_log.skipped() == tf_log.skipped()
    assert words in host_log.skipped()[0].reason and "after 3 good records" in \
        host_log.skipped()[0].reason


def test_a_bad_shard_stops_with_the_same_line(data_dir, tmp_path):
    build, bad = _spoiled(data_dir, tmp_path, "corrupt")
    cfg = _cfg(build, cycle_length=2, shuffle_buffer=100, on_bad_shard="stop")
    files = resolve_files(build)
    log = shards.ShardLog()
    with pytest.raises(BadShardError) as caught:
        _host_batches(cfg, 200, log=log)
    host_line = str(caught.value)
    assert caught.value.path == bad and host_line.startswith(bad + ": corrupted record 4")
    assert "on_bad_shard=stop" in host_line and "\n" not in host_line
    # the loop's guard passes it through as it is
    assert shards.explain_read_error(caught.value, files, log) is caught.value
    tf_log = shards.ShardLog()
    with pytest.raises(tf.errors.OpError) as tf_error:
        _tf_batches(cfg, 200, log=tf_log)
    assert str(shards.explain_read_error(tf_error.value, files, tf_log)) == host_line


def test_without_tensorflow(data_dir, tmp_path):
    """The host pipeline, a bad shard's reason and the record counts with TensorFlow
    unimportable: the batches are tf.data's (written here first)."""
    cfg = _cfg(data_dir, cycle_length=3, shuffle_buffer=64, skip_batches=4)
    want = _tf_batches(cfg, 12)
    np.savez(tmp_path / "want.npz", **{f"{i}/{k}": v for i, b in enumerate(want)
                                         for k, v in b.items()})
    build, bad = _spoiled(data_dir, tmp_path, "truncate")
    reason = shards.shard_problem(bad)
    code = f"""
import sys; sys.modules['tensorflow'] = None
import json
import numpy as np
from electra_tf import fileio
from electra_tf.data import shards
from electra_tf.data.dataset import InputConfig, InputContext, make_batches
assert not fileio.uses_tensorflow()
cfg = InputConfig(file_pattern={data_dir!r}, max_seq_length={SEQ}, batch_size=8, seed=5,
                  deterministic=True, cycle_length=3, shuffle_buffer=64, skip_batches=4)
want = np.load({str(tmp_path / "want.npz")!r})
it = make_batches(cfg, InputContext(1, 0, 1))
same = all(np.array_equal(b[k], want[f"{{i}}/{{k}}"]) for i in range(12)
           for b in [next(it)] for k in b)
print(json.dumps([same, shards.shard_problem({bad!r}),
                  sorted(shards.count_records(fileio.glob({build!r} + "/*tfrecord*")).values())]))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    same, native_reason, counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert same
    assert native_reason == reason  # TensorFlow's reader's words, from ours
    want_counts = shards.count_records(resolve_files(build))
    assert counts == sorted(want_counts.values()) and 3 in counts
