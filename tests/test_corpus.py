"""Bad input: each case is either handled and counted in the manifest, or refused with
one line naming the file; never a traceback, never a malformed example."""

import gzip
import os

import pytest

from tfrecord_builder import BuildError
from tfrecord_builder.build import BuildConfig, build
from tfrecord_builder.corpus import Chunk, LineStats, clean_lines, expand_inputs, iter_file_chunks
from electra_tf.text import Tokenizer, vocab_info

import forked_cli
from conftest import VOCAB, WIKI, read_examples

GOOD = ("The quick brown fox jumps over the lazy dog.\n"
        "It was not amused by the dog at all.\n\n"
        "A second document starts here.\n"
        "It has two sentences.\n")


def _build(tmp_path, *inputs, **kw):
    kw.setdefault("num_workers", 1)
    kw.setdefault("num_shards", 2)
    out = tmp_path / "out"
    return build(BuildConfig(output_dir=str(out), inputs=tuple(map(str, inputs)),
                             vocab_file=VOCAB, **kw)), out


def _assert_well_formed(out, manifest):
    for ids, mask, segs in read_examples(str(out), manifest):
        n = int(mask.sum())
        assert ids[0] == 101 and ids[n - 1] == 102 and (ids[n:] == 0).all()
        assert (mask[:n] == 1).all() and (ids[:n] != 0).all()


def _count_tokens(text):
    lines = [l.strip() for l in text.split("\n") if l.strip()]
    return len(Tokenizer(vocab_info(VOCAB)).tokenize(lines)[0])


def test_invalid_utf8_and_nul_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(GOOD.encode() + b"caf\xe9 latin-1 line\n" + b"nul\x00byte line\n" +
                     "Final clean line.\n".encode())
    m, out = _build(tmp_path, path)
    assert m["skipped_lines"] == {"invalid_utf8": 1, "nul_bytes": 1}
    assert f"{path}:6: invalid_utf8" in m["skipped_line_examples"]
    assert f"{path}:7: nul_bytes" in m["skipped_line_examples"]
    assert m["corpus_tokens"] == _count_tokens(GOOD + "Final clean line.\n")
    _assert_well_formed(out, m)


def test_empty_file_is_listed_and_alone_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    good = tmp_path / "good.txt"
    good.write_text(GOOD)
    m, _ = _build(tmp_path, empty, good)
    assert m["empty_inputs"] == [str(empty)]
    assert m["corpus_tokens"] == _count_tokens(GOOD)
    with pytest.raises(BuildError) as e:
        _build(tmp_path / "x", empty)
    assert str(empty) in str(e.value) and "\n" not in str(e.value)


