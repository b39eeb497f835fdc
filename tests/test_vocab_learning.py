"""learn_vocab: WordPiece vocab.txt and SentencePiece model learned from a corpus slice,
checked on their own, with the builder's tokenizer, and end to end through `build`."""

import bz2
import gzip
import os
import unicodedata

import numpy as np
import pytest

from tfrecord_builder import BuildError
from tfrecord_builder import vocab_learning
from electra_tf.text import SPECIAL_TOKENS, Tokenizer, read_wordpiece_vocab, vocab_info

import forked_cli
from conftest import WIKI

TRAIN_LINES = 3000
VOCAB_SIZE = 2000
# Measured on held-out lines 3000..3999 of the sample: WordPiece 0.016% [UNK] tokens,
# SentencePiece ~5.5% of lines hold an [UNK] (rare characters outside the 99.95%
# character coverage of 3000 lines). The thresholds leave room for learner changes.
MAX_WORDPIECE_UNK_RATE = 0.002
MIN_SPM_ROUND_TRIP_LINES = 0.90


def _wiki_lines():
    with open(WIKI, encoding="utf-8") as f:
        return f.read().split("\n")


@pytest.fixture(scope="module")
def corpus_slice(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "wiki3k.txt"
    path.write_text("\n".join(_wiki_lines()[:TRAIN_LINES]) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def held_out():
    return [line.strip() for line in _wiki_lines()[TRAIN_LINES:TRAIN_LINES + 1000]
            if line.strip()]


@pytest.fixture(scope="module")
def wordpiece_vocab(corpus_slice, tmp_path_factory):
    out = tmp_path_factory.mktemp("wp") / "vocab.txt"
    path = vocab_learning.learn_vocab(inputs=[corpus_slice], output=str(out),
                                      vocab_type="wordpiece", vocab_size=VOCAB_SIZE,
                                      do_lower_case=True, max_sentences=100_000)
    assert path == str(out)
    return path


@pytest.fixture(scope="module")
def spm_model(corpus_slice, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("spm") / "sp"
    path = vocab_learning.learn_vocab(inputs=[corpus_slice], output=str(prefix),
                                      vocab_type="sentencepiece", vocab_size=VOCAB_SIZE,
                                      do_lower_case=True, max_sentences=100_000)
    assert path == str(prefix) + ".model"
    return path


# ----------------------------------------------------------------------------- sampling


def test_reservoir_is_deterministic_uniform_and_batch_independent():
    stream = [str(i) for i in range(20_000)]
    a = vocab_learning.Reservoir(500, seed=7)
    a.extend(stream)
    b = vocab_learning.Reservoir(500, seed=7)
    for lo in range(0, len(stream), 333):
        b.extend(stream[lo:lo + 333])
    assert a.items == b.items and a.seen == b.seen == 20_000
    assert len(set(a.items)) == 500
    picked = np.array(sorted(map(int, a.items)))
    assert abs(picked.mean() - 10_000) < 800  # uniform over the stream, not its head
    assert (picked >= 10_000).sum() > 200
    small = vocab_learning.Reservoir(500, seed=7)
    small.extend(stream[:300])
    assert small.items == stream[:300]  # a short stream is kept whole, in order
    c = vocab_learning.Reservoir(500, seed=8)
    c.extend(stream)
    assert c.items != a.items


def test_sample_lines_reads_like_the_builder(tmp_path):
    """Plain, .gz, .bz2 and directories; invalid UTF-8 and NUL lines are skipped."""
    good = ["First line.", "Second line.", "", "Third line, new document."]
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.txt").write_bytes(("\n".join(good) + "\n").encode()
                              + b"bad \xff\xfe line\nnul\x00line\nlast a\n")
    with gzip.open(d / "b.txt.gz", "wb") as f:
        f.write(b"gz one\n\ngz two\n")
    with bz2.open(d / "c.txt.bz2", "wb") as f:
        f.write(b"bz one\n")
    lines, files, stats = vocab_learning.sample_lines([str(d)], max_sentences=100)
    assert len(files) == 3
    assert lines == ["First line.", "Second line.", "Third line, new document.", "last a",
                     "gz one", "gz two", "bz one"]
    assert stats.skipped == {"invalid_utf8": 1, "nul_bytes": 1}
    # Bounded, deterministic sample when there are more lines than max_sentences.
    s1, _, _ = vocab_learning.sample_lines([WIKI], max_sentences=50, seed=3)
    s2, _, _ = vocab_learning.sample_lines([WIKI], max_sentences=50, seed=3)
    assert s1 == s2 and len(s1) == 50 and all(s1)
    assert not set(s1) <= set(line.strip() for line in _wiki_lines()[:1000])


# ----------------------------------------------------------------------------- WordPiece


def test_wordpiece_vocab_layout(wordpiece_vocab):
    tokens = read_wordpiece_vocab(wordpiece_vocab)
    # The learner's threshold gives >= the target; the least frequent surplus is trimmed.
    assert len(tokens) == VOCAB_SIZE
    assert tokens[:5] == list(SPECIAL_TOKENS) and tokens[0] == "[PAD]"
    assert len(set(tokens)) == len(tokens)
    assert all(t and not any(c.isspace() for c in t) for t in tokens)
    chars = [t for t in tokens[5:] if len(t) == 1]
    assert len(chars) > 40 and all("##" + c in tokens for c in chars)
    assert {"the", "of", "anarchism", "##s"} <= set(tokens)
    assert all(t == t.lower() for t in tokens[5:])
    info = vocab_info(vocab_file=wordpiece_vocab)
    assert info.special_ids == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    leftovers = [n for n in os.listdir(os.path.dirname(wordpiece_vocab)) if n != "vocab.txt"]
    assert leftovers == []  # no temp files
    assert oct(os.stat(wordpiece_vocab).st_mode & 0o777) != "0o600"


def test_wordpiece_tokenizes_held_out_text(wordpiece_vocab, held_out):
    tok = Tokenizer(vocab_info(vocab_file=wordpiece_vocab))
    flat, splits = tok.tokenize(held_out)
    unk_rate = float(np.mean(flat == 1))
    assert len(flat) > 40_000
    assert unk_rate < MAX_WORDPIECE_UNK_RATE, unk_rate
    # 2.17 tokens per whitespace-separated word measured (punctuation splits off).
    assert len(flat) / sum(len(line.split()) for line in held_out) < 2.6
    # The literal text "[MASK]" is just punctuation and a word, never the mask id.
    ids, _ = tok.tokenize(["a [MASK] and [CLS] b"])
    assert not set(ids.tolist()) & {0, 2, 3, 4}


# ----------------------------------------------------------------------------- SentencePiece


def test_sentencepiece_model_layout(spm_model):
    import sentencepiece as spm
    proc = spm.SentencePieceProcessor(model_file=spm_model)
    assert proc.get_piece_size() == VOCAB_SIZE
    assert [proc.id_to_piece(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert (proc.pad_id(), proc.unk_id(), proc.bos_id(), proc.eos_id()) == (0, 1, -1, -1)
    assert all(proc.is_control(i) for i in (2, 3, 4))
    info = vocab_info(spm_model=spm_model)
    assert info.kind == "sentencepiece" and info.vocab_size == VOCAB_SIZE
    assert info.special_ids == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab_file = spm_model[:-len(".model")] + ".vocab"
    with open(vocab_file, encoding="utf-8") as f:
        rows = f.read().splitlines()
    assert len(rows) == VOCAB_SIZE and rows[0].split("\t")[0] == "[PAD]"
    assert sorted(os.listdir(os.path.dirname(spm_model))) == ["sp.model", "sp.vocab"]
    # Lower-cased training text: no upper-case pieces.
    assert not any(any(c.isupper() for c in proc.id_to_piece(i)) for i in range(5, VOCAB_SIZE))


def test_sentencepiece_round_trip(spm_model, held_out):
    import sentencepiece as spm
    proc = spm.SentencePieceProcessor(model_file=spm_model)
    texts = [line.lower() for line in held_out]
    exact = 0
    for text in texts:
        ids = proc.encode(text)
        expected = " ".join(unicodedata.normalize("NFKC", text).split())
        if 1 not in ids:
            assert proc.decode(ids) == expected
        exact += proc.decode(ids) == expected
    assert exact / len(texts) >= MIN_SPM_ROUND_TRIP_LINES, exact / len(texts)
    # The builder's tokenizer (tf-text) gives the same ids as the Python processor.
    tok = Tokenizer(vocab_info(spm_model=spm_model))
    flat, splits = tok.tokenize(held_out[:200])
    assert [flat[splits[i]:splits[i + 1]].tolist() for i in range(200)] == \
        [proc.encode(t) for t in texts[:200]]
    # Control symbols are never produced from text.
    ids, _ = tok.tokenize(["a [MASK] b [CLS] [SEP] [PAD]"])
    assert not set(ids.tolist()) & {0, 2, 3, 4}


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_build_with_learned_vocab(kind, corpus_slice, wordpiece_vocab, spm_model, tmp_path):
    from tfrecord_builder.build import BuildConfig, build
    kw = {"spm_model": spm_model} if kind == "sentencepiece" else {"vocab_file": wordpiece_vocab}
    manifest = build(BuildConfig(output_dir=str(tmp_path / "out"), inputs=(corpus_slice,),
                                 max_seq_length=128, num_shards=2, num_workers=1, **kw))
    tokenizer = manifest["tokenizer"]
    assert tokenizer["kind"] == kind and tokenizer["vocab_size"] == VOCAB_SIZE
    assert tokenizer["special_token_ids"] == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    assert manifest["retention"] >= 0.99
    assert manifest["examples"] > 300
    counts = np.loadtxt(tmp_path / "out" / manifest["token_counts_file"], dtype=np.int64)
    assert counts.shape == (VOCAB_SIZE,)
    unk_rate = counts[1] / counts.sum()
    assert unk_rate < (0.002 if kind == "wordpiece" else 0.005), unk_rate


# ----------------------------------------------------------------------------- errors, CLI


def _learn(tmp_path, inputs, **kw):
    kw.setdefault("vocab_type", "wordpiece")
    kw.setdefault("vocab_size", 1000)
    kw.setdefault("max_sentences", 1000)
    kw.setdefault("output", str(tmp_path / "out" / "vocab.txt"))
    return vocab_learning.learn_vocab(inputs=inputs, do_lower_case=True, **kw)


def _one_line(e):
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_errors(tmp_path, corpus_slice):
    with pytest.raises(BuildError) as e:
        _learn(tmp_path, [corpus_slice], vocab_size=40)
    assert "--vocab_size=40" in _one_line(e)
    with pytest.raises(BuildError) as e:
        _learn(tmp_path, [corpus_slice], vocab_type="bpe")
    assert "--vocab_type=bpe" in _one_line(e)
    with pytest.raises(BuildError) as e:
        _learn(tmp_path, [corpus_slice], max_sentences=0)
    assert "--max_sentences=0" in _one_line(e)
    with pytest.raises(BuildError) as e:
        _learn(tmp_path, [str(tmp_path / "missing.txt")])
    assert "missing.txt" in _one_line(e)

    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n   \n\t\n", encoding="utf-8")
    for vocab_type in ("wordpiece", "sentencepiece"):
        with pytest.raises(BuildError) as e:
            _learn(tmp_path, [str(blank)], vocab_type=vocab_type)
        assert str(blank) in _one_line(e) and "no text" in str(e.value)

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for vocab_type in ("wordpiece", "sentencepiece"):
        with pytest.raises(BuildError) as e:
            _learn(tmp_path, [corpus_slice], vocab_type=vocab_type,
                   output=str(not_a_dir / "sub" / "v"))
        assert "--vocab_output" in _one_line(e) and str(not_a_dir) in str(e.value)

    # SentencePiece's own limits come back as one line naming --vocab_size.
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a small text.\nanother small line.\n", encoding="utf-8")
    with pytest.raises(BuildError) as e:
        _learn(tmp_path, [str(tiny)], vocab_type="sentencepiece", vocab_size=5000)
    msg = _one_line(e)
    assert msg.startswith("--vocab_size=5000: SentencePiece training failed: ")
    assert ".cc(" not in msg
    assert not os.path.exists(tmp_path / "out" / "vocab.txt.model")
    assert [n for n in os.listdir(tmp_path / "out") if n.startswith(".")] == []


def _cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return forked_cli.run(["-m", "tfrecord_builder", "learn_vocab", *args], env=env)


@pytest.mark.subprocess
def test_cli_missing_input(tmp_path):
    r = _cli("--input", "/nonexistent", "--vocab_output", str(tmp_path / "v.txt"))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "/nonexistent" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "v.txt")


@pytest.mark.subprocess
def test_cli_sentencepiece(tmp_path, corpus_slice):
    r = _cli("--input", corpus_slice, "--vocab_type", "sentencepiece", "--vocab_size", "500",
             "--max_sentences", "1500", "--vocab_output", str(tmp_path / "m" / "sp.model"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wrote {tmp_path / 'm' / 'sp.model'}"
    info = vocab_info(spm_model=str(tmp_path / "m" / "sp.model"))
    assert info.vocab_size == 500 and info.special_ids["[MASK]"] == 4
    assert os.path.exists(tmp_path / "m" / "sp.vocab")


# ----------------------------------------------------------------------------- remote paths


def _ram_root(name):
    import uuid
    return f"ram://{name}_{uuid.uuid4().hex}"


def _ram_files(root):
    import tensorflow as tf
    return sorted(os.path.join(d, n)[len(root) + 1:]
                  for d, _, names in tf.io.gfile.walk(root) for n in names)


def _ram_get(path):
    import tensorflow as tf
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("vocab_type", ["wordpiece", "sentencepiece"])
def test_learn_vocab_from_and_to_ram(vocab_type, corpus_slice, request, tmp_path, monkeypatch):
    """The corpus slice as a .gz input and the output directory on ram:// (as on gs://).
    WordPiece: the same vocab.txt, byte for byte, as learned from and to local paths.
    SentencePiece (whose multithreaded training is not bit-reproducible): a model and
    its .vocab from the same training, trained in a local staging directory that is gone
    afterwards. Either result builds from ram:// too; nothing local is named ram:."""
    import tempfile
    import tensorflow as tf
    from tfrecord_builder.build import BuildConfig, build
    monkeypatch.chdir(tmp_path)
    staging = tmp_path.parent / (tmp_path.name + "_staging")
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    root = _ram_root(f"test_learn_{vocab_type}")
    tf.io.gfile.makedirs(f"{root}/in")
    with open(corpus_slice, "rb") as f, tf.io.gfile.GFile(f"{root}/in/c.txt.gz", "wb") as g:
        g.write(gzip.compress(f.read()))
    path = vocab_learning.learn_vocab(inputs=[f"{root}/in"], output=f"{root}/out/",
                                      vocab_type=vocab_type, vocab_size=VOCAB_SIZE,
                                      do_lower_case=True, max_sentences=100_000)
    names = ["vocab.txt"] if vocab_type == "wordpiece" else ["spm.model", "spm.vocab"]
    assert path == f"{root}/out/{names[0]}"
    assert _ram_files(f"{root}/out") == names
    kind = {"spm_model": path} if vocab_type == "sentencepiece" else {"vocab_file": path}
    info = vocab_info(**kind)
    assert info.vocab_size == VOCAB_SIZE and info.special_ids["[MASK]"] == 4
    if vocab_type == "wordpiece":  # the same input and flags as the local fixture's
        with open(request.getfixturevalue("wordpiece_vocab"), "rb") as f:
            assert _ram_get(path) == f.read()
    else:
        import sentencepiece as spm
        proc = spm.SentencePieceProcessor(model_proto=_ram_get(path))
        pieces = [line.split("\t")[0]
                  for line in _ram_get(f"{root}/out/spm.vocab").decode().splitlines()]
        assert pieces == [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
    assert [n for n in os.listdir(staging) if n.startswith("learn_vocab-")] == []
    m = build(BuildConfig(output_dir=f"{root}/build", inputs=(f"{root}/in",), num_shards=2,
                          num_workers=1, **kind))
    assert m["tokenizer"]["vocab_size"] == VOCAB_SIZE and m["examples"] > 300
    assert os.listdir(tmp_path) == []
