"""Tests of electra_tf.data.input_pipeline against a small build of the bundled Wikipedia sample.

Expected values come from the records themselves, decoded with tf.train.Example.
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.data import input_pipeline as ip
from tfrecord_builder.build import BuildConfig, build
from electra_tf.data.manifest import ManifestError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "data", "corpus", "enwiki_sample.txt")
VOCAB = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")
SEQ = 128
VOCAB_SIZE = 30522
NUM_SHARDS = 4


def _row_key(ids, mask, seg) -> bytes:
    return np.concatenate([ids, mask, seg]).astype(np.int32).tobytes()


def _read_file(path):
    """(input_ids, input_mask, segment_ids) of every record of `path`, in file order."""
    rows = []
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
        f = tf.train.Example.FromString(raw).features.feature
        rows.append(tuple(np.array(f[n].int64_list.value, np.int64) for n in ip.FEATURE_NAMES))
    return rows


def _batch_keys(ds, limit=None):
    keys = []
    for i, batch in enumerate(ds.as_numpy_iterator()):
        if limit is not None and i >= limit:
            break
        for r in range(batch["input_ids"].shape[0]):
            keys.append(_row_key(batch["input_ids"][r], batch["input_mask"][r],
                                 batch["segment_ids"][r]))
    return keys


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("input_pipeline")
    # ~250 KB of whole lines: about 450 examples, enough for several batches per shard.
    lines, size = [], 0
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            lines.append(line)
            size += len(line)
            if size > 250_000:
                break
    corpus = root / "corpus.txt"
    corpus.write_text("".join(lines), encoding="utf-8")
    out = root / "build"
    build(BuildConfig(output_dir=str(out), inputs=(str(corpus),), vocab_file=VOCAB,
                      max_seq_length=SEQ, num_shards=NUM_SHARDS, num_workers=1))
    return str(out)


@pytest.fixture(scope="session")
def manifest(data_dir):
    with open(os.path.join(data_dir, "manifest.json")) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def records(data_dir, manifest):
    """{shard path: [row tuples in file order]}."""
    return {os.path.join(data_dir, s["name"]): _read_file(os.path.join(data_dir, s["name"]))
            for s in manifest["shards"]}


@pytest.fixture(scope="session")
def official_dir(data_dir, tmp_path_factory):
    """The same shards without manifest.json, like the official builder's output."""
    d = tmp_path_factory.mktemp("official")
    for name in os.listdir(data_dir):
        if name.startswith("pretrain_data.tfrecord"):
            shutil.copy(os.path.join(data_dir, name), d / name)
    (d / "vocab.txt").write_text("[PAD]\n")  # must not be taken for a shard
    return str(d)


def _cfg(data_dir, **kw):
    kw.setdefault("max_seq_length", SEQ)
    kw.setdefault("batch_size", 16)
    return ip.InputConfig(file_pattern=kw.pop("file_pattern", data_dir), **kw)


# ----------------------------------------------------------------------------- files


def test_directory_with_manifest_resolves_to_its_shards(data_dir, manifest):
    expected = sorted(os.path.join(data_dir, s["name"]) for s in manifest["shards"])
    assert len(expected) == NUM_SHARDS
    assert ip.resolve_files(data_dir) == expected
    # A glob over the directory skips manifest.json and token_counts.txt.
    assert ip.resolve_files(os.path.join(data_dir, "*")) == expected
    # Comma-separated parts are merged without duplicates.
    assert ip.resolve_files(f"{expected[0]}, {data_dir}/*-0000[01]-*") == expected[:2]


def test_manifest_shard_missing_is_named(data_dir, manifest, tmp_path):
    shutil.copy(os.path.join(data_dir, "manifest.json"), tmp_path / "manifest.json")
    for s in manifest["shards"][:-1]:
        shutil.copy(os.path.join(data_dir, s["name"]), tmp_path / s["name"])
    with pytest.raises(ip.InputDataError, match=manifest["shards"][-1]["name"]):
        ip.resolve_files(str(tmp_path))


def test_missing_pattern_is_a_clear_error(tmp_path):
    pattern = str(tmp_path / "nothing-here" / "pretrain_data.tfrecord-*")
    with pytest.raises(ip.InputDataError) as e:
        ip.resolve_files(pattern)
    assert isinstance(e.value, ValueError)
    assert pattern in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ip.InputDataError, match="nothing-here"):
        ip.make_dataset(ip.InputConfig(file_pattern=pattern))


