import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfrecord_builder import BuildError
from tfrecord_builder import build as build_lib
from tfrecord_builder.build import BuildConfig, build
from electra_tf.data.manifest import ManifestError, read_manifest, validate_manifest
from electra_tf.text import Tokenizer, VocabError, vocab_info

import forked_cli
from conftest import REPO, VOCAB, WIKI, read_examples


def _cfg(out, inputs, **kw):
    kw.setdefault("num_workers", 1)
    kw.setdefault("num_shards", 4)
    return BuildConfig(output_dir=str(out), inputs=tuple(map(str, inputs)), vocab_file=VOCAB, **kw)


def _small_corpus(tmp_path, n_lines=1500, name="small.txt"):
    with open(WIKI, encoding="utf-8") as f:
        lines = f.read().split("\n")[:n_lines]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _shard_bytes(directory, manifest):
    return [open(os.path.join(directory, s["name"]), "rb").read() for s in manifest["shards"]]


# ------------------------------------------------------------------ the bundled sample


def test_sample_manifest(sample_build):
    out, m = sample_build
    assert m["corpus_tokens"] == 549_029
    assert m["retention"] >= 0.99
    assert m["example_tokens"] == m["corpus_tokens"]  # carry-over keeps every token
    assert m["examples"] == sum(s["examples"] for s in m["shards"])
    # The official builder makes 3,902 examples holding ~86% of the tokens.
    assert 4000 < m["examples"] < 4800
    assert m["documents"] == 96
    assert m["skipped_lines"] == {}
    assert m["tokenizer"]["vocab_size"] == 30522
    assert m["tokenizer"]["kind"] == "wordpiece"
    assert m["tokenizer"]["special_token_ids"]["[MASK]"] == 103
    assert len(m["shards"]) == 16 and m["max_seq_length"] == 128
    counts = np.loadtxt(os.path.join(out, m["token_counts_file"]), dtype=np.int64)
    assert counts.shape == (30522,) and counts.sum() == 549_029
    assert sorted(os.listdir(out)) == sorted(
        [s["name"] for s in m["shards"]] + ["manifest.json", "token_counts.txt", "vocab.txt"])
    # the vocabulary beside the shards (a run records it in its directory), as the manifest
    # describes it
    with open(os.path.join(out, "vocab.txt"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == m["tokenizer"]["vocab_sha256"]


def test_every_example_well_formed_and_round_trip(sample_build):
    """Layout invariants on every example, and the examples concatenated in build order
    give back exactly the tokenized input: nothing dropped, nothing reordered."""
    out, m = sample_build
    examples = read_examples(out, m)
    assert len(examples) == m["examples"]
    content = []
    n_single = 0
    for ids, mask, segs in examples:
        n = int(mask.sum())
        assert ids.shape == (128,) and 3 <= n <= 128
        assert (mask[:n] == 1).all() and (mask[n:] == 0).all()
        assert (ids[n:] == 0).all() and (segs[n:] == 0).all()
        assert ids[0] == 101 and ids[n - 1] == 102 and (ids[:n] != 0).all()
        seps = np.flatnonzero(ids[:n] == 102)
        assert len(seps) in (1, 2)
        if len(seps) == 2:
            assert (segs[:seps[0] + 1] == 0).all() and (segs[seps[0] + 1:n] == 1).all()
        else:
            n_single += 1
            assert (segs == 0).all()
        keep = np.ones(n, bool)
        keep[0] = False
        keep[seps] = False
        content.append(ids[:n][keep])
    assert 0.08 < n_single / len(examples) < 0.2

    tok = Tokenizer(vocab_info(VOCAB))
    with open(WIKI, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    flat, _ = tok.tokenize(lines)
    stream = np.concatenate(content)
    np.testing.assert_array_equal(stream, flat)
    # ... and as text: WordPiece joined back equals the normalised input words.
    from bert_reference import _basic
    words = " ".join(tok.ids_to_tokens(stream[:5000])).replace(" ##", "").split()
    expected = [w for line in lines for w in _basic(line, lower=True)][:len(words) - 1]
    assert words[:len(expected)] == expected


def test_official_format_parses(sample_build):
    """The three features parse with the official feature spec."""
    import tensorflow as tf
    out, m = sample_build
    spec = {k: tf.io.FixedLenFeature([128], tf.int64)
            for k in ("input_ids", "input_mask", "segment_ids")}
    ds = tf.data.TFRecordDataset(os.path.join(out, m["shards"][0]["name"])).batch(8)
    batch = next(iter(ds.map(lambda x: tf.io.parse_example(x, spec))))
    assert batch["input_ids"].shape == (8, 128)
    assert batch["input_ids"].dtype == tf.int64


# ------------------------------------------------------------------ determinism


@pytest.mark.slow  # worker processes: 12-15 s under the TPU build (CI's leg 2)
def test_byte_identical_whatever_num_workers(tmp_path):
    corpus = _small_corpus(tmp_path, 3000)
    cfg = dict(chunk_bytes=20_000, num_shards=5, seed=7)
    m1 = build(_cfg(tmp_path / "w1", [corpus], num_workers=1, **cfg))
    m2 = build(_cfg(tmp_path / "w2", [corpus], num_workers=2, **cfg))
    assert m1["examples"] == m2["examples"] > 300
    assert _shard_bytes(tmp_path / "w1", m1) == _shard_bytes(tmp_path / "w2", m2)
    m3 = build(_cfg(tmp_path / "s8", [corpus], num_workers=1, **{**cfg, "seed": 8}))
    assert _shard_bytes(tmp_path / "w1", m1) != _shard_bytes(tmp_path / "s8", m3)


def test_compressed_inputs_and_crlf_give_same_shards(tmp_path):
    import bz2
    import gzip
    corpus = _small_corpus(tmp_path, 800)
    text = corpus.read_bytes()
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "c.txt.gz").write_bytes(gzip.compress(text))
    (tmp_path / "bz").mkdir()
    (tmp_path / "bz" / "c.txt.bz2").write_bytes(bz2.compress(text))
    (tmp_path / "crlf").mkdir()
    (tmp_path / "crlf" / "c.txt").write_bytes(text.replace(b"\n", b"\r\n"))
    ref = build(_cfg(tmp_path / "plain", [corpus], chunk_bytes=8192))
    for sub in ("gz", "bz", "crlf"):
        m = build(_cfg(tmp_path / f"out_{sub}", [tmp_path / sub], chunk_bytes=8192))
        assert m["corpus_tokens"] == ref["corpus_tokens"], sub
        if sub != "crlf":  # CRLF shifts byte offsets, so chunk boundaries may differ
            assert _shard_bytes(tmp_path / f"out_{sub}", m) == _shard_bytes(tmp_path / "plain", ref)
        assert m["example_tokens"] == ref["example_tokens"]


def test_inputs_by_directory_and_glob(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    _small_corpus(d, 300, "a.txt")
    _small_corpus(d, 200, "b.txt")
    m_dir = build(_cfg(tmp_path / "o1", [d]))
    m_glob = build(_cfg(tmp_path / "o2", [str(d / "*.txt")]))
    assert len(m_dir["inputs"]) == 2 and m_dir["inputs"] == m_glob["inputs"]
    assert m_dir["examples"] == m_glob["examples"]


# ------------------------------------------------------------------ atomic output and resume


def test_interrupted_build_leaves_nothing_final_and_resumes(tmp_path, monkeypatch):
    corpus = _small_corpus(tmp_path, 3000)
    cfg = _cfg(tmp_path / "out", [corpus], chunk_bytes=20_000)
    reference = build(_cfg(tmp_path / "ref", [corpus], chunk_bytes=20_000))

    real = build_lib._process_chunk
    calls = {"n": 0}

    def crash_after_three(*args):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(build_lib, "_process_chunk", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        build(cfg)
    out = tmp_path / "out"
    assert not (out / "manifest.json").exists()
    assert [n for n in os.listdir(out) if not n.startswith(".")] == []
    pieces = [n for n in os.listdir(out / ".building" / "pieces") if n.endswith(".npz")]
    assert len(pieces) == 3

    monkeypatch.setattr(build_lib, "_process_chunk", real)
    calls["n"] = 0
    resumed = build(cfg)
    assert resumed["examples"] == reference["examples"]
    assert _shard_bytes(out, resumed) == _shard_bytes(tmp_path / "ref", reference)
    assert not (out / ".building").exists()


@pytest.mark.subprocess
def test_kill_9_then_rerun_completes(tmp_path):
    """SIGKILL a real build process mid-way; the directory never looks finished and the
    same command then completes it with the same bytes as an uninterrupted build."""
    corpus = tmp_path / "big.txt"
    text = open(WIKI, encoding="utf-8").read()
    corpus.write_text(text * 3, encoding="utf-8")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tfrecord_builder", f"--input={corpus}",
           f"--output_dir={out}", "--num_workers=1", "--num_shards=3", "--chunk_bytes=65536"]
    proc = forked_cli.start(cmd[1:], stdout=forked_cli.DEVNULL, stderr=forked_cli.DEVNULL,
                            cwd=REPO)
    pieces = out / ".building" / "pieces"
    deadline = time.time() + 60
    while time.time() < deadline:
        if pieces.exists() and sum(n.endswith(".npz") for n in os.listdir(pieces)) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    assert not any(n.startswith("pretrain_data") for n in os.listdir(out))
    assert cmd[0] == sys.executable
    done = forked_cli.run(cmd[1:])
    assert done.returncode == 0, done.stderr[-2000:]
    m = read_manifest(str(out))
    ref = build(_cfg(tmp_path / "ref", [corpus], num_shards=3, chunk_bytes=65536))
    assert _shard_bytes(out, m) == _shard_bytes(tmp_path / "ref", ref)
    assert m["corpus_tokens"] == 3 * 549_029


def test_rerun_of_finished_build_is_a_no_op_and_changes_need_overwrite(tmp_path):
    corpus = _small_corpus(tmp_path, 400)
    out = tmp_path / "out"
    m1 = build(_cfg(out, [corpus]))
    stamp = os.path.getmtime(out / "manifest.json")
    m2 = build(_cfg(out, [corpus]))
    assert m2 == m1 and os.path.getmtime(out / "manifest.json") == stamp
    with pytest.raises(BuildError, match="--overwrite"):
        build(_cfg(out, [corpus], num_shards=2))
    m3 = build(_cfg(out, [corpus], num_shards=2, overwrite=True))
    assert len(m3["shards"]) == 2
    assert sorted(n for n in os.listdir(out) if n.startswith("pretrain")) == \
        [s["name"] for s in m3["shards"]]


# ------------------------------------------------------------------ manifest checks


def test_manifest_validation_messages(sample_build):
    out, _ = sample_build
    m = read_manifest(out)
    validate_manifest(m, vocab_size=30522, max_seq_length=128)
    with pytest.raises(ManifestError) as e:
        validate_manifest(m, vocab_size=32000)
    assert "30522" in str(e.value) and "32000" in str(e.value)
    with pytest.raises(ManifestError) as e:
        validate_manifest(m, max_seq_length=512)
    assert "128" in str(e.value) and "512" in str(e.value)


def test_read_manifest_errors(tmp_path):
    with pytest.raises(ManifestError, match="no manifest"):
        read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="unreadable"):
        read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ManifestError, match="not a tfrecord_builder manifest"):
        read_manifest(str(tmp_path))


def test_flag_errors():
    for kw, flag in [({"max_seq_length": 4}, "--max_seq_length"),
                     ({"num_shards": 0}, "--num_shards"),
                     ({"num_workers": 0}, "--num_workers")]:
        with pytest.raises(BuildError, match=flag):
            build(_cfg("/tmp/unused", [WIKI], **kw))


# ------------------------------------------------------------------ the CLI


@pytest.mark.subprocess
def test_cli_defaults_build_the_bundled_sample(tmp_path, sample_build):
    # -X importtime, inherited by the spawned workers: every process's imports on stderr
    # (TF_CPP_MIN_LOG_LEVEL=0: the CLI's TensorFlow import not hidden with its logs).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "tfrecord_builder",
                           "--num_workers=2"], capture_output=True, text=True, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "4" in done.stdout and "retention 100.00%" in done.stdout
    out = tmp_path / "cache" / "tfrecords" / "enwiki_sample-seq128"
    m = read_manifest(str(out))
    assert m["corpus_tokens"] == 549_029 and len(m["shards"]) == 16
    assert _shard_bytes(out, m) == _shard_bytes(sample_build[0], sample_build[1])
    # The CLI and its workers (spawned as needed) import TensorFlow and tf-text, never
    # Keras or scikit-learn (an import blocked by a stand-in leaves no line).
    imported = re.findall(r"^import time:.*\|\s+([\w.]+)$", done.stderr, re.M)
    assert imported.count("tensorflow") == imported.count("tensorflow_text") >= 2
    assert not [n for n in imported if n.split(".")[0] in ("keras", "tf_keras", "sklearn")
                or n in ("scipy.stats", "tensorflow_text.python.keras")]


