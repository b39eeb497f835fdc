"""electra_tf.data.shards: bad shards corrupted, truncated, deleted mid-run, and the
up-front checks (data/files.py) under each on_bad_shard policy.

Tiny TFRecord shards written here (records of SEQ int64 ids whose first two ids name the
shard and the record), so each test reads a few hundred records at most and all reads
are bounded (repeat=False, or a fixed number of elements).
"""

import os

import pytest
import tensorflow as tf

from electra_tf.training.options import PretrainingOptions
from electra_tf.training.loop import RunError
from electra_tf.data.files import (FEATURE_NAMES, BadShardError, InputDataError, check_data,
                                   check_sequence_length, resolve_files)
from electra_tf.data.dataset import InputConfig, make_dataset
from electra_tf.data import shards
from electra_tf.data.shards import ShardEnd, ShardLog, count_records, explain_read_error
from electra_tf.data.order import StreamOrder
from electra_tf.data import manifest as manifest_lib

SEQ = 8
RECORDS = 10  # per shard, unless a test says otherwise
BAD_AT = 5  # 0-based index of the record a test spoils


def _example(shard: int, index: int) -> bytes:
    ids = [shard, index] + [7] * (SEQ - 2)
    feature = {name: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
               for name in FEATURE_NAMES}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_shards(directory, num_shards=3, records=RECORDS, manifest=True):
    os.makedirs(directory, exist_ok=True)
    paths = []
    for s in range(num_shards):
        path = os.path.join(str(directory), f"pretrain_data.tfrecord-{s:05d}-of-{num_shards:05d}")
        with tf.io.TFRecordWriter(path) as w:
            for i in range(records):
                w.write(_example(s, i))
        paths.append(path)
    if manifest:
        _write_manifest(directory, paths, [records] * num_shards)
    return paths


def _write_manifest(directory, paths, counts):
    manifest_lib.write_manifest(str(directory), {
        "format": manifest_lib.FORMAT, "format_version": manifest_lib.FORMAT_VERSION,
        "tokenizer": {"vocab_size": 100}, "max_seq_length": SEQ,
        "examples": sum(counts),
        "shards": [{"name": os.path.basename(p), "examples": c} for p, c in zip(paths, counts)]})


