"""The Beam build (DirectRunner) against the local build: same examples, same manifest.

Needs the optional [beam] extra; without Apache Beam only the error message is checked.
"""

import gzip
import os
import sys

import pytest

from tfrecord_builder import BuildError
from tfrecord_builder.build import BuildConfig, build, shard_name

from conftest import VOCAB, WIKI

# Manifest fields that depend on the examples, not on how they were dealt into shards.
SAME_FIELDS = ("examples", "corpus_tokens", "example_tokens", "retention", "fill",
               "documents", "lines", "skipped_lines", "skipped_line_examples",
               "empty_inputs", "tokenizer", "max_seq_length", "seed", "chunk_bytes",
               "num_shards", "features", "format", "format_version", "token_counts_file")


def _beam():
    return pytest.importorskip("apache_beam", reason="Apache Beam is not installed "
                               "(pip install -e .[beam]); the Beam build is not tested")


def _config(out, inputs, **kw):
    kw = dict(dict(vocab_file=VOCAB, num_workers=1, chunk_bytes=20000, num_shards=3), **kw)
    return BuildConfig(output_dir=str(out), inputs=tuple(str(i) for i in inputs), **kw)


def _read_build(directory, manifest):
    """(sorted example tuples, record count per shard) of a build."""
    import tensorflow as tf
    examples, counts = [], []
    for shard in manifest["shards"]:
        n = 0
        for raw in tf.data.TFRecordDataset(os.path.join(directory, shard["name"])):
            feats = tf.train.Example.FromString(raw.numpy()).features.feature
            examples.append(tuple(tuple(feats[k].int64_list.value)
                                  for k in ("input_ids", "input_mask", "segment_ids")))
            n += 1
        counts.append(n)
    return sorted(examples), counts


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """The first 2000 lines of the Wikipedia sample (with one invalid UTF-8 line, to be
    skipped and reported) and an empty file: several chunks of 20 kB, two inputs."""
    d = tmp_path_factory.mktemp("beam_corpus")
    with open(WIKI, "rb") as f:
        lines = f.read().split(b"\n")[:2000]
    lines.insert(700, b"caf\xe9 is not utf-8")
    (d / "wiki.txt").write_bytes(b"\n".join(lines) + b"\n")
    (d / "empty.txt").write_bytes(b"")
    return d