@pytest.mark.every_leg
@pytest.mark.subprocess
def test_importing_the_builder_imports_no_keras_and_keras_still_imports_after():
    script = """if True:
        import sys
        import tfrecord_builder.build
        from electra_tf.text import Tokenizer, vocab_info
        print(sorted({m.split(".")[0] for m in sys.modules} & {"keras", "tf_keras", "sklearn"}))
        print(Tokenizer(vocab_info(sys.argv[1])).tokenize(["Hello world."])[0].tolist())
        import keras, tensorflow as tf, tensorflow_text as tf_text
        print(tf.keras.optimizers.Adam is keras.optimizers.Adam,
              tf_text.keras.layers.ToDense.__module__)
    """
    done = subprocess.run([sys.executable, "-c", script, VOCAB], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "[]", "[7592, 2088, 1012]", "True tensorflow_text.python.keras.layers.todense"]


@pytest.mark.parametrize("args, needle", [
    (["--input=/no/such/file.txt"], "/no/such/file.txt"),
    (["--vocab_file=/no/vocab.txt"], "/no/vocab.txt"),
    (["--max_seq_length=3"], "--max_seq_length"),
])
@pytest.mark.subprocess
def test_cli_errors_are_one_line(tmp_path, args, needle):
    done = forked_cli.run(["-m", "tfrecord_builder", "--num_workers=1",
                           f"--output_dir={tmp_path / 'o'}"] + args)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [l for l in done.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and needle in errors[0]


# ------------------------------------------------------------------ remote paths (ram://)
# TensorFlow's in-memory filesystem stands in for gs://: reached by URL, private to its
# process (so worker processes cannot see it), and with prefix-matched names (each test
# gets its own root).


def _ram_root(name):
    import uuid
    return f"ram://{name}_{uuid.uuid4().hex}"


def _ram_put(path, data):
    import tensorflow as tf
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)


