"""tfrecord_builder.sample: the bundled sample as training shards plus one held out."""

import itertools
import json
import os

from tfrecord_builder import sample

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "data", "corpus", "enwiki_sample.txt")


def small_corpus(path, lines):
    with open(CORPUS, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
        dst.writelines(itertools.islice(src, lines))


def test_bundled_sample_holds_out_its_last_shard_and_builds_once(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    small_corpus(corpus, 1200)
    monkeypatch.setattr(sample, "DEFAULT_CORPUS", str(corpus))
    cache = str(tmp_path / "cache")
    train, held_out = sample.bundled_sample(64, cache, num_workers=1)
    out = os.path.join(cache, "enwiki_sample-seq64")
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    names = sorted(os.path.join(out, s["name"]) for s in manifest["shards"])
    assert len(names) == sample.NUM_SHARDS == 16
    assert train.split(",") == names[:15] and held_out == names[15]
    assert manifest["max_seq_length"] == 64
    # A second call reuses the finished build: nothing is rewritten.
    stamp = os.stat(os.path.join(out, "manifest.json")).st_mtime_ns
    assert sample.bundled_sample(64, cache, num_workers=1) == (train, held_out)
    assert os.stat(os.path.join(out, "manifest.json")).st_mtime_ns == stamp
    # Another build of ours in its place (here: another corpus) is replaced, not an error.
    small_corpus(corpus, 600)
    again = sample.bundled_sample(64, cache, num_workers=1)
    with open(os.path.join(out, "manifest.json")) as f:
        rebuilt = json.load(f)
    assert again == (train, held_out)
    assert rebuilt["examples"] < manifest["examples"]