@pytest.fixture(scope="module")
def local_build(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("local_build")
    manifest = build(_config(out, [corpus_dir]))
    return str(out), manifest


def test_without_beam_the_error_says_what_to_install(monkeypatch, tmp_path):
    from tfrecord_builder import beam_pipeline
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # makes `import apache_beam` fail
    with pytest.raises(BuildError, match=r"needs Apache Beam: pip install -e \.\[beam\]"):
        beam_pipeline.build_with_beam(_config(tmp_path / "out", [WIKI]), "DirectRunner", [])
    assert not os.path.exists(tmp_path / "out")


def test_beam_build_equals_local_build(corpus_dir, local_build, tmp_path):
    _beam()
    from tfrecord_builder.beam_pipeline import STAGING_DIR, build_with_beam
    local_dir, local = local_build
    out = tmp_path / "beam"
    (out / STAGING_DIR).mkdir(parents=True)  # left by a failed run: must not matter
    (out / STAGING_DIR / "junk").write_text("x")
    manifest = build_with_beam(_config(out, [corpus_dir]), "DirectRunner", [])

    assert local["examples"] > 300 and local["skipped_lines"] == {"invalid_utf8": 1}
    assert local["empty_inputs"] == [str(corpus_dir / "empty.txt")]
    for key in SAME_FIELDS:
        assert manifest[key] == local[key], key
    assert manifest["inputs"] == local["inputs"]
    assert manifest["build_fingerprint"] != local["build_fingerprint"]

    # The same multiset of examples; per-shard counts true and summing to the total.
    local_examples, _ = _read_build(local_dir, local)
    beam_examples, counts = _read_build(str(out), manifest)
    assert len(beam_examples) == manifest["examples"]
    assert beam_examples == local_examples
    assert [s["name"] for s in manifest["shards"]] == [shard_name(i, 3) for i in range(3)]
    assert [s["examples"] for s in manifest["shards"]] == counts
    assert sum(counts) == manifest["examples"] and min(counts) > 0
    with open(os.path.join(local_dir, "token_counts.txt")) as a, \
            open(out / "token_counts.txt") as b:
        assert a.read() == b.read()
    assert sorted(os.listdir(out)) == sorted(
        ["manifest.json", "token_counts.txt", "vocab.txt"] + [shard_name(i, 3) for i in range(3)])

    # A rerun finds the finished build; another build needs --overwrite.
    assert build_with_beam(_config(out, [corpus_dir]), "DirectRunner", []) == manifest
    with pytest.raises(BuildError, match="already holds a different build"):
        build_with_beam(_config(out, [corpus_dir], seed=7), "DirectRunner", [])
    with pytest.raises(BuildError, match="--runner=NoSuchRunner"):
        build_with_beam(_config(tmp_path / "other", [corpus_dir]), "NoSuchRunner", [])


def _ram_root(name):
    """A fresh ram:// directory (TensorFlow's in-memory filesystem, reached by URL as
    gs:// would be). Its names are prefix-matched, so each root is unique."""
    import uuid
    return f"ram://{name}_{uuid.uuid4().hex}"


def _ram_objects(root):
    """Every file under a ram:// directory, relative to it."""
    import tensorflow as tf
    return sorted(os.path.join(d, n)[len(root) + 1:]
                  for d, _, names in tf.io.gfile.walk(root) for n in names)


def test_beam_build_with_urls(corpus_dir, local_build, tmp_path, monkeypatch):
    """Gzipped input and output directory given as filesystem URLs (as gs:// would be):
    the launcher and the (in-process) workers reach both through TensorFlow."""
    _beam()
    import tensorflow as tf
    from tfrecord_builder.beam_pipeline import build_with_beam
    monkeypatch.chdir(tmp_path)
    local_dir, local = local_build
    root = _ram_root("test_beam_urls")
    remote_in = root + "/corpus"
    tf.io.gfile.makedirs(remote_in)
    for name, data in [("wiki.txt.gz", gzip.compress((corpus_dir / "wiki.txt").read_bytes())),
                       ("empty.txt", b""), (".hidden", b"not an input\n")]:
        with tf.io.gfile.GFile(f"{remote_in}/{name}", "wb") as f:
            f.write(data)
    out = root + "/out"

    manifest = build_with_beam(_config(out, [remote_in], num_shards=2), "DirectRunner", [])
    assert manifest["inputs"] == [f"{remote_in}/{n}" for n in ("empty.txt", "wiki.txt.gz")]
    assert manifest["empty_inputs"] == [f"{remote_in}/empty.txt"]
    assert manifest["skipped_line_examples"] == [
        s.replace(str(corpus_dir / "wiki.txt"), f"{remote_in}/wiki.txt.gz")
        for s in local["skipped_line_examples"]]
    for key in ("examples", "corpus_tokens", "example_tokens", "retention", "tokenizer"):
        assert manifest[key] == local[key], key
    beam_examples, counts = _read_build(out, manifest)
    assert beam_examples == _read_build(local_dir, local)[0]
    assert [s["examples"] for s in manifest["shards"]] == counts
    with tf.io.gfile.GFile(out + "/token_counts.txt", "rb") as f:
        with open(os.path.join(local_dir, "token_counts.txt"), "rb") as g:
            assert f.read() == g.read()
    assert _ram_objects(out) == sorted(
        ["manifest.json", "token_counts.txt", "vocab.txt"] + [shard_name(i, 2) for i in range(2)])
    # A rerun finds the finished build in the bucket.
    assert build_with_beam(_config(out, [remote_in], num_shards=2), "DirectRunner", []) == manifest
    assert not os.path.exists(tmp_path / "ram:")  # nothing local named after the URL


def test_beam_build_of_more_shards_than_examples(tmp_path):
    """Every shard exists, empty ones too, and the counts say so."""
    _beam()
    from tfrecord_builder.beam_pipeline import build_with_beam
    text = tmp_path / "tiny.txt"
    text.write_text("A short document.\nIt has two sentences.\n\nAnother one here.\n")
    out = tmp_path / "out"
    manifest = build_with_beam(_config(out, [text], num_shards=4), "DirectRunner", [])
    assert manifest["examples"] == 2
    names = [shard_name(i, 4) for i in range(4)]
    assert [s["name"] for s in manifest["shards"]] == names
    _, counts = _read_build(str(out), manifest)
    assert [s["examples"] for s in manifest["shards"]] == counts
    assert sorted(counts) == [0, 0, 1, 1]
    assert sorted(os.listdir(out)) == sorted(["manifest.json", "token_counts.txt", "vocab.txt"]
                                             + names)


def test_failed_beam_build_publishes_nothing(corpus_dir, tmp_path):
    """An input that breaks on a worker (a truncated .gz) fails the build and leaves the
    output directory without shards, manifest or staging files."""
    _beam()
    from tfrecord_builder.beam_pipeline import build_with_beam
    data = gzip.compress((corpus_dir / "wiki.txt").read_bytes())
    (tmp_path / "broken.txt.gz").write_bytes(data[:len(data) // 2])
    out = tmp_path / "out"
    with pytest.raises(Exception, match="cannot read .*broken.txt.gz"):
        build_with_beam(_config(out, [tmp_path / "broken.txt.gz"]), "DirectRunner", [])
    assert os.listdir(out) == []