def test_official_dir_without_manifest(official_dir, data_dir, records):
    files = ip.resolve_files(official_dir)
    assert [os.path.basename(f) for f in files] == sorted(os.path.basename(f) for f in records)
    assert ip.check_data(official_dir, vocab_size=VOCAB_SIZE, max_seq_length=SEQ) is None
    assert ip.peek_sequence_length(files[0]) == SEQ
    batch = next(iter(ip.make_dataset(_cfg(official_dir))))
    assert batch["input_ids"].shape == (16, SEQ)


def test_sequence_length_mismatch_without_manifest_names_file_and_lengths(official_dir):
    with pytest.raises(ip.InputDataError) as e:
        ip.make_dataset(_cfg(official_dir, max_seq_length=64))
    msg = str(e.value)
    assert "pretrain_data.tfrecord-00000" in msg and "128" in msg and "64" in msg


@pytest.mark.parametrize("kw,numbers", [
    ({"vocab_size": 30000, "max_seq_length": SEQ}, ("30522", "30000")),
    ({"vocab_size": VOCAB_SIZE, "max_seq_length": 256}, ("128", "256")),
])
def test_manifest_mismatch_raises_with_both_numbers(data_dir, kw, numbers):
    for pattern in (data_dir, os.path.join(data_dir, "pretrain_data.tfrecord-*")):
        with pytest.raises(ManifestError) as e:
            ip.check_data(pattern, **kw)
        assert all(n in str(e.value) for n in numbers), str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(ManifestError):
        ip.make_dataset(_cfg(data_dir, **kw))


def test_check_data_returns_manifest(data_dir, manifest):
    got = ip.check_data(data_dir, vocab_size=VOCAB_SIZE, max_seq_length=SEQ)
    assert got["examples"] == manifest["examples"] == sum(s["examples"] for s in manifest["shards"])


# ----------------------------------------------------------------------------- batches


def test_shapes_and_dtypes_are_static(data_dir):
    ds = ip.make_dataset(_cfg(data_dir, batch_size=16))
    assert ds.element_spec == ip.element_spec(16, SEQ)
    for name in ip.FEATURE_NAMES:
        spec = ds.element_spec[name]
        assert spec.shape.as_list() == [16, SEQ] and spec.dtype == tf.int32
    batch = next(iter(ds))
    ids, mask, seg = (batch[n].numpy() for n in ip.FEATURE_NAMES)
    assert set(np.unique(mask)) <= {0, 1} and set(np.unique(seg)) <= {0, 1}
    assert ids.min() >= 0 and ids.max() < VOCAB_SIZE
    assert (ids[:, 0] == 101).all()  # [CLS]
    assert (ids[mask == 0] == 0).all() and (seg[mask == 0] == 0).all()


def test_values_equal_the_records_in_file_order(records):
    path, rows = next(iter(records.items()))
    cfg = ip.InputConfig(file_pattern=path, max_seq_length=SEQ, batch_size=8, shuffle_buffer=0,
                         cycle_length=1, repeat=False, deterministic=True, seed=0)
    got = list(ip.make_dataset(cfg).as_numpy_iterator())
    assert len(got) == len(rows) // 8
    for b, batch in enumerate(got):
        for r in range(8):
            want = rows[b * 8 + r]
            for name, w in zip(ip.FEATURE_NAMES, want):
                np.testing.assert_array_equal(batch[name][r], w)


def test_every_example_once_per_epoch(data_dir, manifest, records):
    all_keys = collections.Counter(_row_key(*r) for rows in records.values() for r in rows)
    assert sum(all_keys.values()) == manifest["examples"]
    # Batch 1: the epoch is exactly the records.
    got = collections.Counter(_batch_keys(ip.make_dataset(_cfg(data_dir, batch_size=1,
                                                                repeat=False))))
    assert got == all_keys
    # Batch 32: full batches only, fewer than one batch left out, nothing twice.
    keys = _batch_keys(ip.make_dataset(_cfg(data_dir, batch_size=32, repeat=False)))
    assert len(keys) == manifest["examples"] // 32 * 32
    assert manifest["examples"] - len(keys) < 32
    assert not collections.Counter(keys) - all_keys
    # Repeated: each consecutive epoch's worth of examples is again every record once.
    # (Deterministic order: once, under heavy CPU load in CI, the non-deterministic
    # parallel interleave let one element cross the epoch boundary.)
    n = manifest["examples"]
    keys = _batch_keys(ip.make_dataset(_cfg(data_dir, batch_size=1, shuffle_buffer=10_000, seed=3,
                                            deterministic=True)), limit=2 * n)
    assert collections.Counter(keys[:n]) == all_keys == collections.Counter(keys[n:])
    assert keys[:n] != keys[n:]  # reshuffled each epoch