def _ram_get(path):
    import tensorflow as tf
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def _ram_files(root):
    """Every file under a ram:// directory, relative to it."""
    import tensorflow as tf
    return sorted(os.path.join(d, n)[len(root) + 1:]
                  for d, _, names in tf.io.gfile.walk(root) for n in names)


# Manifest fields that name paths; the rest must equal the local build's.
_PATH_FIELDS = ("inputs", "empty_inputs", "skipped_line_examples", "build_fingerprint")
_REMOTE_CFG = dict(chunk_bytes=8192, num_shards=3)


@pytest.fixture(scope="module")
def remote_case(tmp_path_factory):
    """Three inputs (plain, .gz, .bz2) as local files and their local build."""
    import bz2
    import gzip
    d = tmp_path_factory.mktemp("remote_case")
    with open(WIKI, encoding="utf-8") as f:
        lines = f.read().split("\n")
    texts = ["\n".join(lines[i:i + 500]).encode("utf-8") + b"\n" for i in (0, 500, 1000)]
    files = {"a.txt": texts[0], "b.txt.gz": gzip.compress(texts[1]),
             "c.txt.bz2": bz2.compress(texts[2])}
    (d / "corpus").mkdir()
    for name, data in files.items():
        (d / "corpus" / name).write_bytes(data)
    ref = build(_cfg(d / "ref", [d / "corpus"], **_REMOTE_CFG))
    assert ref["examples"] > 100 and len(ref["inputs"]) == 3
    return files, str(d / "ref"), ref


