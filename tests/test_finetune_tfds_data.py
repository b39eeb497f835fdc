"""electra_tf.finetune.tfds_data: GLUE and SQuAD from locally prepared tensorflow-datasets.

The real `glue` and `squad` TFDS builders are prepared, with no network, from tiny GLUE
TSVs and SQuAD JSONs in a temporary folder (a subclass only points their split
generators at those files), so the tfds rows must equal what the file readers make.
"""

import dataclasses
import functools
import json
import os
import sys

import numpy as np
import pytest

from electra_tf.configs import apply_overrides
from electra_tf.configs import ModelConfig
from electra_tf.finetune import DataError
from electra_tf.finetune.squad import read_squad
from electra_tf.finetune.tasks import get_task
from electra_tf.text import TextEncoder
from electra_tf.training.options import FinetuneOptions
from electra_tf.finetune.trainer import FinetuneConfig, run

tfds = pytest.importorskip("tensorflow_datasets")
from electra_tf.finetune import tfds_data  # noqa: E402

VOCAB = "data/vocab/bert_uncased_vocab.txt"
TINY = ModelConfig(vocab_size=30522, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)

POS, NEG = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "dull"]


def _sst2(n, seed, test=False):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = int(rng.integers(2))
        word = str(rng.choice(POS if label else NEG))
        text = f"the film was {word} and \"quoted\" , it's {i}"
        rows.append(f"{i}\t{text}" if test else f"{text}\t{label}")
    return ("index\tsentence\n" if test else "sentence\tlabel\n") + "\n".join(rows) + "\n"


# GLUE layouts, each file as the GLUE download has it (CoLA train/dev without header).
GLUE_FILES = {
    "SST-2/train.tsv": _sst2(48, 0),
    "SST-2/dev.tsv": _sst2(12, 1),
    "SST-2/test.tsv": _sst2(7, 2, test=True),
    "CoLA/train.tsv": "gj04\t1\t\tthe book is red .\ngj04\t0\t*\tbook the red is .\n"
                      "cj99\t1\t\tshe left .\n",
    "CoLA/dev.tsv": "gj04\t0\t*\tleft she .\ngj04\t1\t\the sings .\n",
    "CoLA/test.tsv": "index\tsentence\n0\twe ran .\n1\tran we .\n",
    "STS-B/train.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1"
                       "\tsentence2\tscore\n"
                       "0\tmain\tf\t2012\t1\tnone\tnone\ta plane takes off\tan air plane "
                       "departs\t5.000\n"
                       "1\tmain\tf\t2012\t4\tnone\tnone\ta man plays\ta dog runs\t0.600\n"
                       "2\tmain\tf\t2012\t7\tnone\tnone\ttwo cats\tcats , two\t3.8\n",
    "STS-B/dev.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1"
                     "\tsentence2\tscore\n0\tmain\tf\t2012\t1\tnone\tnone\ta b\tc d\t2.500\n",
    "STS-B/test.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1"
                      "\tsentence2\n0\tmain\tf\t2012\t1\tnone\tnone\tx y\tz\n",
    "MNLI/train.tsv": "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
                      "0\t1\t1e\tgov\ta man sleeps\ta person rests\tentailment\tentailment\n"
                      "1\t2\t2c\tgov\ta dog barks\ta cat meows\tcontradiction\tcontradiction\n"
                      "2\t3\t3n\tgov\tit rains\tit is cold\tneutral\tneutral\n"
                      "3\t4\t4e\tgov\tkids play\tchildren play\tentailment\tentailment\n",
    "MNLI/dev_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\t"
                            "label2\tgold_label\n0\t1\t1\tgov\tx\ty\tneutral\tneutral\tneutral\n"
                            "1\t2\t2\tgov\tz\tw\tentailment\tentailment\tentailment\n",
    "MNLI/dev_mismatched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\t"
                               "gold_label\n0\t1\t1\tfic\tp\tq\tcontradiction\tcontradiction\n",
    "MNLI/test_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\n"
                             "0\t1\t1\tgov\tone\ttwo\n1\t2\t2\tgov\tthree\tfour\n",
    "MNLI/test_mismatched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\n"
                                "0\t1\t1\tfic\tfive\tsix\n",
    "diagnostic/diagnostic.tsv": "index\tsentence1\tsentence2\n0\tthe cat sat\tthe cat sits\n"
                                 "1\tno one\tsomeone\n2\ta\tb\n",
}
# tfds config -> {tfds split: (GLUE file, the generator's split argument)}
GLUE_SPLITS = {
    "sst2": {"train": ("SST-2/train.tsv", "train"), "validation": ("SST-2/dev.tsv", "dev"),
             "test": ("SST-2/test.tsv", "test")},
    "cola": {"train": ("CoLA/train.tsv", "train"), "validation": ("CoLA/dev.tsv", "dev"),
             "test": ("CoLA/test.tsv", "test")},
    "stsb": {"train": ("STS-B/train.tsv", "train"), "validation": ("STS-B/dev.tsv", "dev"),
             "test": ("STS-B/test.tsv", "test")},
    "mnli": {"train": ("MNLI/train.tsv", "train"),
             "validation_matched": ("MNLI/dev_matched.tsv", "dev"),
             "validation_mismatched": ("MNLI/dev_mismatched.tsv", "dev"),
             "test_matched": ("MNLI/test_matched.tsv", "test"),
             "test_mismatched": ("MNLI/test_mismatched.tsv", "test")},
    "ax": {"test": ("diagnostic/diagnostic.tsv", "test")},
}