def test_two_input_pipelines_read_disjoint_files_covering_all(data_dir, records):
    files = ip.resolve_files(data_dir)
    parts = [ip.shard_files(files, 2, i) for i in range(2)]
    assert not set(parts[0]) & set(parts[1]) and sorted(parts[0] + parts[1]) == files

    seen = []
    for i in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                         num_replicas_in_sync=2)
        ds = ip.make_dataset(_cfg(data_dir, batch_size=2, repeat=False), ctx)  # 1 per replica
        assert ds.element_spec["input_ids"].shape.as_list() == [1, SEQ]
        seen.append(collections.Counter(_batch_keys(ds)))
        want = collections.Counter(_row_key(*r) for f in parts[i] for r in records[f])
        assert seen[i] == want
    assert not set(seen[0]) & set(seen[1])


def test_fewer_files_than_pipelines_is_an_error(data_dir):
    ctx = tf.distribute.InputContext(num_input_pipelines=NUM_SHARDS + 1, input_pipeline_id=0,
                                     num_replicas_in_sync=NUM_SHARDS + 1)
    with pytest.raises(ip.InputDataError, match=f"{NUM_SHARDS} input files .* {NUM_SHARDS + 1}"):
        ip.make_dataset(_cfg(data_dir, batch_size=NUM_SHARDS + 1), ctx)


def test_deterministic_mode_repeats_order_and_seed_changes_it(data_dir, manifest):
    # 40 batches of 16 cross at least one epoch boundary of the repeated data.
    assert 40 * 16 > manifest["examples"]
    run = lambda seed: _batch_keys(  # noqa: E731
        ip.make_dataset(_cfg(data_dir, deterministic=True, seed=seed, shuffle_buffer=200)),
        limit=40)
    first, second, other = run(7), run(7), run(8)
    assert first == second
    assert first != other
    assert first[:16] != other[:16]
    # Shuffled, not file order.
    assert first[:16] != _batch_keys(ip.make_dataset(_cfg(
        data_dir, deterministic=True, seed=0, shuffle_buffer=0, cycle_length=1)), limit=1)


def test_skip_batches_resumes_the_same_stream(data_dir, manifest):
    """skip_batches=k yields exactly batches k, k+1, ... of the unskipped stream, across
    an epoch boundary (what a resumed run relies on)."""
    make = lambda skip: ip.make_dataset(_cfg(  # noqa: E731
        data_dir, deterministic=True, seed=5, shuffle_buffer=200, skip_batches=skip))
    full = _batch_keys(make(0), limit=40)
    resumed = _batch_keys(make(25), limit=15)
    assert 25 * 16 < manifest["examples"] < 40 * 16
    assert len(resumed) == 15 * 16
    assert resumed == full[25 * 16:]
    with pytest.raises(ValueError, match="skip_batches"):
        _cfg(data_dir, skip_batches=-1)


def test_deterministic_needs_a_seed(data_dir):
    with pytest.raises(ValueError, match="seed"):
        _cfg(data_dir, deterministic=True)


# ----------------------------------------------------------------------------- strategies


def test_one_device_strategy(data_dir):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    cfg = _cfg(data_dir, batch_size=8)
    dist = strategy.distribute_datasets_from_function(lambda ctx: ip.make_dataset(cfg, ctx))

    @tf.function
    def step(batch):
        return strategy.run(lambda b: tf.reduce_sum(b["input_mask"]), args=(batch,))

    it = iter(dist)
    for _ in range(3):
        batch = next(it)
        assert batch["input_ids"].shape == (8, SEQ) and batch["input_ids"].dtype == tf.int32
        assert int(step(batch)) == int(tf.reduce_sum(batch["input_mask"]))


MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from electra_tf.data import input_pipeline as ip

    cfg = ip.InputConfig(file_pattern=sys.argv[1], max_seq_length=128, batch_size=8,
                         deterministic=True, seed=3)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    contexts = []

    def dataset_fn(ctx):
        contexts.append([ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync])
        return ip.make_dataset(cfg, ctx)

    dist = strategy.distribute_datasets_from_function(dataset_fn)

    @tf.function
    def step(batch):
        tokens = strategy.run(lambda b: tf.reduce_sum(b["input_mask"]), args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, tokens, axis=None)

    out = {"contexts": contexts, "shapes": [], "dtypes": [], "rows": [], "tokens": [], "sums": []}
    it = iter(dist)
    for _ in range(4):
        batch = next(it)
        parts = strategy.experimental_local_results(batch["input_ids"])
        masks = strategy.experimental_local_results(batch["input_mask"])
        out["shapes"].append([p.shape.as_list() for p in parts])
        out["dtypes"].append([p.dtype.name for p in parts])
        out["rows"] += [p.numpy()[r].tolist() for p in parts for r in range(p.shape[0])]
        out["tokens"].append(int(step(batch)))
        out["sums"].append(int(sum(int(tf.reduce_sum(m)) for m in masks)))
    # The same pipeline read directly: its first 8 batches feed the 4 steps of 2 replicas.
    direct = ip.make_dataset(cfg, tf.distribute.InputContext(1, 0, 2))
    out["direct"] = [b["input_ids"][r].tolist() for b in direct.take(8).as_numpy_iterator()
                     for r in range(4)]
    print(json.dumps(out))
""")


def test_mirrored_strategy_two_cpu_replicas(data_dir):
    # A subprocess: logical devices can only be configured before TF initializes them,
    # which other tests in this process have already done.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT, data_dir], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["contexts"] == [[1, 0, 2]]  # one pipeline on this host, 2 replicas
    assert out["shapes"] == [[[4, SEQ], [4, SEQ]]] * 4  # global 8 -> 4 per replica
    assert out["dtypes"] == [["int32", "int32"]] * 4
    assert out["tokens"] == out["sums"] and min(out["tokens"]) > 0
    rows = [tuple(r) for r in out["rows"]]
    assert len(set(rows)) == len(rows) == 32  # replicas got different examples
    assert sorted(rows) == sorted(tuple(r) for r in out["direct"])
    # Deterministic mode: this process, building the same pipeline, gets the same order.
    # tf.data combines op seeds with the global seed, which the subprocess never set and
    # earlier tests here did (every trainer seeds its run): clear it, as a fresh process.
    tf.random.set_seed(None)
    cfg = ip.InputConfig(file_pattern=data_dir, max_seq_length=SEQ, batch_size=8,
                         deterministic=True, seed=3)
    here = ip.make_dataset(cfg, tf.distribute.InputContext(1, 0, 2))
    assert [b["input_ids"][r].tolist() for b in here.take(8).as_numpy_iterator()
            for r in range(4)] == out["direct"]


# ----------------------------------------------------------------------------- order


def _reference_stream(order: ip.StreamOrder, counts, epochs):
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


@pytest.mark.parametrize("cycle,window", [(3, 1), (4, 7)])
def test_stream_order_matches_its_contract_and_resumes_anywhere(cycle, window):
    counts = [5, 0, 9, 2, 7, 7, 1]  # ragged, an empty shard, a group of one at the end
    order = ip.StreamOrder(num_shards=len(counts), cycle_length=cycle, window=window,
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
    order = ip.StreamOrder(num_shards=8, cycle_length=3, window=1, key=(2, 1))
    want = _reference_stream(order, counts, epochs=1)
    for p, (shard, record) in enumerate(want):
        pos = order.locate(p, counts)
        shards = order.shard_order(0).numpy().tolist()
        group = shards[3 * pos.group:3 * pos.group + 3]
        assert shard in group  # the group being read holds the record
        alive = [s for s in group if counts[s] > pos.round]
        assert (record, alive[pos.slot]) == (pos.round, shard)  # and it is next in turn
    with pytest.raises(ip.InputDataError, match="hold no records"):
        order.locate(5, [0] * 8)
    with pytest.raises(ValueError, match="record count"):
        order.locate(5, [3, -1, 4, 1, 5, 9, 2, 6])


def _write_synthetic_shard(path, shard, records, seq):
    with tf.io.TFRecordWriter(path) as w:
        for k in range(records):
            ids = [shard, k] + [0] * (seq - 2)
            feats = {n: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
                     for n in ip.FEATURE_NAMES}
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
    order = ip.StreamOrder(num_shards=num_shards, cycle_length=cycle, window=window,
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
    cfg = ip.InputConfig(file_pattern=str(tmp_path), max_seq_length=seq, batch_size=batch,
                         shuffle_buffer=window, cycle_length=cycle, seed=seed,
                         deterministic=True, skip_batches=step, on_bad_shard="stop",
                         check_data=False)
    got = []
    for b in ip.make_dataset(cfg).take(2).as_numpy_iterator():
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