def _record_offset(path, index):
    """Byte offset of record `index` (equal-size records)."""
    return index * (os.path.getsize(path) // RECORDS)


def _corrupt(path, index=BAD_AT):
    """Flips a byte in the data of record `index`: its data CRC no longer matches."""
    data = bytearray(open(path, "rb").read())
    data[_record_offset(path, index) + 12 + 5] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _truncate(path, index=BAD_AT):
    """Cuts the file in the middle of record `index`."""
    data = open(path, "rb").read()
    end = _record_offset(path, index) + 20
    open(path, "wb").write(data[:end])


def _cfg(pattern, policy, **kw):
    kw.setdefault("batch_size", 1)
    kw.setdefault("repeat", False)
    return InputConfig(file_pattern=pattern, max_seq_length=SEQ, shuffle_buffer=0,
                       on_bad_shard=policy, **kw)


def _ids(batch):
    return [(int(r[0]), int(r[1])) for r in batch["input_ids"]]


def _stop_error(ds, files, log, limit=1000):
    """Reads `ds` as the train loop does (next() inside a tf.function) until it fails;
    returns explain_read_error's error (from `log`, the ShardLog `ds` reports into)."""
    iterator = iter(ds)

    @tf.function
    def loop(it, n):
        total = tf.constant(0, tf.int32)
        for _ in tf.range(n):
            total += tf.reduce_sum(next(it)["input_mask"])
        return total

    with pytest.raises(tf.errors.OpError) as e:
        loop(iterator, tf.constant(limit))
    assert "\n" not in shards._SHARD_END_MESSAGE and files[0] not in e.value.message
    err = explain_read_error(e.value, files, log)
    assert isinstance(err, BadShardError), (type(err), e.value.message[-500:])
    assert "\n" not in str(err)
    return err


# ----------------------------------------------------------------------------- mid-read


@pytest.mark.parametrize("spoil,words", [(_corrupt, "corrupted record 6"),
                                         (_truncate, "truncated: record 6")])
def test_bad_shard_stop_names_the_file(tmp_path, spoil, words):
    files = _write_shards(tmp_path)
    spoil(files[1])
    log = ShardLog()
    ds = make_dataset(_cfg(str(tmp_path), "stop", check_data=False), log=log)
    err = _stop_error(ds, files, log)
    msg = str(err)
    assert err.path == files[1] and msg.startswith(files[1] + ": "), msg
    assert words in msg and f"after {BAD_AT} good records" in msg, msg
    assert f"read {BAD_AT} of {RECORDS} records" in msg and "on_bad_shard=stop" in msg, msg
    assert log.skipped() == []
    assert log.stopped == ShardEnd(files[1], BAD_AT, RECORDS, log.stopped.bytes, -1)
    assert log.stopped.bytes == BAD_AT * (os.path.getsize(files[0]) // RECORDS)


@pytest.mark.parametrize("spoil,words", [(_corrupt, "corrupted record 6"),
                                         (_truncate, "truncated: record 6")])
@pytest.mark.parametrize("manifest", [True, False])
def test_bad_shard_skip_reads_the_other_shards(tmp_path, caplog, spoil, words, manifest):
    files = _write_shards(tmp_path, manifest=manifest)
    spoil(files[1])
    log = ShardLog()
    got = [i for b in make_dataset(_cfg(str(tmp_path / "pretrain_data.tfrecord-*"), "skip"),
                                      log=log)
           for i in _ids(b)]
    want = {(s, i) for s in (0, 2) for i in range(RECORDS)} | {(1, i) for i in range(BAD_AT)}
    assert len(got) == 2 * RECORDS + BAD_AT == len(want)
    assert set(got) == want
    skipped = log.skipped()
    assert [s.path for s in skipped] == [files[1]] and skipped[0].times == 1
    assert log.stopped is None
    assert words in skipped[0].reason, skipped[0].reason
    warnings = [r.getMessage() for r in caplog.records
                if r.levelname == "WARNING" and "Skipping bad shard" in r.getMessage()]
    assert len(warnings) == 1 and files[1] in warnings[0] and words in warnings[0], warnings
    assert "\n" not in warnings[0] and f"read {BAD_AT}" in warnings[0]


def test_skip_without_manifest_uses_file_sizes(tmp_path):
    """No manifest: a shard that ends before its size is bad; whole shards are not."""
    files = _write_shards(tmp_path, manifest=False)
    log = ShardLog()
    got = sum(len(_ids(b)) for b in make_dataset(_cfg(str(tmp_path), "skip"), log=log))
    assert got == 3 * RECORDS and log.skipped() == []
    _truncate(files[2])
    got = sum(len(_ids(b)) for b in make_dataset(_cfg(str(tmp_path), "skip",
                                                         check_data=False), log=log))
    assert got == 2 * RECORDS + BAD_AT
    assert [s.path for s in log.skipped()] == [files[2]]


# ----------------------------------------------------------------------------- deleted


def _delete_during_first_epoch(tmp_path, policy, records):
    files = _write_shards(tmp_path, records=records)
    log = ShardLog()
    ds = make_dataset(_cfg(str(tmp_path), policy, repeat=True, deterministic=True, seed=1,
                           check_data=False), log=log)
    it = iter(ds)
    head = [i for _ in range(5) for i in _ids(next(it))]  # every shard is open by now
    os.remove(files[0])
    return files, it, head, log


def test_shard_deleted_mid_run_skip(tmp_path):
    records = 100
    files, it, head, log = _delete_during_first_epoch(tmp_path, "skip", records)
    rest = [i for _ in range(3 * records - 5 + 2 * records) for i in _ids(next(it))]
    first, second = head + rest[:3 * records - 5], rest[3 * records - 5:]
    # The open file still reads in epoch 1; epoch 2 reopens it: gone, and skipped.
    assert sorted(first) == [(s, i) for s in range(3) for i in range(records)]
    assert sorted(second) == [(s, i) for s in (1, 2) for i in range(records)]
    skipped = log.skipped()
    assert [s.path for s in skipped] == [files[0]]
    assert skipped[0].reason.startswith("missing")
    # Epoch 3 skips it again: counted (tf.data may already have read ahead into epoch
    # 4), still one bad shard.
    for _ in range(2 * records + 1):
        next(it)
    skipped = log.skipped()
    assert [s.path for s in skipped] == [files[0]] and skipped[0].times >= 2


def test_shard_deleted_mid_run_stop(tmp_path):
    records = 100
    files, it, _, log = _delete_during_first_epoch(tmp_path, "stop", records)
    with pytest.raises(tf.errors.OpError) as e:
        for _ in range(2 * 3 * records):
            next(it)
    err = explain_read_error(e.value, files, log)
    assert isinstance(err, BadShardError) and err.path == files[0]
    assert str(err).startswith(f"{files[0]}: missing") and "read 0 of 100 records" in str(err)
    assert "\n" not in str(err)
    # A new run: the up-front check names the file (stop) or leaves it out (skip).
    with pytest.raises(InputDataError, match=os.path.basename(files[0])):
        resolve_files(str(tmp_path))
    with pytest.raises(BadShardError, match="no such file"):
        resolve_files(",".join(files))
    assert resolve_files(",".join(files), "skip") == files[1:]
    assert resolve_files(str(tmp_path), "skip") == files[1:]


def test_too_many_bad_shards_stop_even_with_skip(tmp_path):
    files = _write_shards(tmp_path)
    _corrupt(files[0])
    _truncate(files[2])
    log = ShardLog()
    err = _stop_error(make_dataset(_cfg(str(tmp_path), "skip", check_data=False,
                                           deterministic=True, seed=0), log=log), files, log)
    assert "2 bad shard(s)" in str(err) and "lost data" in str(err), str(err)
    assert sorted(s.path for s in log.skipped()) == [files[0], files[2]]
    assert log.stopped.too_many and log.stopped.path in (files[0], files[2])
    assert err.path == log.stopped.path


def test_separate_logs_do_not_share_skipped_shards(tmp_path):
    """Each dataset reports into its own ShardLog (none given: a private one), never into
    another's; explaining an error with another dataset's log falls back to a host check."""
    a, b = _write_shards(tmp_path / "a"), _write_shards(tmp_path / "b")
    _corrupt(a[1])
    _truncate(b[2])
    log_a, log_b = ShardLog(), ShardLog()
    got_a = sum(len(_ids(x)) for x in make_dataset(_cfg(str(tmp_path / "a"), "skip"),
                                                      log=log_a))
    got_b = sum(len(_ids(x)) for x in make_dataset(_cfg(str(tmp_path / "b"), "skip"),
                                                      log=log_b))
    got = sum(len(_ids(x)) for x in make_dataset(_cfg(str(tmp_path / "a"), "skip")))
    assert got_a == got_b == got == 2 * RECORDS + BAD_AT
    assert [(s.path, s.times) for s in log_a.skipped()] == [(a[1], 1)]
    assert [(s.path, s.times) for s in log_b.skipped()] == [(b[2], 1)]
    err = explain_read_error(tf.errors.OutOfRangeError(None, None, "End of sequence"), a,
                             log_a)
    assert str(err) == (f"the input ran out of records: 1 shard(s) were skipped as "
                        f"unreadable ({a[1]})")

    log_c = ShardLog()
    with pytest.raises(tf.errors.OpError) as e:
        list(make_dataset(_cfg(str(tmp_path / "b"), "stop", check_data=False), log=log_c))
    assert log_c.stopped.path == b[2] and log_b.stopped is None
    err = explain_read_error(e.value, b, log_b)  # not the log it reported into
    assert err.path == b[2] and str(err).startswith(f"{b[2]}: truncated: record 6")
    assert str(err).endswith(f"({shards._SHARD_END_MESSAGE})")


# ----------------------------------------------------------------------------- explain


def test_explain_raw_reader_errors(tmp_path):
    """Errors of a plain TFRecordDataset (no file name for a bad CRC) are traced to the
    file host-side; errors that are not the input's give None."""
    files = _write_shards(tmp_path)
    _corrupt(files[2])
    with pytest.raises(tf.errors.DataLossError) as e:
        list(tf.data.TFRecordDataset(files))
    assert files[2] not in e.value.message  # what the check has to make up for
    err = explain_read_error(e.value, files)
    assert err.path == files[2] and "corrupted record 6" in str(err) and "\n" not in str(err)
    os.remove(files[1])
    with pytest.raises(tf.errors.NotFoundError) as e:
        list(tf.data.TFRecordDataset(files[1]))
    assert str(explain_read_error(e.value, files)).startswith(f"{files[1]}: missing")
    assert explain_read_error(tf.errors.ResourceExhaustedError(None, None, "OOM"),
                              files) is None
    err = explain_read_error(tf.errors.OutOfRangeError(None, None, "End of sequence"), files)
    assert type(err) is InputDataError and "ran out of records" in str(err)


# ----------------------------------------------------------------------------- up front


def test_up_front_checks_name_the_file(tmp_path):
    # Empty file without a manifest.
    files = _write_shards(tmp_path / "a", manifest=False)
    open(files[0], "wb").close()
    with pytest.raises(BadShardError) as e:
        make_dataset(_cfg(files[0], "stop"))
    assert str(e.value).startswith(f"{files[0]}: empty file (0 bytes)") and "\n" not in str(e.value)
    # Skip: warned and passed over, the other shards are checked and read.
    got = sum(len(_ids(b)) for b in make_dataset(_cfg(str(tmp_path / "a"), "skip")))
    assert got == 2 * RECORDS

    # Zero-length shard that the manifest lists with records.
    files = _write_shards(tmp_path / "b")
    open(files[1], "wb").close()
    with pytest.raises(BadShardError) as e:
        check_data(str(tmp_path / "b"), max_seq_length=SEQ)
    assert str(e.value).startswith(f"{files[1]}: empty file (0 bytes) but manifest.json "
                                   f"says it holds {RECORDS} records")
    # ... a shard the manifest lists with 0 records may be empty.
    _write_manifest(tmp_path / "b", files, [RECORDS, 0, RECORDS])
    assert check_data(str(tmp_path / "b"), max_seq_length=SEQ)["examples"] == 2 * RECORDS
    check_sequence_length([files[1], files[0]], SEQ)

    # Truncated first record (and header).
    files = _write_shards(tmp_path / "c", manifest=False)
    data = open(files[0], "rb").read()
    open(files[0], "wb").write(data[:30])
    with pytest.raises(BadShardError) as e:
        check_sequence_length(files, SEQ)
    assert str(e.value).startswith(f"{files[0]}: truncated first record")
    assert e.value.path == files[0]
    open(files[0], "wb").write(data[:7])
    with pytest.raises(BadShardError, match="truncated TFRecord header"):
        check_sequence_length(files, SEQ)
    check_sequence_length(files, SEQ, on_bad_shard="skip")  # the next file is fine

    with pytest.raises(ValueError, match="on_bad_shard"):
        _cfg(files[0], "ignore")


@pytest.mark.parametrize("policy", ["stop", "skip"])
@pytest.mark.e2e
def test_training_run_with_a_corrupted_shard(tmp_path, sample_build, caplog, monkeypatch,
                                              policy):
    """Through `pretrain.run`: stop -> one RunError naming the shard and the last good
    checkpoint, nothing saved after it; skip -> the run finishes, the shard is logged."""
    import logging
    import shutil

    from electra_tf.pretraining import pretrain
    from electra_tf.configs import load_config

    data = tmp_path / "data"
    shutil.copytree(sample_build[0], data)
    shard = sorted(p for p in os.listdir(data) if "tfrecord" in p)[2]
    _corrupt(str(data / shard), index=3)
    cfg = load_config("tiny", {"train_batch_size": "8", "num_train_steps": "2",
                               "steps_per_loop": "2", "save_checkpoints_steps": "2",
                               "on_bad_shard": policy})
    options = PretrainingOptions(model_dir=str(tmp_path / "run"), train_data=str(data),
                               strategy="cpu", jit_compile=False)
    caplog.set_level(logging.WARNING)
    watched = []  # the run's ShardInputs, whose log the train dataset reports into

    class Watched(pretrain.ShardInputs):
        def __init__(self, files):
            super().__init__(files)
            watched.append(self)

    monkeypatch.setattr(pretrain, "ShardInputs", Watched)
    if policy == "stop":
        with pytest.raises(RunError, match=f"{shard}: corrupted record [0-9]+.*last good "
                                                 "checkpoint: none"):
            pretrain.run(cfg, options)
        assert not tf.train.latest_checkpoint(str(tmp_path / "run"))
    else:
        pretrain.run(cfg, options)
        assert tf.train.latest_checkpoint(str(tmp_path / "run")).endswith("ckpt-2")
        assert [os.path.basename(s.path) for s in watched[0].log.skipped()] == [shard]
        assert any(shard in r.getMessage() for r in caplog.records)


def _resume_cfg(directory, skip_batches, on_bad_shard="stop"):
    return InputConfig(file_pattern=str(directory), max_seq_length=SEQ, batch_size=2,
                       repeat=True, deterministic=True, seed=3, cycle_length=2,
                       shuffle_buffer=1, skip_batches=skip_batches,
                       on_bad_shard=on_bad_shard)


@pytest.mark.parametrize("listed, words", [(8, "holds 10 records but manifest.json says 8"),
                                           (12, "holds 10 records but manifest.json says 12")])
def test_a_resume_checks_the_manifest_counts_of_the_shards_it_opens(tmp_path, listed, words):
    """The resume position is arithmetic on the manifest's counts: a shard open at that
    position that runs past its count, or ends before it, stops the run naming it (an
    uninterrupted run would have read other records there)."""
    paths = _write_shards(tmp_path, num_shards=4)
    order = StreamOrder(num_shards=4, cycle_length=2, window=1, key=(3, 0))
    group = [paths[i] for i in order.group_shards(0, 0)]
    _write_manifest(tmp_path, paths, [listed if p == group[0] else RECORDS for p in paths])
    make_dataset(_resume_cfg(tmp_path, 0))  # from the start: nothing to position by
    with pytest.raises(InputDataError) as e:
        make_dataset(_resume_cfg(tmp_path, 3))  # record 6: in the first group
    assert str(e.value) == (
        f"{group[0]}: {words}; the resume position is computed from manifest.json's counts, "
        "so this run would continue on other data than it would have uninterrupted: rebuild "
        "the data, or start a new --model_dir")


def test_a_resume_reads_through_only_the_shards_it_opens(tmp_path, monkeypatch):
    paths = _write_shards(tmp_path, num_shards=4)
    order = StreamOrder(num_shards=4, cycle_length=2, window=1, key=(3, 0))
    second = [paths[i] for i in order.group_shards(0, 1)]
    # A wrong count in the group not yet open is not read (it is found when reached).
    _write_manifest(tmp_path, paths, [RECORDS + (p == second[0]) for p in paths])
    seen = []
    real = count_records
    monkeypatch.setattr(shards, "count_records", lambda ps: seen.extend(ps) or real(ps))
    make_dataset(_resume_cfg(tmp_path, 3))
    assert sorted(seen) == sorted(paths[i] for i in order.group_shards(0, 0))


def test_a_corrupted_shard_at_the_resume_position_follows_on_bad_shard(tmp_path, caplog):
    paths = _write_shards(tmp_path, num_shards=2)
    _corrupt(paths[1])
    with pytest.raises(BadShardError, match="corrupted record 6"):
        make_dataset(_resume_cfg(tmp_path, 3))
    make_dataset(_resume_cfg(tmp_path, 3, on_bad_shard="skip"))
    assert "Skipping bad shard" in caplog.text and paths[1] in caplog.text