def test_only_blank_lines_is_refused(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n   \n\t\n\r\n" * 100)
    with pytest.raises(BuildError, match="blank.txt"):
        _build(tmp_path, blank)


def test_giant_line_without_newline(tmp_path):
    """A 10 MB line with no newline: split at spaces into bounded chunks (counted), every
    token kept, and memory stays bounded (chunks are at most 4 x chunk_bytes)."""
    with open(WIKI, encoding="utf-8") as f:
        words = " ".join(l.strip() for l in f if l.strip())
    text = (words + " ") * (10_000_000 // len(words) + 1)
    text = text[:10_000_000].rsplit(" ", 1)[0]
    path = tmp_path / "giant.txt"
    path.write_text(text, encoding="utf-8")  # no trailing newline
    chunks = list(iter_file_chunks(str(path), 0, 1 << 19))
    assert max(len(c.data) for c in chunks) <= 4 << 19
    assert b"".join(c.data for c in chunks) == path.read_bytes()
    m, out = _build(tmp_path, path)
    assert m["skipped_lines"]["long_line_split"] == len(chunks) - 1
    assert m["corpus_tokens"] == len(Tokenizer(vocab_info(VOCAB)).tokenize([text])[0])
    assert m["retention"] == 1.0
    assert m["examples"] > m["corpus_tokens"] / 126 - len(chunks) - 1


def test_word_longer_than_chunk_limit(tmp_path):
    """No space at all: cut on a UTF-8 character boundary, never inside a character."""
    path = tmp_path / "nospace.txt"
    path.write_text("é" * 300_000, encoding="utf-8")
    chunks = list(iter_file_chunks(str(path), 0, 1 << 16))
    assert len(chunks) > 1
    for c in chunks:
        c.data.decode("utf-8")  # every chunk is valid UTF-8 on its own
    m, out = _build(tmp_path, path, chunk_bytes=1 << 16)
    _assert_well_formed(out, m)


def test_windows_line_endings(tmp_path):
    unix = tmp_path / "unix.txt"
    unix.write_text(GOOD)
    dos = tmp_path / "dos.txt"
    dos.write_bytes(GOOD.replace("\n", "\r\n").encode())
    m_unix, out_unix = _build(tmp_path / "u", unix)
    m_dos, out_dos = _build(tmp_path / "d", dos)
    assert m_dos["documents"] == m_unix["documents"] == 2
    assert read_examples(str(out_dos), m_dos)[0][0].tolist() == \
        read_examples(str(out_unix), m_unix)[0][0].tolist()


def test_document_longer_than_many_examples(tmp_path):
    with open(WIKI, encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if l.strip()][:3000]
    path = tmp_path / "one_doc.txt"
    path.write_text("\n".join(lines) + "\n")
    m, out = _build(tmp_path, path, chunk_bytes=1 << 20)
    assert m["documents"] == 1 and m["examples"] > 500
    assert m["example_tokens"] == m["corpus_tokens"]
    _assert_well_formed(out, m)


def test_missing_path_and_empty_glob(tmp_path):
    with pytest.raises(BuildError, match="no such file or directory: /nope/x.txt"):
        expand_inputs(["/nope/x.txt"])
    with pytest.raises(BuildError, match=r"\*.zzz matches no files"):
        expand_inputs([str(tmp_path / "*.zzz")])


def test_unreadable_file(tmp_path):
    # /proc/self/mem opens but fails on read (EIO): an unreadable file even for root.
    with pytest.raises(BuildError) as e:
        _build(tmp_path, "/proc/self/mem")
    assert "cannot read /proc/self/mem" in str(e.value)
    if os.geteuid() != 0:
        locked = tmp_path / "locked.txt"
        locked.write_text(GOOD)
        locked.chmod(0)
        with pytest.raises(BuildError, match="locked.txt"):
            _build(tmp_path / "l", locked)


def test_truncated_gzip_names_the_file(tmp_path):
    data = gzip.compress((GOOD * 2000).encode())
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BuildError) as e:
        _build(tmp_path, path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_clean_lines_marks_documents():
    chunk = Chunk(0, 0, "x.txt", 10, b"a b\r\n  \r\nc\n\xff\n", False)
    stats = LineStats()
    assert clean_lines(chunk, stats) == ["a b", "", "c"]
    assert stats.lines == 4 and stats.skipped == {"invalid_utf8": 1}
    assert stats.examples_of_skips == ["x.txt:13: invalid_utf8"]


@pytest.mark.parametrize("content, needle", [
    (b"\n\n\n", "blank.txt"),
])
@pytest.mark.subprocess
def test_cli_bad_input_is_one_line(tmp_path, content, needle):
    path = tmp_path / "blank.txt"
    path.write_bytes(content)
    done = forked_cli.run(["-m", "tfrecord_builder", f"--input={path}",
                           f"--output_dir={tmp_path / 'o'}", "--num_workers=1"])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert needle in done.stderr.strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "o" / "manifest.json")


# ------------------------------------------------------------------ any filesystem


def _tree(make_dir, write):
    """The same small tree through `make_dir` / `write`: files, a hidden file, a hidden
    directory and a nested one."""
    for d in ("sub", "sub/deep", ".hid"):
        make_dir(d)
    for name, data in [("a.txt", GOOD), ("b.txt.gz", GOOD), (".dot.txt", GOOD),
                       ("sub/c.txt", GOOD), ("sub/deep/d.txt", GOOD), (".hid/e.txt", GOOD),
                       ("sub/f.log", GOOD)]:
        write(name, data.encode())


def test_expand_inputs_on_ram_equals_local(tmp_path, monkeypatch):
    """Directories, globs (hidden names skipped, `**` recursive) and files list the same
    files on ram:// as on a local disk, where they match glob.glob(recursive=True)."""
    import glob
    import uuid
    import tensorflow as tf
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "local"
    root = f"ram://test_corpus_{uuid.uuid4().hex}"

    def write_ram(name, data):
        with tf.io.gfile.GFile(f"{root}/{name}", "wb") as f:
            f.write(data)

    _tree(lambda d: (local / d).mkdir(parents=True),
          lambda name, data: (local / name).write_bytes(data))
    _tree(lambda d: tf.io.gfile.makedirs(f"{root}/{d}"), write_ram)
    cases = ["", "/*.txt", "/*", "/**", "/**/*.txt", "/s*/**/*.txt", "/sub/?.txt",
             "/.*", "/a.txt", "/sub"]
    for case in cases:
        got_local = expand_inputs([f"{local}{case}"])
        got_ram = expand_inputs([f"{root}{case}"])
        assert [p[len(str(local)):] for p in got_local] == \
            [p[len(root):] for p in got_ram], case
        if glob.has_magic(case):
            assert got_local == sorted(p for p in glob.glob(f"{local}{case}", recursive=True)
                                       if os.path.isfile(p)), case
    assert [p[len(root):] for p in expand_inputs([root])] == [
        "/.hid/e.txt", "/a.txt", "/b.txt.gz", "/sub/c.txt", "/sub/deep/d.txt", "/sub/f.log"]
    assert [p[len(root):] for p in expand_inputs([f"{root}/**/*.txt"])] == [
        "/a.txt", "/sub/c.txt", "/sub/deep/d.txt"]
    # Relative local paths come back absolute.
    assert expand_inputs(["local/sub/*.txt"]) == [str(local / "sub" / "c.txt")]
    with pytest.raises(BuildError, match=f"--input: no such file or directory: {root}/nope$"):
        expand_inputs([f"{root}/nope"])
    with pytest.raises(BuildError, match=r"--input: .*/\*\.zzz matches no files"):
        expand_inputs([f"{root}/*.zzz"])
    with pytest.raises(BuildError, match="--input: cannot list nosuchfs://b/x: .*nosuchfs"):
        expand_inputs(["nosuchfs://b/x"])
    assert sorted(os.listdir(tmp_path)) == ["local"]


def test_chunks_of_a_ram_file_equal_a_local_file(tmp_path):
    """Plain, .gz and .bz2 inputs on ram:// read into the same chunks as local copies."""
    import bz2
    import uuid
    import tensorflow as tf
    with open(WIKI, "rb") as f:
        text = f.read()[:200_000]
    root = f"ram://test_chunks_{uuid.uuid4().hex}"
    tf.io.gfile.makedirs(root)
    for name, data in [("w.txt", text), ("w.txt.gz", gzip.compress(text)),
                       ("w.txt.bz2", bz2.compress(text))]:
        (tmp_path / name).write_bytes(data)
        with tf.io.gfile.GFile(f"{root}/{name}", "wb") as f:
            f.write(data)
        local = list(iter_file_chunks(str(tmp_path / name), 0, 16384))
        remote = list(iter_file_chunks(f"{root}/{name}", 0, 16384))
        assert len(local) >= 3, name
        assert [(c.index, c.first_line, c.data, c.raw_pos) for c in remote] == \
            [(c.index, c.first_line, c.data, c.raw_pos) for c in local], name
        assert b"".join(c.data for c in remote) == text
    # A truncated .gz names the file, on one line.
    with tf.io.gfile.GFile(f"{root}/cut.txt.gz", "wb") as f:
        f.write(gzip.compress(text)[:5000])
    with pytest.raises(BuildError) as e:
        list(iter_file_chunks(f"{root}/cut.txt.gz", 0, 16384))
    assert f"cannot read {root}/cut.txt.gz" in str(e.value) and "\n" not in str(e.value)
