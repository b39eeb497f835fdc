"""User TSV tasks: the column count of every row, the label set read from train.tsv
(rare labels warned of, dev labels confirmed against it), and GLUE's looser reading."""

import logging
import os

import pytest

from electra_tf.finetune import DataError
from electra_tf.finetune.tasks import get_task, rare_labels


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def rows(pairs):
    return "sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in pairs)


BALANCED = [(f"good film {i}", "pos") if i % 2 else (f"bad film {i}", "neg")
            for i in range(60)]


def test_a_row_with_another_column_count_names_file_and_line(tmp_path):
    d = str(tmp_path)
    train = f"{d}/mine/train.tsv"
    # Line 3 is blank: line numbers are the file's, as an editor shows them.
    write(train, "sentence\tlabel\ngood\tpos\n\nso so\tfilm\tneg\nbad\tneg\n")
    with pytest.raises(DataError) as e:
        get_task("mine", d, ["sentence"], "label")
    assert str(e.value) == (f"{train}:4: expected 2 tab-separated columns as the header "
                            "(line 1) has, found 3")
    write(train, "sentence\tlabel\ngood\tpos\nno label here\nbad\tneg\n")
    with pytest.raises(DataError) as e:
        get_task("mine", d, ["sentence"], "label")
    assert str(e.value) == (f"{train}:3: expected 2 tab-separated columns as the header "
                            "(line 1) has, found 1")
    # With --labels (no label inference) the same check runs where the file is read.
    task = get_task("mine", d, ["sentence"], "label", labels=["neg", "pos"])
    with pytest.raises(DataError, match=rf"^{train}:3: expected 2 tab-separated columns"):
        task.read(train)
    # The dev file too.
    write(train, rows(BALANCED))
    write(f"{d}/mine/dev.tsv", "sentence\tlabel\ngood\tpos\nbad\tneg\textra\n")
    with pytest.raises(DataError) as e:
        get_task("mine", d, ["sentence"], "label")
    assert str(e.value) == (f"{d}/mine/dev.tsv:3: expected 2 tab-separated columns as the "
                            "header (line 1) has, found 3")


def test_glue_files_keep_reading_rows_wider_than_the_columns_used(tmp_path):
    """GLUE's own files have rows of other widths: as before, a row needs only the
    columns that are read."""
    d = str(tmp_path)
    write(f"{d}/SST-2/train.tsv", "sentence\tlabel\ngood\t1\nbad\t0\tnote\n")
    task = get_task("sst2", d)
    rows = task.read(f"{d}/SST-2/train.tsv")
    assert rows.texts == [["good", "bad"]] and rows.labels == [1, 0]
    assert rows.name == "train.tsv" and rows.ids is None
    assert task.labels_from is None and task.label_names() == ("0", "1")


def test_rare_label_rule():
    assert rare_labels({"pos": 500, "neg": 480, "Pos": 4}) == ["Pos"]  # < 1% of 500
    assert rare_labels({"pos": 500, "neg": 480, "mixed": 5}) == []  # 1% exactly: kept
    assert rare_labels({"pos": 30, "neg": 29, "maybe": 1}) == ["maybe"]  # a singleton
    assert rare_labels({"pos": 9, "neg": 8, "maybe": 1}) == []  # too few rows to tell
    assert rare_labels({"a": 1, "b": 1}) == []
    assert rare_labels({"a": 1000, "c": 2, "b": 1}) == ["b", "c"]  # rarest first


def test_inferred_labels_warn_of_a_rare_label_with_its_count_and_first_line(tmp_path,
                                                                           caplog):
    d = str(tmp_path)
    train = f"{d}/mine/train.tsv"
    pairs = list(BALANCED)
    pairs.insert(6, ("so so film", "maybe"))  # line 8 (header, then rows 2..)
    write(train, rows(pairs))
    caplog.set_level(logging.INFO, logger="absl")
    task = get_task("mine", d, ["sentence"], "label")
    assert task.labels == ("maybe", "neg", "pos") and task.labels_from == train
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"Task mine: label 'maybe' has only 1 of 61 rows (first at {train}:8; 'pos' has 30): "
        "a typo or a shifted column? If it is not a class, fix those rows or give the "
        "labels with --labels=neg,pos (then any other label is an error naming its line)"]
    caplog.clear()
    write(train, rows(BALANCED))
    assert get_task("mine", d, ["sentence"], "label").labels == ("neg", "pos")
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_dev_label_unseen_in_training_names_the_dev_file_line_and_label(tmp_path):
    d = str(tmp_path)
    train, dev = f"{d}/mine/train.tsv", f"{d}/mine/dev.tsv"
    write(train, rows(BALANCED))
    write(dev, "sentence\tlabel\ngood\tpos\n\nmeh\tmaybe\nbad\tneg\n")
    with pytest.raises(DataError) as e:
        get_task("mine", d, ["sentence"], "label")
    assert str(e.value) == (f"{dev}:4: label 'maybe' does not occur in {train}, whose "
                            "labels are neg, pos; fix the row, or list every label with "
                            "--labels")
    # Given labels: the dev file is read later, with the message of a fixed label set.
    task = get_task("mine", d, ["sentence"], "label", labels=["neg", "pos"])
    with pytest.raises(DataError) as e:
        task.eval_splits(d, None, 8)
    assert str(e.value) == f"{dev}:4: label 'maybe' is not one of neg, pos"
    # A dev file that is not there yet is reported where it is read, as before.
    os.remove(dev)
    assert get_task("mine", d, ["sentence"], "label").labels == ("neg", "pos")


def test_an_empty_inferred_label_is_an_error(tmp_path):
    d = str(tmp_path)
    write(f"{d}/mine/train.tsv", "sentence\tlabel\ngood\tpos\nbad\t \n")
    with pytest.raises(DataError) as e:
        get_task("mine", d, ["sentence"], "label")
    assert str(e.value) == f"{d}/mine/train.tsv:3: empty label (column 'label')"
