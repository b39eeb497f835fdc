"""electra_tf.data.order: the resumable per-epoch order against a restatement of its
contract, and a resume deep into a run that reads only the shards open there."""

import pytest
import tensorflow as tf

from electra_tf.data.dataset import InputConfig, make_dataset
from electra_tf.data.files import FEATURE_NAMES, InputDataError
from electra_tf.data.order import StreamOrder


def _reference_stream(order: StreamOrder, counts, epochs):
    """(shard, record) pairs of `epochs` epochs, restated from StreamOrder's contract:
    shards in the epoch's permutation, cycle_length at a time, round robin within a
    group, then each window of the epoch permuted."""
    out = []
    for epoch in range(epochs):
        shards = order.shard_order(epoch).numpy().tolist()
        stream = []
        for g in range(0, len(shards), order.cycle_length):
            group = shards[g:g + order.cycle_length]
            for r in range(max(counts[s] for s in group)):
                stream += [(s, r) for s in group if counts[s] > r]
        if order.window > 1:
            seed = tf.random.experimental.stateless_fold_in(
                tf.constant(order.key, tf.int32), epoch, alg="philox")
            shuffled = []
            for k in range(0, len(stream), order.window):
                window = stream[k:k + order.window]
                s = tf.random.experimental.stateless_fold_in(seed, k // order.window + 1,
                                                             alg="philox")
                perm = tf.argsort(tf.random.stateless_uniform([len(window)], seed=s,
                                                              alg="philox"), stable=True)
                shuffled += [window[i] for i in perm.numpy()]
            stream = shuffled
        out += stream
    return out


def _synthetic_read(counts):
    """read(i) for StreamOrder.dataset: shard i's records are b"i:k", k < counts[i]."""
    counts_t = tf.constant(counts, tf.int64)

    def read(i):
        return tf.data.Dataset.range(tf.gather(counts_t, i)).map(
            lambda k: tf.strings.format("{}:{}", (i, k)))
    return read


def _pairs(ds, n):
    return [tuple(int(x) for x in r.decode().split(":")) for r in ds.take(n).as_numpy_iterator()]


@pytest.mark.slow
@pytest.mark.parametrize("cycle,window", [(3, 1), (4, 7)])
def test_stream_order_matches_its_contract_and_resumes_anywhere(cycle, window):
    counts = [5, 0, 9, 2, 7, 7, 1]  # ragged, an empty shard, a group of one at the end
    order = StreamOrder(num_shards=len(counts), cycle_length=cycle, window=window,
                        key=(11, 0))
    total = sum(counts)
    want = _reference_stream(order, counts, epochs=3)
    assert len(want) == 3 * total
    for e in range(3):  # every record once per epoch
        assert sorted(want[e * total:(e + 1) * total]) == sorted(
            (s, k) for s, n in enumerate(counts) for k in range(n))
    read = _synthetic_read(counts)
    assert _pairs(order.dataset(counts, read), 3 * total) == want
    # Unknown counts (no manifest): the turn runs until every shard is exhausted.
    assert _pairs(order.dataset([-1] * len(counts), read), 3 * total) == want
    for p in [1, 6, 13, total - 1, total + 8, 2 * total + 3]:
        pos = order.locate(p, counts)
        assert pos.epoch == p // total
        assert _pairs(order.dataset(counts, read, pos), 3 * total - p) == want[p:], p
    one_pass = order.dataset(counts, read, order.locate(4, counts), repeat=False)
    assert _pairs(one_pass, 10 * total) == want[4:total]


def test_stream_order_locate_is_arithmetic():
    counts = [3, 1, 4, 1, 5, 9, 2, 6]
    order = StreamOrder(num_shards=8, cycle_length=3, window=1, key=(2, 1))
    want = _reference_stream(order, counts, epochs=1)
    for p, (shard, record) in enumerate(want):
        pos = order.locate(p, counts)
        shards = order.shard_order(0).numpy().tolist()
        group = shards[3 * pos.group:3 * pos.group + 3]
        assert shard in group  # the group being read holds the record
        alive = [s for s in group if counts[s] > pos.round]
        assert (record, alive[pos.slot]) == (pos.round, shard)  # and it is next in turn
    with pytest.raises(InputDataError, match="hold no records"):
        order.locate(5, [0] * 8)
    with pytest.raises(ValueError, match="record count"):
        order.locate(5, [3, -1, 4, 1, 5, 9, 2, 6])


