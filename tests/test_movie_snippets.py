"""experiments/movie_snippets.py on a small fake sdist of the same nested layout (no
network): parsing, the split, the files byte for byte, errors, the up-to-date skip."""

import hashlib
import io
import json
import os
import random
import subprocess
import tarfile
import uuid

import pytest
import tensorflow as tf

from electra_tf import fileio
from electra_tf.finetune import tasks
from ram_paths import forget
import experiment_scripts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


ms = experiment_scripts.load("movie_snippets")

# ID, mean rating, text (CRLF line ends, like the real file). sha256 order of the IDs:
# 8, 4, 3, 1, 7, 2, 6, 5; 3 is rated 0 and dropped, so dev_size=3 takes 8, 4 and 1.
LINES = ["1\t2.26666666667\tThe Rock is  destined to be  great.",
         "2\t-1.2\tDull and   long .",
         "3\t0.0\tIt is a film.",
         "4\t0.4\t Café  naïve \"charm\" ",
         "5\t-3.9\tThe worst.",
         "6\t1\tSix",
         "7\t-0.25\tSeven",
         "8\t-3\tEight  ends badly"]
TRAIN = "sentence\tlabel\nDull and long .\t0\nThe worst.\t0\nSix\t1\nSeven\t0\n"
DEV = ("sentence\tlabel\nThe Rock is destined to be great.\t1\nCafé naïve \"charm\"\t1\n"
       "Eight ends badly\t0\n")