def _squad(v2):
    ctx1 = "Paris is the capital of France . It lies on the Seine ."
    ctx2 = "The Nile is a river in Africa , about 6650 km long ."
    qas1 = [{"id": "q1", "question": "What is the capital of France?",
             "answers": [{"text": "Paris", "answer_start": 0}]},
            {"id": "q2", "question": "Which river?",
             "answers": [{"text": "the Seine", "answer_start": ctx1.index("the Seine")}]}]
    qas2 = [{"id": "q3", "question": "How long is the Nile?",
             "answers": [{"text": "6650 km", "answer_start": ctx2.index("6650")}]}]
    if v2:
        for qa in qas1 + qas2:
            qa["is_impossible"] = False
        qas2.append({"id": "q4", "question": "Who built the Nile?", "answers": [],
                     "is_impossible": True,
                     "plausible_answers": [{"text": "Africa",
                                            "answer_start": ctx2.index("Africa")}]})
    dev = [{"id": "d1", "question": "Where is the Nile?",
            "answers": [{"text": "Africa", "answer_start": ctx2.index("Africa")},
                        {"text": "in Africa", "answer_start": ctx2.index("in Africa")}]}]
    if v2:
        dev[0]["is_impossible"] = False
        dev.append({"id": "d2", "question": "Who is the king?", "answers": [],
                    "is_impossible": True})
    train = {"version": "x", "data": [
        {"title": "France", "paragraphs": [{"context": ctx1, "qas": qas1}]},
        {"title": "Nile", "paragraphs": [{"context": ctx2, "qas": qas2}]}]}
    dev = {"version": "x", "data": [{"title": "Nile", "paragraphs": [
        {"context": ctx2, "qas": dev}]}]}
    return train, dev


