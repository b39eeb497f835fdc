"""electra_tf.philox (TensorFlow's stateless Philox draws in NumPy) against TensorFlow itself,
bit for bit, and the input order's draws (`data/order.py`) computed either way."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import philox
from electra_tf.data.order import StreamOrder
from conftest import REPO

SEEDS = [(0, 0), (1, 2), (12345, 0), (-5, 7), (2 ** 31 - 1, -2 ** 31), (7, 123456789)]


@pytest.mark.parametrize("seed", SEEDS)
def test_uniform_and_fold_in_are_tensorflows_bits(seed):
    t = tf.constant(seed, tf.int32)
    for n in (1, 3, 4, 5, 1000):
        want = tf.random.stateless_uniform([n], seed=t, alg="philox").numpy()
        got = philox.uniform(n, seed)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    for data in (0, 1, -3, 2 ** 31 - 1):
        want = tf.random.experimental.stateless_fold_in(t, data, alg="philox").numpy()
        np.testing.assert_array_equal(philox.fold_in(seed, data), want)
    want = tf.argsort(tf.random.stateless_uniform([257], seed=t, alg="philox"),
                      stable=True).numpy()
    np.testing.assert_array_equal(philox.permutation(257, seed), want)


def test_the_philox_block_matches_the_published_known_answers():
    """Philox-4x32-10 known-answer vectors of the Random123 distribution (kat_vectors)."""
    zero = philox.philox(np.zeros([1, 4], np.uint32), (0, 0))[0]
    assert [hex(int(w)) for w in zero] == ["0x6627e8d5", "0xe169c58d", "0xbc57ac4c",
                                           "0x9b00dbd8"]
    ones = philox.philox(np.full([1, 4], 0xFFFFFFFF, np.uint32), (0xFFFFFFFF, 0xFFFFFFFF))[0]
    assert [hex(int(w)) for w in ones] == ["0x408f276d", "0x41c83b0e", "0xa20bc7c6",
                                           "0x6d5451fd"]


@pytest.mark.parametrize("num_shards, key", [(16, (12345, 0)), (5, (7, 3)), (1, (0, 0)),
                                             (64, (2 ** 31 - 1, 1))])
def test_the_input_orders_draws_are_the_same_in_numpy(num_shards, key):
    """The epoch's shard permutation and its windows' shuffles, as the tf.data pipeline
    draws them (graph ops) and as the host draws them (NumPy, no TensorFlow)."""
    order = StreamOrder(num_shards=num_shards, cycle_length=min(8, num_shards), window=100,
                        key=key)
    for epoch in (0, 1, 17):
        np.testing.assert_array_equal(order.shard_permutation(epoch),
                                      order.shard_order(epoch).numpy())
        seed = order._epoch_seed(epoch)
        for window, size in ((0, 100), (3, 100), (9, 37)):
            s = tf.random.experimental.stateless_fold_in(seed, window + 1, alg="philox")
            np.testing.assert_array_equal(order.window_permutation(epoch, window, size),
                                          order._permutation([size], s).numpy())


def test_importing_it_needs_no_tensorflow():
    """philox, and the readers of TFRecords and checkpoints, with TensorFlow unimportable."""
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from electra_tf import philox, bundle, wire\n"
            "from electra_tf.data import records\n"
            "records.parse_examples([], 4)\n"
            "print(philox.permutation(5, (1, 2)).tolist())")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    want = tf.argsort(tf.random.stateless_uniform([5], seed=[1, 2], alg="philox"),
                      stable=True).numpy().tolist()
    assert done.stdout.strip() == str(want)


def _numpy_batches(data_dir, seed, cycle_length, window, batch_size, skip_batches, num,
                   pipelines=1, pipeline=0):
    """The pre-training input without tf.data: the order's `records` stream (Philox in
    NumPy) over `data.records`' reader, parsed by `parse_examples`."""
    import itertools
    from electra_tf.data import files, records
    paths = files.shard_files(files.resolve_files(data_dir), pipelines, pipeline)
    counts = files.manifest_counts(paths)
    order = StreamOrder(num_shards=len(paths), cycle_length=min(cycle_length, len(paths)),
                        window=max(window, 1), key=(seed % (1 << 31), pipeline))
    counts = [counts[p] for p in paths]
    skip = skip_batches * batch_size
    position = order.locate(skip, counts) if skip else None

    def read(i):
        with open(paths[i], "rb") as f:
            return list(records.read_records(f, paths[i]))

    stream = order.records(counts, read, position)
    out = []
    for _ in range(num):
        raw = list(itertools.islice(stream, batch_size))
        out.append(records.parse_examples(raw, 128))
    return out


@pytest.mark.parametrize("cycle_length, window, skip_batches, pipelines", [
    (2, 100, 0, 1),  # round robin over pairs of shards, windows of 100
    (8, 10_000, 0, 1),  # every shard at once, a window over whole epochs
    (3, 64, 5, 1),  # resumed after 5 batches: inside a window, inside a round
    (1, 1, 7, 1),  # shard after shard, no shuffle, resumed
    (2, 50, 3, 2),  # the second of two input pipelines (hosts)
])
def test_the_numpy_stream_gives_tf_datas_batches(data_dir, cycle_length, window,
                                                 skip_batches, pipelines):
    """Batch for batch (over more than one epoch) the same int32 arrays as `make_dataset`
    with the same seed, from the start and from a resume position."""
    from electra_tf.data.dataset import InputConfig, make_dataset
    batch, num = 16, 40  # 640 records: past the ~450-record epoch (one host's share less)
    cfg = InputConfig(file_pattern=data_dir, max_seq_length=128, batch_size=batch,
                      shuffle_buffer=window, cycle_length=cycle_length, deterministic=True,
                      seed=1234, skip_batches=skip_batches)
    context = tf.distribute.InputContext(pipelines, pipelines - 1, 1) if pipelines > 1 \
        else None
    want = list(make_dataset(cfg, context).take(num).as_numpy_iterator())
    got = _numpy_batches(data_dir, 1234, cycle_length, window, batch, skip_batches, num,
                         pipelines, pipelines - 1)
    assert len(want) == len(got) == num
    for i, (w, g) in enumerate(zip(want, got)):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=f"batch {i} {name}")