def _assert_same_build(remote_out, m, local_out, ref, remote_inputs):
    assert m["inputs"] == remote_inputs
    for key in ref:
        if key not in _PATH_FIELDS:
            assert m[key] == ref[key], key
    assert read_manifest(remote_out) == m
    for shard in ref["shards"]:
        with open(os.path.join(local_out, shard["name"]), "rb") as f:
            assert _ram_get(f"{remote_out}/{shard['name']}") == f.read(), shard["name"]
    with open(os.path.join(local_out, "token_counts.txt"), "rb") as f:
        assert _ram_get(f"{remote_out}/token_counts.txt") == f.read()
    assert _ram_files(remote_out) == sorted(
        [s["name"] for s in ref["shards"]] + ["manifest.json", "token_counts.txt",
                                              "vocab.txt"])


def test_remote_input_and_output_dir_equal_local_build(remote_case, tmp_path, monkeypatch):
    """--input (a directory of plain, .gz, .bz2 files), --vocab_file and --output_dir
    under ram://: the same shards, byte for byte, as the local build, and nothing local
    named after the URL."""
    monkeypatch.chdir(tmp_path)
    files, local_out, ref = remote_case
    root = _ram_root("test_build_remote")
    for name, data in files.items():
        _ram_put(f"{root}/corpus/{name}", data)
    with open(VOCAB, "rb") as f:
        _ram_put(f"{root}/bert_uncased_vocab.txt", f.read())
    out = f"{root}/out"
    cfg = BuildConfig(output_dir=out, inputs=(f"{root}/corpus",),
                      vocab_file=f"{root}/bert_uncased_vocab.txt", num_workers=1, **_REMOTE_CFG)
    m = build(cfg)
    _assert_same_build(out, m, local_out, ref, [f"{root}/corpus/{n}" for n in sorted(files)])
    assert build(cfg) == m  # a rerun finds the finished build
    with pytest.raises(BuildError, match="--overwrite"):
        build(dataclasses.replace(cfg, num_shards=2))
    assert os.listdir(tmp_path) == []  # no local "ram:" directory