@functools.lru_cache(maxsize=None)
def _local_builders():
    """Subclasses of the real glue / squad builders that read local files. Not registered:
    the registered builders are what `tfds.builder` later opens the prepared data with."""
    from tensorflow_datasets.datasets.squad.squad_dataset_builder import Builder as Squad
    from tensorflow_datasets.datasets.squad.squad_dataset_builder import \
        _v2_features as squad_features_v2
    from tensorflow_datasets.question_answering import qa_utils
    from tensorflow_datasets.text.glue import Glue

    with tfds.core.registered.skip_registration():
        class LocalGlue(Glue):
            name = "glue"
            source = None

            def _split_generators(self, dl_manager):
                del dl_manager  # nothing is downloaded
                return {split: self._generate_examples(os.path.join(self.source, f), kind)
                        for split, (f, kind) in GLUE_SPLITS[self.builder_config.name].items()}

        class LocalSquad(Squad):
            name = "squad"
            source = None

            def _info(self):  # the real one also reads README / citation files beside it
                v2 = self.builder_config.name == "v2.0"
                return tfds.core.DatasetInfo(builder=self, features=(
                    squad_features_v2() if v2 else qa_utils.squadlike_features()))

            def _split_generators(self, dl_manager):
                del dl_manager
                return {split: self._generate_examples(os.path.join(self.source, f))
                        for split, f in (("train", "train.json"), ("validation", "dev.json"))}

    return LocalGlue, LocalSquad


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(GLUE + squad files dir, tfds data dir) with glue/{sst2,cola,stsb,mnli,ax} and
    squad/{v1.1,v2.0} prepared from the files."""
    tfds.disable_progress_bar()
    root = tmp_path_factory.mktemp("finetune_tfds")
    files, data_dir = str(root / "files"), str(root / "tfds")
    for name, text in GLUE_FILES.items():
        os.makedirs(os.path.dirname(os.path.join(files, name)), exist_ok=True)
        with open(os.path.join(files, name), "w", encoding="utf-8") as f:
            f.write(text)
    for v2 in (False, True):
        folder = os.path.join(files, "squad_v2" if v2 else "squad_v1", "squad")
        os.makedirs(folder)
        for split, tree in zip(("train", "dev"), _squad(v2)):
            with open(os.path.join(folder, f"{split}.json"), "w") as f:
                json.dump(tree, f)
    no_stats = tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP)
    glue, squad = _local_builders()
    for config in GLUE_SPLITS:
        builder = glue(config=config, data_dir=data_dir)
        builder.source = files
        builder.download_and_prepare(download_config=no_stats)
    for config, folder in (("v1.1", "squad_v1"), ("v2.0", "squad_v2")):
        builder = squad(config=config, data_dir=data_dir)
        builder.source = os.path.join(files, folder, "squad")
        builder.download_and_prepare(download_config=no_stats)
    return files, data_dir


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(VOCAB)


def _same(a, b):
    assert a.num_examples == b.num_examples
    assert sorted(a.arrays) == sorted(b.arrays)
    for k in a.arrays:
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k], err_msg=k)
    assert a.meta == b.meta


def test_glue_rows_equal_the_tsv_rows(prepared, encoder):
    files, data_dir = prepared
    for name in ("sst2", "cola", "stsb", "mnli"):
        task = get_task(name, files)
        source = tfds_data.from_tfds(task, data_dir)
        assert isinstance(source, tfds_data.TfdsGlueTask) and source.name == task.name
        for file in (task.train_file,) + task.dev_files:
            mine, theirs = source.rows(files, file), task.rows(files, file)
            assert mine.texts == theirs.texts and mine.labels == pytest.approx(theirs.labels)
        # What training and evaluation consume: order doubling and packing included.
        _same(source.train_split(files, encoder, 16), task.train_split(files, encoder, 16))
        for a, b in zip(source.eval_splits(files, encoder, 16),
                        task.eval_splits(files, encoder, 16)):
            _same(a, b)
        tests = source.test_splits(files, encoder, 16)
        want = task.test_splits(files, encoder, 16)
        assert [t.name for t in tests] == [t.name for t in want]
        for a, b in zip(tests, want):
            _same(a, b)

    # The values themselves: MNLI's tfds class order differs from ours, by name.
    mnli = tfds_data.from_tfds(get_task("mnli"), data_dir)
    rows = mnli.rows(None, "train.tsv")
    assert rows.texts == [["a man sleeps", "a dog barks", "it rains", "kids play"],
                          ["a person rests", "a cat meows", "it is cold", "children play"]]
    assert [mnli.labels[i] for i in rows.labels] == ["entailment", "contradiction", "neutral",
                                                     "entailment"]
    assert rows.name == "glue/mnli:train"
    assert [d.name for d in mnli.eval_splits(None, encoder, 16)] == [
        "glue/mnli:validation_matched", "glue/mnli:validation_mismatched"]
    tests = mnli.test_splits(None, encoder, 16)
    assert [(t.name, t.meta) for t in tests] == [
        ("MNLI-m", ["0", "1"]), ("MNLI-mm", ["0"]), ("AX", ["0", "1", "2"])]
    stsb = tfds_data.from_tfds(get_task("stsb"), data_dir).rows(None, "train.tsv")
    assert stsb.labels == pytest.approx([1.0, 0.12, 0.76]) and stsb.texts[1][2] == "cats , two"
    cola = tfds_data.from_tfds(get_task("cola"), data_dir).rows(None, "dev.tsv")
    assert cola.texts == [["left she .", "he sings ."]] and cola.labels == [0, 1]
    sst2 = tfds_data.from_tfds(get_task("sst2"), data_dir).test_rows(
        None, get_task("sst2").test_files[0])
    assert sst2.ids == [str(i) for i in range(7)]
    assert sst2.texts[0][3] == GLUE_FILES["SST-2/test.tsv"].splitlines()[4].split("\t")[1]
    assert sst2.texts[0][3].endswith("and \"quoted\" , it's 3")


def _rows(data):
    """A split's windows as a sorted list of rows (tfds and JSON order questions apart)."""
    keys = sorted(data.arrays)
    return sorted(tuple(tuple(np.ravel(data.arrays[k][i]).tolist()) for k in keys)
                  for i in range(data.num_examples))


