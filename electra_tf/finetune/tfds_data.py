"""GLUE and SQuAD from tensorflow-datasets prepared on disk (`glue/<task>`, `glue/ax`,
`squad/v1.1`, `squad/v2.0`; never downloaded) as the rows the TSV / JSON readers make, in
the files' order (GLUE: by `idx`), so both sources train identically (`from_tfds`)."""

import dataclasses
import functools
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from electra_tf.finetune import DataError
from electra_tf.finetune.base_task import Task
from electra_tf.finetune.qa_task import SquadTask
from electra_tf.finetune.squad import parse_squad_tree
from electra_tf.finetune.tasks import Rows, SubmissionFile, TsvTask

# The tfds feature of each text column, in the TSV task's column order.
GLUE_FEATURES: Dict[str, Tuple[str, ...]] = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
}
# GLUE file -> tfds split; AX (diagnostic.tsv) is the `test` split of glue/ax.
GLUE_SPLITS = {"train.tsv": "train", "dev.tsv": "validation",
               "dev_matched.tsv": "validation_matched",
               "dev_mismatched.tsv": "validation_mismatched", "test.tsv": "test",
               "test_matched.tsv": "test_matched", "test_mismatched.tsv": "test_mismatched",
               "diagnostic.tsv": "test"}
READ_BATCH = 1024


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and (e.name or "").startswith(
                "tensorflow_datasets"):
            raise DataError("--data_source=tfds needs tensorflow-datasets: "
                            "pip install -e .[tfds]") from None
        raise DataError(f"--data_source=tfds: cannot import tensorflow-datasets: "
                        f"{_one_line(e)}") from None
    tfds.disable_progress_bar()
    return tfds


def _label(name: str, data_dir: Optional[str]) -> str:
    return f"tfds {name} (data dir {data_dir or 'the TFDS default'})"


@functools.lru_cache(maxsize=32)
def open_builder(name: str, data_dir: Optional[str]):
    """The prepared builder of `name` in `data_dir` (None: TFDS's default), else a DataError
    saying how to prepare it. Never downloads (no GCS either)."""
    tfds = _import_tfds()
    kwargs = {"data_dir": os.fspath(data_dir)} if data_dir else {}
    try:
        builder = tfds.builder(name, try_gcs=False, **kwargs)
    except Exception as e:  # unknown name or config, unreadable dataset_info.json, ...
        raise DataError(f"{_label(name, data_dir)}: {_one_line(e)}") from None
    try:
        root = str(builder.data_dir_root)
        prepared = builder.is_prepared()
    except Exception:
        root, prepared = data_dir or "the TFDS default data dir", False
    if not prepared:
        raise DataError(f"tfds dataset {name} is not prepared in {root} (no "
                        f"{builder.data_dir}): prepare it first with `tfds build {name} "
                        f"--data_dir {root}`; fine-tuning never downloads")
    return builder