@pytest.mark.slow  # worker processes: 12 s under the TPU build (CI's leg 2)
def test_remote_build_interrupted_then_resumed_by_workers(remote_case, tmp_path,
                                                          monkeypatch):
    """--input (a glob), --vocab_file and --output_dir on ram://. An in-process build is
    interrupted after three pieces and the records (no marker) of a fourth: only
    `.building/` is there. The rerun has two worker processes, which cannot see ram://:
    they stage their pieces locally and the main process publishes each into
    `.building/`. It reuses the three finished pieces, redoes the fourth, and ends with
    the local build's bytes; the local staging directory is gone."""
    import tempfile
    monkeypatch.chdir(tmp_path)
    staging = tmp_path.parent / (tmp_path.name + "_staging")
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    files, local_out, ref = remote_case
    root = _ram_root("test_build_resume")
    for name, data in files.items():
        _ram_put(f"{root}/corpus/{name}", data)
    with open(VOCAB, "rb") as f:
        _ram_put(f"{root}/bert_uncased_vocab.txt", f.read())
    out = f"{root}/out"
    cfg = BuildConfig(output_dir=out, inputs=(f"{root}/corpus/*.*",),
                      vocab_file=f"{root}/bert_uncased_vocab.txt", num_workers=1,
                      **_REMOTE_CFG)

    real = build_lib._process_chunk
    chunks = []

    def killed_at_the_fourth(chunk, pieces_dir, *args):
        stats = real(chunk, pieces_dir, *args)
        chunks.append((chunk.file_index, chunk.index))
        if len(chunks) == 4:  # killed after the records, before the marker
            build_lib.fileio.remove(build_lib._piece_paths(pieces_dir, chunk)[1])
            raise KeyboardInterrupt
        return stats

    monkeypatch.setattr(build_lib, "_process_chunk", killed_at_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        build(cfg)
    done = [f".building/pieces/f{f:06d}-c{c:07d}" for f, c in chunks]
    left = _ram_files(out)
    assert [n for n in left if not n.startswith(".building/")] == []
    assert sorted(n for n in left if n.endswith(".tfrecord")) == [s + ".tfrecord" for s in done]
    assert sorted(n for n in left if n.endswith(".npz")) == [s + ".stats.npz" for s in done[:3]]

    monkeypatch.setattr(build_lib, "_process_chunk", real)
    real_load = build_lib._load_stats
    reused = []
    monkeypatch.setattr(build_lib, "_load_stats",
                        lambda marker: reused.append(marker) or real_load(marker))
    real_publish = build_lib._publish_piece
    published = []

    def publish(staging_dir, pieces_dir, chunk, stale=False):
        assert not staging_dir.startswith("ram://") and pieces_dir == f"{out}/.building/pieces"
        published.append((chunk.file_index, chunk.index, stale))
        real_publish(staging_dir, pieces_dir, chunk, stale)

    monkeypatch.setattr(build_lib, "_publish_piece", publish)
    m = build(dataclasses.replace(cfg, num_workers=2))
    assert sorted(reused) == [f"{out}/{s}.stats.npz" for s in done[:3]]
    # Every other chunk was made by the workers; the fourth replaced its stale records.
    assert len(published) > 5 and published[0] == chunks[3] + (True,)
    assert not any(stale for _, _, stale in published[1:])
    _assert_same_build(out, m, local_out, ref, [f"{root}/corpus/{n}" for n in sorted(files)])
    assert [n for n in os.listdir(staging) if n.startswith("tfrecord_builder-")] == []
    assert os.listdir(tmp_path) == []


def test_publish_piece_writes_records_before_marker(tmp_path, monkeypatch):
    """A kill while a staged piece is published leaves its records without its marker,
    never a marker without its records."""
    from tfrecord_builder.corpus import Chunk
    chunk = Chunk(2, 5, "x.txt", 1, b"", False)
    staged = tmp_path / "staged"
    staged.mkdir()
    piece, marker = build_lib._piece_paths(str(staged), chunk)
    with open(piece, "wb") as f:
        f.write(b"records")
    with open(marker, "wb") as f:
        f.write(b"marker")
    pieces_dir = _ram_root("test_build_publish") + "/.building/pieces"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_lib.fileio, "write_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        build_lib._publish_piece(str(staged), pieces_dir, chunk)
    assert _ram_files(pieces_dir) == ["f000002-c0000005.tfrecord"]
    monkeypatch.undo()
    _ram_put(f"{pieces_dir}/f000002-c0000005.tfrecord", b"torn")  # ram:// appends
    build_lib._publish_piece(str(staged), pieces_dir, chunk, stale=True)
    assert _ram_get(f"{pieces_dir}/f000002-c0000005.tfrecord") == b"records"
    assert _ram_get(f"{pieces_dir}/f000002-c0000005.stats.npz") == b"marker"
    assert sorted(os.listdir(staged)) == []


def test_remote_input_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = _ram_root("test_build_errors")
    with pytest.raises(BuildError, match=f"--input: no such file or directory: {root}/x.txt$"):
        build(_cfg(f"{root}/out", [f"{root}/x.txt"]))
    with pytest.raises(BuildError, match=r"--input: .*/\*\.txt matches no files"):
        build(_cfg(f"{root}/out", [f"{root}/*.txt"]))
    with pytest.raises(VocabError, match=f"--vocab_file: cannot read {root}/v.txt"):
        build(BuildConfig(output_dir=f"{root}/out", inputs=(WIKI,), vocab_file=f"{root}/v.txt"))
    with pytest.raises(BuildError, match="--output_dir nosuchfs://b/out: .*nosuchfs"):
        build(_cfg("nosuchfs://b/out", [WIKI]))
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ more shards than examples


def test_more_shards_than_examples_writes_empty_shards(tmp_path, caplog):
    """17 examples into 24 shards: shards 17-23 are empty files the manifest lists with 0
    examples, one warning says so, and the input pipeline reads the 17 examples. The
    shards with data hold what a 17-shard build's shards hold, byte for byte."""
    import logging
    from electra_tf.data.dataset import InputConfig, make_dataset
    corpus = _small_corpus(tmp_path, 60)
    with caplog.at_level(logging.WARNING):
        m = build(_cfg(tmp_path / "out", [corpus], num_shards=24, chunk_bytes=4096))
    assert m["examples"] == 17 and m["num_shards"] == 24
    assert [s["examples"] for s in m["shards"]] == [1] * 17 + [0] * 7
    out = tmp_path / "out"
    assert sorted(n for n in os.listdir(out) if n.startswith("pretrain")) == \
        [build_lib.shard_name(i, 24) for i in range(24)]
    assert [os.path.getsize(out / s["name"]) for s in m["shards"][17:]] == [0] * 7
    warnings = [r.getMessage() for r in caplog.records if "hold no example" in r.getMessage()]
    assert warnings == [
        "7 of the 24 shards (--num_shards) hold no example (the build has 17 examples): "
        "written as empty files, listed with 0 examples in manifest.json; --num_shards=17 "
        "or fewer gives no empty shard"]

    exact = build(_cfg(tmp_path / "exact", [corpus], num_shards=17, chunk_bytes=4096))
    assert _shard_bytes(out, m)[:17] == _shard_bytes(tmp_path / "exact", exact)

    cfg = InputConfig(file_pattern=str(out), batch_size=1, repeat=False, shuffle_buffer=0,
                      vocab_size=30522, on_bad_shard="stop")
    got = [b["input_ids"][0].tolist() for b in make_dataset(cfg).as_numpy_iterator()]
    want = [ids.tolist() for ids, _, _ in read_examples(str(tmp_path / "exact"), exact)]
    assert sorted(got) == sorted(want) and len(got) == 17


@pytest.mark.subprocess
def test_cli_readme_example_with_1000_shards(tmp_path):
    """The README's flags on the bundled news sample (756 examples) with
    --num_shards=1000: the build succeeds and says how many shards are empty."""
    out = tmp_path / "x"
    done = forked_cli.run(
        ["-m", "tfrecord_builder", "--input=data/corpus/lee_news_sample.txt",
         f"--output_dir={out}", "--vocab_file=data/vocab/bert_uncased_vocab.txt",
         "--do_lower_case", "--max_seq_length=128", "--num_shards=1000", "--num_workers=1",
         "--seed=12345"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == (f"756 examples, 73180 of 73180 corpus tokens kept (retention "
                           f"100.00%), 1000 shards (244 empty) in {out}\n")
    assert "244 of the 1000 shards (--num_shards) hold no example (the build has 756 " \
        "examples)" in done.stderr
    m = read_manifest(str(out))
    assert len(m["shards"]) == 1000 and sum(s["examples"] == 0 for s in m["shards"]) == 244
    assert len([n for n in os.listdir(out) if n.startswith("pretrain")]) == 1000


# ------------------------------------------------------------------ full disk


def _no_space(path):
    import tensorflow as tf
    return tf.errors.ResourceExhaustedError(None, None, f"{path}; No space left on device")


def _full_disk_message(out):
    return (f"--output_dir {out}: could not write {{}} (No space left on device); the chunks "
            f"encoded so far are kept in {out}/.building: free space and rerun the same "
            "command to resume")


def test_full_disk_while_encoding_is_one_line_and_the_rerun_resumes(tmp_path, monkeypatch):
    corpus = _small_corpus(tmp_path, 1000)
    out = tmp_path / "out"
    cfg = _cfg(out, [corpus], chunk_bytes=8192)
    reference = build(_cfg(tmp_path / "ref", [corpus], chunk_bytes=8192))

    real = build_lib._process_chunk
    calls = []

    def full_at_the_fourth(chunk, pieces_dir, *args):
        calls.append(chunk.index)
        if len(calls) == 4:
            raise _no_space(build_lib._piece_paths(pieces_dir, chunk)[0] + ".1234.tmp")
        return real(chunk, pieces_dir, *args)

    monkeypatch.setattr(build_lib, "_process_chunk", full_at_the_fourth)
    with pytest.raises(BuildError) as e:
        build(cfg)
    assert str(e.value) == _full_disk_message(out).format("the encoded chunks")
    assert not (out / "manifest.json").exists()
    assert [n for n in os.listdir(out) if not n.startswith(".")] == []
    kept = sorted(os.listdir(out / ".building" / "pieces"))
    assert kept == sorted(f"f000000-c{i:07d}{ext}" for i in range(3)
                          for ext in (".tfrecord", ".stats.npz"))

    redone = []
    monkeypatch.setattr(build_lib, "_process_chunk",
                        lambda chunk, *a: redone.append(chunk.index) or real(chunk, *a))
    m = build(cfg)
    assert redone == [3, 4, 5]  # of 6 chunks: 0-2 reused
    assert m == reference
    assert _shard_bytes(out, m) == _shard_bytes(tmp_path / "ref", reference)
    assert not (out / ".building").exists()


def test_full_disk_while_writing_shards_keeps_the_pieces(tmp_path, monkeypatch):
    """ENOSPC on the second shard: one line; the half-written shards are removed (space
    back, and a rerun deals them again from the pieces), every piece stays, and the
    rerun encodes nothing and ends with an uninterrupted build's bytes."""
    corpus = _small_corpus(tmp_path, 1000)
    out = tmp_path / "out"
    cfg = _cfg(out, [corpus], chunk_bytes=8192)
    reference = build(_cfg(tmp_path / "ref", [corpus], chunk_bytes=8192))

    real_open = build_lib.fileio.open_file

    class FullFile:
        def __init__(self, path):
            self.path = path

        def write(self, data):
            raise _no_space(self.path)

        def close(self):
            pass

    def open_file(path, mode="r"):
        if path.endswith(build_lib.shard_name(1, 4)):
            return FullFile(path)
        return real_open(path, mode)

    monkeypatch.setattr(build_lib.fileio, "open_file", open_file)
    with pytest.raises(BuildError) as e:
        build(cfg)
    assert str(e.value) == _full_disk_message(out).format("the shards")
    assert not (out / "manifest.json").exists()
    assert [n for n in os.listdir(out) if not n.startswith(".")] == []
    assert sorted(os.listdir(out / ".building")) == ["pieces", "state.json"]
    markers = [n for n in os.listdir(out / ".building" / "pieces") if n.endswith(".npz")]
    assert len(markers) == 6  # every chunk

    monkeypatch.undo()
    redone = []
    real = build_lib._process_chunk
    monkeypatch.setattr(build_lib, "_process_chunk",
                        lambda *a: redone.append(1) or real(*a))
    m = build(cfg)
    assert redone == []
    assert m == reference
    assert _shard_bytes(out, m) == _shard_bytes(tmp_path / "ref", reference)
    assert not (out / ".building").exists()


def test_out_of_space_errors_which_and_where(tmp_path):
    """What counts as a full disk (ENOSPC / EDQUOT, TensorFlow's ResourceExhaustedError
    but for an OOM), and which directory the line names: a remote --output_dir's workers
    stage pieces locally, and then that local disk is the full one."""
    import errno
    import tensorflow as tf
    out = str(tmp_path / "out")
    cfg = _cfg(out, [WIKI])
    with pytest.raises(BuildError) as e:
        with build_lib.out_of_space_errors(cfg, "the shards"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{out}/.building/x")
    assert str(e.value) == _full_disk_message(out).format("the shards")
    with pytest.raises(BuildError, match=r"could not write the shards \(Disk quota exceeded\)"):
        with build_lib.out_of_space_errors(cfg, "the shards"):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), f"{out}/x")
    oom = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    with pytest.raises(tf.errors.ResourceExhaustedError):
        with build_lib.out_of_space_errors(cfg, "the shards"):
            raise oom
    with pytest.raises(PermissionError):
        with build_lib.out_of_space_errors(cfg, "the shards"):
            raise PermissionError(errno.EACCES, "Permission denied", out)

    remote = _cfg("ram://bucket/out", [WIKI])
    with pytest.raises(BuildError) as e:
        with build_lib.out_of_space_errors(remote, "the encoded chunks"):
            raise _no_space("/tmp/tfrecord_builder-pieces-ab12/f000000-c0000001.tfrecord")
    assert str(e.value) == (
        "local staging directory /tmp/tfrecord_builder-pieces-ab12: could not write the "
        "encoded chunks (No space left on device); the chunks encoded so far are kept in "
        "ram://bucket/out/.building: free space and rerun the same command to resume")
    with pytest.raises(BuildError, match="^--output_dir ram://bucket/out: could not write"):
        with build_lib.out_of_space_errors(remote, "the shards"):
            raise _no_space("ram://bucket/out/.building/shards/x")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.subprocess
def test_cli_full_disk_is_one_line_then_the_rerun_completes(tmp_path):
    """A real ENOSPC (the shards written to /dev/full) through the CLI: exit 1, one line
    naming --output_dir, no traceback; the same command then completes the build."""
    corpus = _small_corpus(tmp_path, 400)
    out = tmp_path / "out"
    flags = [f"--input={corpus}", f"--output_dir={out}", "--num_workers=1",
             "--num_shards=3", "--chunk_bytes=8192"]
    script = (  # patched once the CLI has imported TensorFlow its own (quiet) way
        "import sys\n"
        "from tfrecord_builder import cli\n"
        "real_build = cli._build\n"
        "def build_on_a_full_disk():\n"
        "    from electra_tf import fileio\n"
        "    real = fileio.open_file\n"
        "    fileio.open_file = lambda path, mode='r': real(\n"
        "        '/dev/full' if '/.building/shards/' in path else path, mode)\n"
        "    real_build()\n"
        "cli._build = build_on_a_full_disk\n"
        f"sys.argv = ['tfrecord_builder'] + {flags!r}\n"
        "cli.run()\n")
    done = forked_cli.run(["-c", script], cwd=REPO)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stdout == ""
    errors = [l for l in done.stderr.splitlines() if "error" in l.lower()]
    assert errors == ["tfrecord_builder: error: " +
                      _full_disk_message(out).format("the shards")]
    assert done.stderr.splitlines()[-1] == errors[0]
    assert not (out / "manifest.json").exists()
    assert sorted(os.listdir(out / ".building")) == ["pieces", "state.json"]

    again = forked_cli.run(["-m", "tfrecord_builder"] + flags)
    assert again.returncode == 0, again.stderr[-2000:]
    ref = build(_cfg(tmp_path / "ref", [corpus], num_shards=3, chunk_bytes=8192))
    m = read_manifest(str(out))
    assert m == ref and _shard_bytes(out, m) == _shard_bytes(tmp_path / "ref", ref)


# ------------------------------------------------------------------ the console summary


def test_summary_says_how_many_lines_were_skipped_and_why(tmp_path):
    """A file of 5 text lines and 750 of binary junk: the summary's retention counts the
    text that was read, and a second line says what was skipped and why."""
    import random
    from tfrecord_builder import cli
    r = random.Random(0)
    junk = [bytes(r.randrange(256) for _ in range(40)).replace(b"\n", b" ")
            for _ in range(750)]
    lines = [b"good line one.", b"another fine sentence here."] + junk + \
        [b"", b"a third good line.", b"and a fourth one.", b"the fifth"]
    corpus = tmp_path / "junk.txt"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out"
    m = build(_cfg(out, [corpus], num_shards=2))
    assert m["lines"] == 756 and m["skipped_lines"] == {"invalid_utf8": 642, "nul_bytes": 108}
    assert cli.summary(m, str(out)) == (
        f"2 examples, 21 of 21 corpus tokens kept (retention 100.00%), 2 shards in {out}\n"
        f"750 of 756 input lines skipped (642 with invalid UTF-8, 108 with NUL bytes); "
        f"file:line examples in {out}/manifest.json")

    other = dict(m, skipped_lines={"long_line_split": 3}, empty_inputs=["a.txt", "b.txt"],
                 inputs=["a.txt", "b.txt", "c.txt"])
    assert cli.summary(other, "gs://b/out").splitlines()[1:] == [
        "3 over-long lines cut at a space and kept; file:line examples in "
        "gs://b/out/manifest.json",
        "2 of 3 inputs hold no text: a.txt, b.txt"]
    clean = dict(m, skipped_lines={}, skipped_line_examples=[])
    assert "\n" not in cli.summary(clean, str(out))


@pytest.mark.subprocess
def test_cli_summary_of_a_binary_file(tmp_path):
    corpus = tmp_path / "mixed.txt"
    corpus.write_bytes(b"good line one.\n\x00\xff\xfe binary\n\xff\xfe more junk\n"
                       b"a second good line.\n")
    done = forked_cli.run(["-m", "tfrecord_builder", f"--input={corpus}",
                           f"--output_dir={tmp_path / 'o'}", "--num_workers=1",
                           "--num_shards=1"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == (
        f"1 examples, 9 of 9 corpus tokens kept (retention 100.00%), 1 shards in "
        f"{tmp_path / 'o'}\n"
        f"2 of 4 input lines skipped (1 with invalid UTF-8, 1 with NUL bytes); file:line "
        f"examples in {tmp_path / 'o'}/manifest.json\n")
