"""experiments/npm_corpus.py on a small fake npm tarball of the same layout (no network):
sentence splitting, document order, the file byte for byte, its record, the one-line errors,
the up-to-date skip, a remote (ram://) output."""

import io
import json
import tarfile
import uuid

import pytest

from electra_tf import fileio
from ram_paths import forget
import experiment_scripts

nc = experiment_scripts.load("npm_corpus")


def _tarball(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            raw = data if isinstance(data, bytes) else json.dumps(data).encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


FILES = {
    "package/LICENSE": b"Apache-2.0",
    "package/data/file_list.json": ["1790_a.json", "1801_b.json"],
    "package/data/1801_b.json": {"year": 1801, "text": "Second address.  It ends here!"},
    "package/data/1790_a.json": {"year": 1790, "text": "Fellow-Citizens: we meet. Mr. Smith "
                                 "spoke (briefly).\n\n\"Is it so?\" It is. \u201cYes.\u201d "
                                 "Done."},
    "package/data/1795_empty.json": {"year": 1795, "text": "  \n "},
}
TEXT = ("Fellow-Citizens: we meet.\nMr.\nSmith spoke (briefly).\n\"Is it so?\"\nIt is.\n"
        "\u201cYes.\u201d\nDone.\n\nSecond address.\nIt ends here!\n")


def test_sentences_split_at_ends_and_keep_closers():
    assert nc.sentences("One. Two! \"Three?\" Four.\n\n  five six. Seven") == [
        "One.", "Two!", "\"Three?\"", "Four.", "five six.", "Seven"]
    assert nc.sentences("a.b and 3.5 stay. (Quoted) starts") == ["a.b and 3.5 stay.",
                                                                    "(Quoted) starts"]


def test_prepare_writes_the_documents_in_order_and_skips_when_up_to_date(tmp_path):
    data = _tarball(FILES)
    path = tmp_path / "t.tgz"
    path.write_bytes(data)
    out = tmp_path / "out"
    marker = nc.prepare("sotu", str(out), str(path), nc.integrity_of(data))
    assert (out / "sotu.txt").read_text(encoding="utf-8") == TEXT
    assert marker["documents"] == 2 and marker["lines"] == 9 and marker["words"] == 19
    assert json.loads((out / "sotu.SOURCE.json").read_text())["integrity"] == \
        nc.integrity_of(data)
    assert "PDDL" in marker["licence"] and marker["url"].startswith("https://registry.npmjs")
    assert nc.prepare("sotu", str(out), str(path), nc.integrity_of(data)) is None


def test_remote_output(tmp_path):
    data = _tarball(FILES)
    path = tmp_path / "t.tgz"
    path.write_bytes(data)
    out = f"ram://npm-corpus-{uuid.uuid4().hex}"
    try:
        nc.prepare("moby_dick", out, str(path), nc.integrity_of(data))
    except nc.CorpusError as e:  # the fake's records order by year, not chapter
        assert "'chapter'" in str(e)
    good = _tarball({"package/data/chapter_2.json": {"chapter": "2", "text": "B."},
                     "package/data/chapter_10.json": {"chapter": "10", "text": "C."},
                     "package/data/extracts.json": {"chapter": "extracts", "text": "X."},
                     "package/data/chapter_1.json": {"chapter": "1", "text": "A."}})
    path.write_bytes(good)
    try:
        nc.prepare("moby_dick", out, str(path), nc.integrity_of(good))
        assert fileio.read_text(fileio.join(out, "moby_dick.txt")) == "A.\n\nB.\n\nC.\n\nX.\n"
    finally:
        forget(out)


@pytest.mark.parametrize("case, message", [
    ("integrity", "does not match the expected sha512-"),
    ("json", "t.tgz!package/data/bad.json: not a JSON object with 'text' and 'year'"),
    ("empty", "t.tgz: no package/data/*.json in the tarball"),
    ("not_tar", "t.tgz: not a readable tarball"),
    ("corpus", "--corpus=nope: expected one of sotu, moby_dick"),
])
def test_one_line_errors(tmp_path, case, message):
    files = {"json": {"package/data/bad.json": b"{not json"},
             "empty": {"package/README.md": b"x"}}.get(case, FILES)
    data = b"not a tarball" if case == "not_tar" else _tarball(files)
    path = tmp_path / "t.tgz"
    path.write_bytes(data)
    want = "sha512-nothing" if case == "integrity" else nc.integrity_of(data)
    with pytest.raises(nc.CorpusError) as e:
        nc.prepare("nope" if case == "corpus" else "sotu", str(tmp_path / "out"), str(path),
                   want)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out" / "sotu.txt").exists()
    assert nc.main(["--corpus=sotu"]) == 1  # a missing flag: one line, exit 1