def _write_synthetic_shard(path, shard, records, seq):
    with tf.io.TFRecordWriter(path) as w:
        for k in range(records):
            ids = [shard, k] + [0] * (seq - 2)
            feats = {n: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
                     for n in FEATURE_NAMES}
            w.write(tf.train.Example(features=tf.train.Features(feature=feats))
                    .SerializeToString())


def test_resume_at_step_one_million_reads_only_the_current_shards(tmp_path):
    """Step 10^6 of 128-example batches over a 1,000-shard manifest (128M records, 426
    epochs in): the pipeline starts there reading only the shards of the current group
    (and the next), and yields exactly the records the order puts there. Every other
    shard is garbage and on_bad_shard=stop, so reading any of them fails the test."""
    num_shards, per_shard, seq, batch, cycle, window, seed = 1000, 300, 8, 128, 4, 256, 9
    names = [f"pretrain_data.tfrecord-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]
    from electra_tf.data import manifest as manifest_lib
    manifest_lib.write_manifest(str(tmp_path), {
        "format": manifest_lib.FORMAT, "format_version": manifest_lib.FORMAT_VERSION,
        "max_seq_length": seq, "examples": num_shards * per_shard,
        "tokenizer": {"vocab_size": 100},
        "shards": [{"name": n, "examples": per_shard} for n in names]})
    order = StreamOrder(num_shards=num_shards, cycle_length=cycle, window=window,
                        key=(seed, 0))
    step = 10 ** 6
    pos = order.locate(step * batch, [per_shard] * num_shards)
    assert pos.epoch == step * batch // (num_shards * per_shard) == 426
    shards = order.shard_order(pos.epoch).numpy().tolist()
    real = shards[cycle * pos.group:cycle * (pos.group + 2)]
    for i, name in enumerate(names):
        if i in real:
            _write_synthetic_shard(str(tmp_path / name), i, per_shard, seq)
        else:
            (tmp_path / name).write_bytes(b"\x07" * 64)  # not a TFRecord file
    cfg = InputConfig(file_pattern=str(tmp_path), max_seq_length=seq, batch_size=batch,
                      shuffle_buffer=window, cycle_length=cycle, seed=seed,
                      deterministic=True, skip_batches=step, on_bad_shard="stop",
                      check_data=False)
    got = []
    for b in make_dataset(cfg).take(2).as_numpy_iterator():
        got += [(int(r[0]), int(r[1])) for r in b["input_ids"]]
    # The expected records: epoch 426's stream, restated from the order's contract, from
    # the resume point on (only the epoch's first groups up to the next one are listed).
    stream = []
    for g in range(pos.group + 2):
        group = shards[cycle * g:cycle * (g + 1)]
        stream += [(s, r) for r in range(per_shard) for s in group]
    start = pos.window * window
    epoch_seed = tf.random.experimental.stateless_fold_in(tf.constant((seed, 0), tf.int32),
                                                          pos.epoch, alg="philox")
    want = []
    for k in range(pos.window, pos.window + 3):
        chunk = stream[k * window:(k + 1) * window]
        s = tf.random.experimental.stateless_fold_in(epoch_seed, k + 1, alg="philox")
        perm = tf.argsort(tf.random.stateless_uniform([len(chunk)], seed=s, alg="philox"),
                          stable=True).numpy()
        want += [chunk[i] for i in perm]
    offset = step * batch - pos.epoch * num_shards * per_shard - start
    assert got == want[offset:offset + 2 * batch]
    assert {s for s, _ in got} <= set(real)