def read_split(name: str, data_dir: Optional[str], split: str) -> Dict[str, list]:
    """Every feature of a split as lists (nested ones as 'a/b', strings as bytes), stored order."""
    tfds = _import_tfds()
    builder = open_builder(name, data_dir)
    if split not in builder.info.splits:
        raise DataError(f"{_label(name, data_dir)} has no split {split!r} (splits: "
                        f"{', '.join(sorted(builder.info.splits.keys())) or 'none'})")
    read_config = tfds.ReadConfig(interleave_cycle_length=1, try_autocache=False)
    columns: Dict[str, list] = {}

    def add(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                add(f"{prefix}{k}/", v)
        else:
            as_list = value.to_list() if isinstance(value, tf.RaggedTensor) else \
                value.numpy().tolist()
            columns.setdefault(prefix[:-1], []).extend(as_list)

    try:
        ds = builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
        for batch in ds.ragged_batch(READ_BATCH):
            add("", batch)
    except (tf.errors.OpError, OSError, ValueError) as e:
        raise DataError(f"{_label(name, data_dir)}: cannot read split {split}: "
                        f"{_one_line(getattr(e, 'message', e))}") from None
    return columns


def _text(values: list, where: str) -> List[str]:
    try:
        return [v.decode("utf-8") for v in values]
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: text that is not UTF-8 ({e.reason})") from None


# --------------------------------------------------------------------------- GLUE

@dataclasses.dataclass(frozen=True)
class TfdsGlueTask(TsvTask):
    """A GLUE TsvTask whose splits come from `glue/<name>` (and AX from `glue/ax`)."""
    tfds_data_dir: Optional[str] = None

    def _dataset(self, file: str) -> Tuple[str, str, Tuple[str, ...]]:
        if file == "diagnostic.tsv":
            return "glue/ax", GLUE_SPLITS[file], ("premise", "hypothesis")
        if file not in GLUE_SPLITS:
            raise DataError(f"task {self.name}: no tfds split stands for {file}")
        return f"glue/{self.name}", GLUE_SPLITS[file], GLUE_FEATURES[self.name]

    def _read(self, file: str, labelled: bool) -> Rows:
        name, split, features = self._dataset(file)
        where = f"{_label(name, self.tfds_data_dir)} split {split}"
        cols = read_split(name, self.tfds_data_dir, split)
        order = np.argsort(np.asarray(cols["idx"]), kind="stable")  # the file's row order
        pick = lambda values: [values[i] for i in order]
        texts = [_text(pick(cols[f]), where) for f in features]
        if not texts[0]:
            raise DataError(f"{where}: no examples")
        if not labelled:
            return Rows(texts, None, [str(i) for i in pick(cols["idx"])], f"{name}:{split}")
        raw = pick(cols["label"])
        if self.labels is None:
            # TFDS keeps STS-B's decimal scores as float32: its shortest repr is the
            # file's number, which then scales exactly as the TSV reader's.
            labels = [float(str(np.float32(x))) / self.regression_scale for x in raw]
        else:
            ids = self._label_ids(name)
            if any(x < 0 or x >= len(ids) for x in raw):
                raise DataError(f"{where}: has unlabelled rows (label -1): a test split?")
            labels = [ids[x] for x in raw]
        return Rows(texts, labels, None, f"{name}:{split}")

    def _label_ids(self, name: str) -> List[int]:
        """Our label id of each tfds class id: by name (MNLI, QNLI, RTE), else by number."""
        names = open_builder(name, self.tfds_data_dir).info.features["label"].names
        out = []
        for i, n in enumerate(names):
            key = n if n in self.labels else str(i)
            if key not in self.labels:
                raise DataError(f"{_label(name, self.tfds_data_dir)}: label {n!r} is not "
                                f"one of {', '.join(self.labels)}")
            out.append(self.labels.index(key))
        return out

    def rows(self, data_dir, file):
        return self._read(file, labelled=True)

    def test_rows(self, data_dir, test: SubmissionFile):
        try:
            return self._read(test.file, labelled=False)
        except DataError as e:
            if test.required:
                raise
            logging.info("No %s predictions: %s", test.submission, e)
            return None


# --------------------------------------------------------------------------- SQuAD

@dataclasses.dataclass(frozen=True)
class TfdsSquadTask(SquadTask):
    """SQuAD from `squad/v1.1` or `squad/v2.0`, regrouped and parsed as the official JSON."""
    tfds_data_dir: Optional[str] = None

    @property
    def dataset(self) -> str:
        return "squad/v2.0" if self.v2 else "squad/v1.1"

    def read_examples(self, data_dir, split, is_training):
        split = "train" if split == "train" else "validation"
        where = f"{_label(self.dataset, self.tfds_data_dir)} split {split}"
        cols = read_split(self.dataset, self.tfds_data_dir, split)
        articles: Dict[str, Dict[str, list]] = {}  # title -> context -> questions
        for i in range(len(cols["id"])):
            title, context, qid, question = _text(
                [cols[k][i] for k in ("title", "context", "id", "question")], where)
            answers = [{"text": t, "answer_start": int(s)} for t, s in zip(
                _text(cols["answers/text"][i], where), cols["answers/answer_start"][i])]
            qa = {"id": qid, "question": question, "answers": answers}
            if self.v2:
                qa["is_impossible"] = bool(cols["is_impossible"][i])
            articles.setdefault(title, {}).setdefault(context, []).append(qa)
        tree = {"data": [{"title": t, "paragraphs": [{"context": c, "qas": q}
                                                     for c, q in paras.items()]}
                         for t, paras in articles.items()]}
        examples = parse_squad_tree(tree, is_training, self.v2, where)
        return examples, where, f"{self.dataset}:{split}"


def from_tfds(task: Task, data_dir: Optional[str] = None) -> Task:
    """`task` (GLUE's eight, SQuAD) reading tensorflow-datasets prepared under `data_dir`."""
    if isinstance(task, TsvTask) and task.name in GLUE_FEATURES:
        return TfdsGlueTask(**vars(task), tfds_data_dir=data_dir)
    if isinstance(task, SquadTask):
        return TfdsSquadTask(**vars(task), tfds_data_dir=data_dir)
    raise DataError(f"task {task.name} has no tensorflow-datasets source (GLUE's "
                    f"{', '.join(sorted(GLUE_FEATURES))} and squad_v1 / squad_v2 have); "
                    "use --data_source=files")