def _tar(members):
    """A .tar.gz in memory of name -> bytes (None: a directory)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_sdist(tmp_path, lines=LINES, name="fake.tar.gz", ground_truth=None, extra=None):
    """(path, sha256) of a fake vaderSentiment sdist holding `lines` as the ground truth
    (and the members of `extra`)."""
    if ground_truth is None:
        ground_truth = "\r\n".join(lines).encode("utf-8")
    inner = _tar({"hutto_ICWSM_2014": None, "hutto_ICWSM_2014/_README_.txt": b"readme",
                  ms.MEMBER: ground_truth, **(extra or {})})
    data = _tar({"vaderSentiment-3.3.2/setup.py": b"", ms.INNER: inner})
    path = tmp_path / name
    path.write_bytes(data)
    return str(path), hashlib.sha256(data).hexdigest()


def test_parse_keeps_text_collapses_whitespace_and_labels():
    rows = ms.parse_ground_truth("\r\n".join(LINES) + "\r\n", "f.txt")
    assert [r.id for r in rows] == list(range(1, 9))
    assert rows[0] == ms.Example(1, 2.26666666667, "The Rock is destined to be great.")
    assert rows[3].text == "Café naïve \"charm\""
    assert [r.label for r in rows] == [1, 0, 0, 1, 0, 1, 0, 0]
    assert ms.parse_ground_truth("\ufeff9\t-1\ta\u00a0 b\n", "f")[0].text == "a b"


@pytest.mark.parametrize("line,problem", [
    ("3\t0.5", "expected 3 tab-separated fields (ID, mean rating, text), found 2"),
    ("3\t0.5\tto\tmany", "expected 3 tab-separated fields (ID, mean rating, text), found 4"),
    ("", "expected 3 tab-separated fields (ID, mean rating, text), found 1"),
    ("3\tgood\ttext", "rating 'good' is not a number"),
    ("3\tnan\ttext", "rating 'nan' is not a number"),
    ("x3\t1\ttext", "ID 'x3' is not a number"),
    ("3\t1\t   ", "empty text"),
    ("1\t1\ttext", "ID 1 is also on line 1"),
])
def test_malformed_line_names_the_file_and_line(line, problem):
    with pytest.raises(ms.ExperimentError) as e:
        ms.parse_ground_truth("\n".join(LINES[:2] + [line] + LINES[3:]), "gt.txt")
    assert str(e.value) == f"gt.txt:3: {problem}"


def test_split_is_deterministic_and_independent_of_line_order():
    examples = [ms.Example(i, 1.0 if i % 3 else -1.0, f"text {i}") for i in range(1, 501)]
    train, dev = ms.split(examples, 100)
    shuffled = list(examples)
    random.Random(0).shuffle(shuffled)
    assert ms.split(shuffled, 100) == (train, dev)
    assert len(dev) == 100 and len(train) == 400
    assert [e.id for e in dev] == sorted(e.id for e in dev)
    assert sorted(train + dev) == examples
    cut = max(hashlib.sha256(str(e.id).encode()).digest() for e in dev)
    assert all(hashlib.sha256(str(e.id).encode()).digest() > cut for e in train)
    for bad in (0, 500):
        with pytest.raises(ms.ExperimentError, match=rf"--dev_size={bad}: must be between "
                           r"1 and 499 \(there are 500 examples\)"):
            ms.split(examples, bad)


def test_prepare_writes_the_task_byte_for_byte(tmp_path, capsys):
    sdist, sha = make_sdist(tmp_path)
    out = str(tmp_path / "out")
    marker = ms.prepare(out, sdist, dev_size=3, sha256=sha)
    task_dir = tmp_path / "out" / "polarity"
    assert (task_dir / "train.tsv").read_bytes() == TRAIN.encode("utf-8")
    assert (task_dir / "dev.tsv").read_bytes() == DEV.encode("utf-8")
    assert sorted(os.listdir(task_dir)) == ["SOURCE.json", "dev.tsv", "train.tsv"]
    assert json.loads((task_dir / "SOURCE.json").read_text()) == marker
    assert marker["sha256"] == sha and marker["dev_size"] == 3
    assert marker["lines"] == 8 and marker["dropped_zero_rating"] == 1
    assert marker["counts"] == {"train": {"examples": 4, "positive": 1, "negative": 3},
                                "dev": {"examples": 3, "positive": 2, "negative": 1}}
    assert capsys.readouterr().out == (
        f"movie_snippets: wrote {task_dir}: train 4 (1 positive, 3 negative), dev 3 "
        "(2 positive, 1 negative); 1 of 8 snippets rated 0 dropped\n")
    # The project's fine-tuning reader takes it as the polarity task.
    rows = tasks.get_task("polarity").rows(out, "dev.tsv")
    assert rows.texts == [["The Rock is destined to be great.", "Café naïve \"charm\"",
                           "Eight ends badly"]] and rows.labels == [1, 1, 0]
    # Shuffled lines (LF ends, a final newline): the same files.
    lines = list(LINES)
    random.Random(1).shuffle(lines)
    other, other_sha = make_sdist(tmp_path, name="shuffled.tar.gz",
                                  ground_truth=("\n".join(lines) + "\n").encode())
    ms.prepare(str(tmp_path / "out2"), other, dev_size=3, sha256=other_sha)
    for name in ("train.tsv", "dev.tsv"):
        assert (tmp_path / "out2" / "polarity" / name).read_bytes() == \
            (task_dir / name).read_bytes()


def test_up_to_date_skips_and_other_dev_size_rewrites(tmp_path, capsys, monkeypatch):
    sdist, sha = make_sdist(tmp_path)
    out = str(tmp_path / "out")
    ms.prepare(out, sdist, dev_size=3, sha256=sha)
    dev = tmp_path / "out" / "polarity" / "dev.tsv"
    dev.write_text("untouched")
    capsys.readouterr()
    assert ms.prepare(out, sdist, dev_size=3, sha256=sha) is None
    assert dev.read_text() == "untouched"
    assert capsys.readouterr().out == (f"movie_snippets: {tmp_path / 'out' / 'polarity'} is "
                                       f"up to date (sha256 {sha[:12]}, dev_size 3)\n")
    assert ms.prepare(out, sdist, dev_size=2, sha256=sha)["counts"]["dev"]["examples"] == 2
    assert dev.read_text().count("\n") == 3
    # Up to date for the real sdist: no download at all.
    marker = tmp_path / "out" / "polarity" / "SOURCE.json"
    marker.write_text(json.dumps({"sha256": ms.SDIST_SHA256, "dev_size": 2000}))
    monkeypatch.setattr(ms, "download", lambda d: pytest.fail("downloaded"))
    assert ms.main([f"--out_dir={out}"]) == 0
    assert "is up to date" in capsys.readouterr().out


def test_failed_rewrite_never_leaves_a_complete_looking_task(tmp_path, monkeypatch):
    sdist, sha = make_sdist(tmp_path)
    out = str(tmp_path / "out")
    ms.prepare(out, sdist, dev_size=3, sha256=sha)
    write = fileio.write_atomic

    def failing(path, data, sync=False):
        if path.endswith("dev.tsv"):
            raise tf.errors.PermissionDeniedError(None, None, f"{path}; Permission denied")
        write(path, data, sync)
    monkeypatch.setattr(fileio, "write_atomic", failing)
    with pytest.raises(ms.ExperimentError) as e:
        ms.prepare(out, sdist, dev_size=2, sha256=sha)
    dev = os.path.join(out, "polarity", "dev.tsv")
    assert str(e.value) == f"cannot write {dev}: Permission denied"
    assert not os.path.exists(os.path.join(out, "polarity", "SOURCE.json"))


def test_sha256_mismatch_is_one_line(tmp_path, capsys):
    sdist, sha = make_sdist(tmp_path)
    out = tmp_path / "out"
    assert ms.main([f"--out_dir={out}", f"--sdist={sdist}"]) == 1
    assert capsys.readouterr().err == (f"movie_snippets: error: {sdist}: sha256 {sha} does "
                                       f"not match the expected {ms.SDIST_SHA256}\n")
    assert not out.exists()
    assert ms.main([f"--out_dir={out}", f"--sdist={tmp_path / 'nope.tar.gz'}"]) == 1
    missing = tmp_path / "nope.tar.gz"
    assert capsys.readouterr().err == (f"movie_snippets: error: cannot read {missing}: "
                                       "No such file or directory\n")


def test_malformed_and_missing_members_through_prepare(tmp_path, monkeypatch, capsys):
    sdist, sha = make_sdist(tmp_path, LINES[:4] + ["5\t-3.9"] + LINES[5:])
    monkeypatch.setattr(ms, "SDIST_SHA256", sha)
    assert ms.main([f"--out_dir={tmp_path / 'out'}", f"--sdist={sdist}"]) == 1
    assert capsys.readouterr().err == (f"movie_snippets: error: {ms.MEMBER}:5: expected 3 "
                                       "tab-separated fields (ID, mean rating, text), "
                                       "found 2\n")
    bad, bad_sha = make_sdist(tmp_path, name="bad.tar.gz",
                              ground_truth=b"1\t1\tok\n2\t1\t\xff\n")
    with pytest.raises(ms.ExperimentError, match=rf"^{ms.MEMBER}:2: not valid UTF-8$"):
        ms.prepare(str(tmp_path / "out"), bad, sha256=bad_sha)
    empty = tmp_path / "empty.tar.gz"
    empty.write_bytes(_tar({"vaderSentiment-3.3.2/setup.py": b""}))
    with pytest.raises(ms.ExperimentError, match=r"no readable .*hutto_ICWSM_2014.tar.gz"):
        ms.prepare(str(tmp_path / "out"), str(empty),
                   sha256=hashlib.sha256(empty.read_bytes()).hexdigest())


def test_ram_paths(tmp_path):
    root = f"ram://movie_snippets_{uuid.uuid4().hex}"
    try:
        sdist, sha = make_sdist(tmp_path)
        fileio.makedirs(root)
        fileio.write_atomic(f"{root}/sdist.tar.gz", open(sdist, "rb").read())
        ms.prepare(f"{root}/out", f"{root}/sdist.tar.gz", dev_size=3, sha256=sha)
        assert fileio.read_text(f"{root}/out/polarity/train.tsv") == TRAIN
        assert fileio.read_text(f"{root}/out/polarity/dev.tsv") == DEV
        assert fileio.listdir(f"{root}/out/polarity") == ["SOURCE.json", "dev.tsv",
                                                          "train.tsv"]
        assert ms.prepare(f"{root}/out", f"{root}/sdist.tar.gz", 3, sha) is None
    finally:
        forget(root)


@pytest.mark.subprocess
def test_download_runs_pip(tmp_path, monkeypatch):
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        if "ok" in command[-1]:
            open(os.path.join(command[-1], ms.SDIST_NAME), "wb").close()
            return subprocess.CompletedProcess(command, 0, "Saved\n", "")
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution "
                                           "found for vaderSentiment==3.3.2\n[notice] pip\n")
    monkeypatch.setattr(ms.subprocess, "run", run)
    (tmp_path / "ok").mkdir()
    assert ms.download(str(tmp_path / "ok")) == str(tmp_path / "ok" / ms.SDIST_NAME)
    assert calls[0][1:] == ["-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--disable-pip-version-check", "vaderSentiment==3.3.2", "-d",
                            str(tmp_path / "ok")]
    with pytest.raises(ms.ExperimentError) as e:
        ms.download(str(tmp_path))
    assert str(e.value) == ("pip download vaderSentiment==3.3.2 failed (exit 1): ERROR: No "
                            "matching distribution found for vaderSentiment==3.3.2")


def test_the_bundled_copy_is_the_scripts_output_with_its_counts():
    """data/movie_snippets/ (the fine-tuning demo's data) is this script's output for the
    real sdist: its SOURCE.json's counts hold for the files, and no sentence is in both."""
    root = os.path.join(REPO, "data", "movie_snippets")
    source = fileio.read_json(os.path.join(root, "polarity", "SOURCE.json"))
    assert source["sha256"] == ms.SDIST_SHA256 and source["dev_size"] == 2000
    sentences = {}
    for split in ("train", "dev"):
        with open(os.path.join(root, "polarity", f"{split}.tsv"), encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
        assert rows[0] == ["sentence", "label"]
        labels = [label for _, label in rows[1:]]
        assert {"examples": len(labels), "positive": labels.count("1"),
                "negative": labels.count("0")} == source["counts"][split]
        sentences[split] = {sentence for sentence, _ in rows[1:]}
    assert (len(sentences["train"]), len(sentences["dev"])) == (8566, 2000)  # 2 train snippets repeat
    assert not sentences["train"] & sentences["dev"]


def test_the_tweets_source_writes_its_own_member_as_a_task(tmp_path, capsys):
    """--source=tweets: the tweets' ground truth of the same sdist, the same layout and
    split rule, its own marker; the movies task beside it is not taken for it."""
    tweets = ["1\t2.5\tso happy today :)", "2\t-1.2\tworst. day. ever", "3\t0\tmeh",
              "4\t0.4\tok then", "5\t-3\tugh"]
    sdist, sha = make_sdist(tmp_path, extra={ms.SOURCES["tweets"].member:
                                             "\n".join(tweets).encode("utf-8")})
    out = str(tmp_path / "out")
    ms.prepare(out, sdist, dev_size=3, sha256=sha)  # the movies
    marker = ms.prepare(out, sdist, dev_size=1, sha256=sha, source="tweets")
    assert marker["member"] == "hutto_ICWSM_2014/tweets_GroundTruth.txt"
    assert marker["counts"] == {"train": {"examples": 3, "positive": 1, "negative": 2},
                                "dev": {"examples": 1, "positive": 1, "negative": 0}}
    train = (tmp_path / "out" / "polarity" / "train.tsv").read_text()
    assert train.splitlines()[0] == "sentence\tlabel" and "meh" not in train
    assert capsys.readouterr().out.endswith("1 of 5 tweets rated 0 dropped\n")
    assert ms.prepare(out, sdist, dev_size=1, sha256=sha, source="tweets") is None
    assert ms.SOURCES["tweets"].dev_size == 1000
    with pytest.raises(ms.ExperimentError, match="^--source=news: one of movies, tweets$"):
        ms.prepare(out, sdist, sha256=sha, source="news")