def test_squad_examples_equal_the_json_reader(prepared, encoder):
    files, data_dir = prepared
    for v2 in (False, True):
        task = dataclasses.replace(get_task("squad_v2" if v2 else "squad_v1"),
                                   max_query_length=8, doc_stride=8)
        root = os.path.join(files, task.name)  # holds squad/{train,dev}.json
        source = tfds_data.from_tfds(task, data_dir)
        assert isinstance(source, tfds_data.TfdsSquadTask) and source.v2 == v2
        for split, file, training in (("train", "train.json", True),
                                      ("dev", "dev.json", False)):
            got = {ex.qid: ex for ex in source.read_examples(None, split, training)[0]}
            want = {ex.qid: ex for ex in read_squad(os.path.join(root, "squad", file),
                                                    training, v2)}
            assert got == want
        assert sorted(got) == (["d1", "d2"] if v2 else ["d1"])
        assert got["d1"].answers == ("Africa", "in Africa")
        if v2:
            assert got["d2"].is_impossible and got["d2"].answers == ()
        train = source.train_split(None, encoder, 32)
        assert train.num_examples == (4 if v2 else 3) and train.name.endswith(":train")
        assert _rows(train) == _rows(task.train_split(root, encoder, 32))
        (dev,) = source.eval_splits(None, encoder, 32)
        assert _rows(dev) == _rows(task.eval_splits(root, encoder, 32)[0])
        assert sorted(ex.qid for ex in dev.meta.examples) == sorted(got)


@pytest.mark.e2e
def test_training_from_tfds_equals_training_from_the_tsvs(prepared, tmp_path):
    files, data_dir = prepared
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=1e-3, num_train_epochs=2,
                                                 train_batch_size=8, eval_batch_size=8,
                                                 max_seq_length=16, steps_per_loop=12))
    results = {}
    for source in ("files", "tfds"):
        task = get_task("sst2", files)
        if source == "tfds":
            task = tfds_data.from_tfds(task, data_dir)
        options = FinetuneOptions(data_dir=files, model_dir=str(tmp_path / source),
                             vocab_file=VOCAB, strategy="cpu", jit_compile=False,
                             do_predict=True)
        results[source] = run(task, TINY, cfg, options)
    assert results["tfds"]["num_train_steps"] == results["files"]["num_train_steps"] == 12
    assert results["tfds"]["scores"] == results["files"]["scores"]
    assert results["tfds"]["trials"][0]["loss"] == results["files"]["trials"][0]["loss"]
    paths = [results[s]["predictions"]["SST-2"] for s in ("files", "tfds")]
    texts = [open(p).read() for p in paths]
    assert texts[0] == texts[1] and texts[0].startswith("index\tprediction\n0\t")
    assert paths[1] == str(tmp_path / "tfds" / "predictions" / "SST-2.tsv")


def test_missing_data_is_one_line_naming_dataset_dir_and_fix(prepared, encoder, tmp_path):
    files, data_dir = prepared
    empty = str(tmp_path / "empty")
    task = tfds_data.from_tfds(get_task("rte"), empty)
    with pytest.raises(DataError) as e:
        task.train_split(None, encoder, 16)
    msg = str(e.value)
    assert "\n" not in msg and "glue/rte" in msg and empty in msg
    assert f"tfds build glue/rte --data_dir {empty}" in msg and "never downloads" in msg
    with pytest.raises(DataError, match="squad/v2.0 is not prepared"):
        tfds_data.from_tfds(get_task("squad_v2"), empty).eval_splits(None, encoder, 64)
    # A prepared dataset without the split asked for names the splits it has.
    with pytest.raises(DataError, match=r"glue/ax.*no split 'train' \(splits: test\)"):
        tfds_data.read_split("glue/ax", data_dir, "train")
    # AX is optional: an unprepared glue/ax just means no AX predictions.
    partial = tfds_data.from_tfds(get_task("mnli"), empty)
    assert partial.test_rows(None, get_task("mnli").test_files[2]) is None
    with pytest.raises(DataError, match="has no tensorflow-datasets source"):
        tfds_data.from_tfds(get_task("polarity"), data_dir)


def test_missing_tensorflow_datasets(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(DataError, match=r"needs tensorflow-datasets: pip install -e \.\[tfds\]"):
        tfds_data.open_builder("glue/sst2", str(tmp_path))


def test_data_source_flags():
    from electra_tf.configs import ConfigError
    from electra_tf.finetune.cli import use_tfds
    assert use_tfds("auto", "/x") and not use_tfds("auto", None)
    assert use_tfds("tfds", None) and not use_tfds("files", None)
    with pytest.raises(ConfigError, match="contradicts --data_source=files"):
        use_tfds("files", "/x")
