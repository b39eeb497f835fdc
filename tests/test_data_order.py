"""experiments/data_order.py: the permuted copy of a build keeps every record once, deals
them evenly, follows its seed and rewrites the manifest's counts."""

import json
import os

import tensorflow as tf

from electra_tf import fileio
import experiment_scripts

do = experiment_scripts.load("data_order")


def _shards(directory, per_shard=(5, 4, 4)):
    os.makedirs(directory)
    value, shards = 0, []
    for s, n in enumerate(per_shard):
        name = f"pretrain_data.tfrecord-{s:05d}-of-{len(per_shard):05d}"
        with tf.io.TFRecordWriter(os.path.join(directory, name)) as w:
            for _ in range(n):
                w.write(str(value).encode())
                value += 1
        shards.append({"name": name, "examples": n})
    with open(os.path.join(directory, "token_counts.txt"), "w") as f:
        f.write("7\n")
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump({"format": "electra-tf/pretraining-tfrecords", "shards": shards,
                   "token_counts_file": "token_counts.txt"}, f)
    return value


def _read(directory):
    names = sorted(n for n in os.listdir(directory) if n.startswith("pretrain_data"))
    return [[int(r.numpy()) for r in tf.data.TFRecordDataset(os.path.join(directory, n))]
            for n in names]


def test_permuted_shards_hold_every_record_once_in_a_seeded_order(tmp_path):
    total = _shards(str(tmp_path / "in"))
    counts = do.permute_shards(str(tmp_path / "in"), str(tmp_path / "a"), seed=0)
    assert counts == [5, 4, 4]
    shards = _read(str(tmp_path / "a"))
    assert sorted(sum(shards, [])) == list(range(total))
    assert shards != _read(str(tmp_path / "in"))
    do.permute_shards(str(tmp_path / "in"), str(tmp_path / "b"), seed=0)
    assert _read(str(tmp_path / "b")) == shards
    do.permute_shards(str(tmp_path / "in"), str(tmp_path / "c"), seed=1)
    assert _read(str(tmp_path / "c")) != shards
    manifest = fileio.read_json(str(tmp_path / "a" / "manifest.json"))
    assert [e["examples"] for e in manifest["shards"]] == [len(s) for s in shards]
    assert manifest["permuted_from"]["seed"] == 0
    assert (tmp_path / "a" / "token_counts.txt").read_text() == "7\n"


def test_the_pretrain_window_reaches_the_training_input_only(monkeypatch):
    from electra_tf.pretraining import pretrain
    seen = {}
    monkeypatch.setattr(do.sys, "argv", list(do.sys.argv))  # restored after the test
    monkeypatch.setattr(do.runpy, "run_path", lambda path, run_name: seen.update(
        train=pretrain.input_config(["f"], _cfg(), 32, True),
        eval=pretrain.input_config(["f"], _cfg(), 32, False), argv=list(do.sys.argv)))
    original = pretrain.input_config
    try:
        do.pretrain_with_window(100, ["--config=tiny"])
    finally:
        pretrain.input_config = original
    assert seen["train"].shuffle_buffer == 100 and seen["eval"].shuffle_buffer == 1
    assert seen["argv"] == ["run_pretraining.py", "--config=tiny"]
    assert original(["f"], _cfg(), 32, True).shuffle_buffer == 10_000


def _cfg():
    from electra_tf import configs
    return configs.load_config("tiny")
