"""Fine-tuning tasks by name (`get_task`): GLUE, the bundled polarity set and user TSV
tasks (`TsvTask`; a new one is one `TsvTask(...)`, see `GLUE`), SQuAD and tagging."""

import collections
import dataclasses
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from absl import logging
from keras import ops

from electra_tf import backend, fileio, kernels as K
from electra_tf.finetune import DataError, metrics, read_text
from electra_tf.finetune.base_task import Encoder, Task, TaskData

Column = Union[str, int]  # a header name, or an index for header-less files


# --------------------------------------------------------------------------- TSV reading

def read_tsv(path: str) -> List[Tuple[int, List[str]]]:
    """(1-based line number, fields) of each non-empty line of a TSV file (quotes are data:
    GLUE's files are not CSV-quoted); bad UTF-8 is a DataError naming the line."""
    rows = []
    for number, text in enumerate(read_text(path).split("\n"), 1):
        text = text.rstrip("\r")
        if not text.strip(" \t\n\r\v\f"):  # ASCII blanks: a line of U+00A0 is a row
            continue
        rows.append((number, text.split("\t")))
    return rows


@dataclasses.dataclass
class Rows:
    """One split as a TsvTask source (TSV, tensorflow-datasets) reads it: `texts` per text
    column, `labels` (ids, or targets / `regression_scale`; None for a test split), `ids`
    (a test split's index column), `name` (its file, or dataset:split)."""
    texts: List[List[str]]
    labels: Optional[List[Any]]
    ids: Optional[List[str]] = None
    name: str = ""


class SubmissionFile(NamedTuple):
    """A GLUE test `file` and its predictions' `submission`.tsv in <model_dir>/predictions."""
    file: str
    submission: str
    required: bool = True


@dataclasses.dataclass(frozen=True)
class TsvTask(Task):
    """A sentence (pair) classification or regression task from
    `<data_dir>/<dir_name>/<file>.tsv`.

    text_columns / label_column: header names, or 0-based indices when `header=False`.
    labels: label strings in id order; None for regression (`regression_scale` divides
      the target: STS-B's 0-5 -> 0-1). metric: see `metrics.classification_metrics`.
    both_orders: also train on (b, a) for symmetric pairs (MRPC, STS-B).
    test_files: GLUE's test sets (a header, `test_index_column`, `test_text_columns`).
    exact_columns: every row as wide as the header or first row (user tasks: a stray tab
      shifts the label); GLUE's rows vary (MNLI's optional annotator labels, QQP)."""
    name: str
    text_columns: Tuple[Column, ...]
    label_column: Column
    labels: Optional[Tuple[str, ...]] = None
    header: bool = True
    metric: str = "accuracy"
    dir_name: Optional[str] = None
    train_file: str = "train.tsv"
    dev_files: Tuple[str, ...] = ("dev.tsv",)
    both_orders: bool = False
    regression_scale: float = 1.0
    num_train_epochs: float = 3.0
    test_files: Tuple[SubmissionFile, ...] = ()
    test_text_columns: Tuple[str, ...] = ()
    test_index_column: str = "index"
    exact_columns: bool = False
    labels_from: Optional[str] = None
    in_graph_preprocessing = False  # read and encoded on the host (a class attribute)

    @property
    def kind(self) -> str:
        return "regression" if self.labels is None else "classification"

    @property
    def primary_metric(self) -> str:
        return {"accuracy": "accuracy", "accuracy_f1": "accuracy", "mcc": "mcc",
                "pearson_spearman": "spearman"}[self.metric]

    def num_outputs(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    def text_fields(self) -> Tuple[str, ...]:
        return ("sentence",) if len(self.text_columns) == 1 else ("sentence1", "sentence2")

    # --- data --------------------------------------------------------------------
    def _path(self, data_dir: str, file: str) -> str:
        return os.path.join(data_dir, self.dir_name or self.name, file)

    def _table(self, path: str, wanted=None, header=None
               ) -> Tuple[List[int], List[Tuple[int, List[str]]]]:
        """The wanted columns' indices and the checked data rows of `path`."""
        rows = read_tsv(path)
        if not rows:
            raise DataError(f"{path}: no rows")
        wanted = wanted or list(self.text_columns) + [self.label_column]
        has_header = self.header if header is None else header
        if not has_header:
            indices, data = [int(c) for c in wanted], rows
        else:
            number, head = rows[0]
            for c in wanted:
                if not isinstance(c, int) and c not in head:
                    raise DataError(f"{path}:{number}: header has no column {c!r} "
                                    f"(columns: {', '.join(head)})")
            indices = [c if isinstance(c, int) else head.index(c) for c in wanted]
            data = rows[1:]
        width = max(indices) + 1
        exact = rows[0]  # the header, or the first row that sets the width
        what = "the header" if has_header else "the first row"
        for number, fields in data:
            if self.exact_columns and len(fields) != len(exact[1]):
                raise DataError(f"{path}:{number}: expected {len(exact[1])} "
                                f"tab-separated columns as {what} (line {exact[0]}) has, "
                                f"found {len(fields)}")
            if len(fields) < width:
                raise DataError(f"{path}:{number}: expected at least {width} "
                                f"tab-separated columns, found {len(fields)}")
        return indices, data

    def _label(self, path: str, number: int, raw: str, lookup: Dict[str, int]):
        """The id (regression: the target) of label `raw`; DataError naming the row."""
        if not self.labels:
            try:
                return float(raw) / self.regression_scale
            except ValueError:
                raise DataError(f"{path}:{number}: label {raw!r} is not a number") from None
        if raw in lookup:
            return lookup[raw]
        if self.labels_from:
            raise DataError(f"{path}:{number}: label {raw!r} does not occur in "
                            f"{self.labels_from}, whose labels are {', '.join(self.labels)}; "
                            "fix the row, or list every label with --labels")
        raise DataError(f"{path}:{number}: label {raw!r} is not one of "
                        f"{', '.join(self.labels)}")

    def read(self, path: str, test: bool = False) -> Rows:
        """The labelled split of `path` (with `test`, a GLUE test file: no labels)."""
        if test:
            columns = [self.test_index_column, *(self.test_text_columns or self.text_columns)]
            (key, *text_idx), rows = self._table(path, columns, header=True)
        else:
            (*text_idx, key), rows = self._table(path)
        if not rows:
            raise DataError(f"{path}: no examples")
        texts = [[fields[i] for _, fields in rows] for i in text_idx]
        keys = [(number, fields[key].strip()) for number, fields in rows]
        if test:
            return Rows(texts, None, [k for _, k in keys], os.path.basename(path))
        lookup = {l: i for i, l in enumerate(self.labels or ())}
        return Rows(texts, [self._label(path, n, raw, lookup) for n, raw in keys],
                    name=os.path.basename(path))

    def rows(self, data_dir: str, file: str) -> Rows:
        """A labelled split; tfds_data overrides it."""
        return self.read(self._path(data_dir, file))

    def test_rows(self, data_dir: str, test: SubmissionFile) -> Optional[Rows]:
        """A test split; None when an optional one is absent."""
        candidates = [self._path(data_dir, test.file)]
        if test.file == "diagnostic.tsv":  # also where GLUE's download script puts AX
            candidates.append(os.path.join(data_dir, "diagnostic", test.file))
        for path in candidates:
            if fileio.isfile(path):
                return self.read(path, test=True)
        if not test.required:
            return None
        raise DataError(f"{candidates[0]}: no such file (the test set that --do_predict "
                        f"predicts for {test.submission}.tsv)")

    def encode(self, rows: Rows, encoder: Encoder, max_seq_length: int,
               both_orders: bool = False) -> TaskData:
        """Model inputs of `rows` (`label` if labelled; a test split's ids in `meta`)."""
        texts, labels = rows.texts, rows.labels
        if both_orders and len(texts) == 2:
            texts = [texts[0] + texts[1], texts[1] + texts[0]]
            labels = labels + labels
        arrays = encoder.encode_numpy(texts[0], texts[1] if len(texts) == 2 else None,
                                      max_seq_length)
        n = len(texts[0])
        if labels is not None:
            dtype = np.int32 if self.labels is not None else np.float32
            arrays["label"] = np.asarray(labels, dtype)
        arrays["weight"] = np.ones([n], np.float32)
        return TaskData(arrays, n, meta=rows.ids, name=rows.name)

    def train_split(self, data_dir, encoder, max_seq_length):
        return self.encode(self.rows(data_dir, self.train_file), encoder, max_seq_length,
                           self.both_orders)

    def eval_splits(self, data_dir, encoder, max_seq_length):
        return [self.encode(self.rows(data_dir, f), encoder, max_seq_length)
                for f in self.dev_files]

    def test_splits(self, data_dir, encoder, max_seq_length):
        if not self.test_files:
            return super().test_splits(data_dir, encoder, max_seq_length)
        out = []
        for test in self.test_files:
            rows = self.test_rows(data_dir, test)
            if rows is not None:
                data = self.encode(rows, encoder, max_seq_length)
                out.append(dataclasses.replace(data, name=test.submission))
        return out

    def predicted_labels(self, data, fetched):
        logits = fetched["logits"][:data.num_examples]
        if self.labels is None:  # STS-B: a score on the task's own scale
            scores = np.clip(logits[:, 0] * self.regression_scale, 0.0, self.regression_scale)
            return [f"{x:.3f}" for x in scores.tolist()]
        return [self.labels[i] for i in np.argmax(logits, axis=-1).tolist()]

    # --- model -------------------------------------------------------------------
    def loss(self, outputs, batch):
        """Per-example losses (keras.ops: either runtime)."""
        logits = outputs["logits"]
        if self.labels is None:
            return ops.square(logits[:, 0] - ops.cast(batch["label"], "float32"))
        return K.softmax_xent(ops.cast(batch["label"], "int32"), logits)

    def metrics(self, data, fetched):
        n = data.num_examples
        labels = data.arrays["label"][:n]
        logits = fetched["logits"][:n]
        if self.labels is None:
            preds = logits[:, 0] * self.regression_scale
            labels = labels * self.regression_scale
        else:
            preds = np.argmax(logits, axis=-1)
        return metrics.classification_metrics(self.metric, labels, preds)

    def serving_outputs(self, outputs):
        import tensorflow as tf  # the serving signature: a TensorFlow graph
        logits = outputs["logits"]
        if self.labels is None:
            return {"score": logits[:, 0] * self.regression_scale}
        probs = tf.nn.softmax(logits)
        ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"label": tf.gather(tf.constant(list(self.labels)), ids), "label_id": ids,
                "probabilities": probs}

    def label_names(self):
        return self.labels

    def assets(self):
        return {"labels.txt": "".join(f"{l}\n" for l in self.labels)} if self.labels else {}


# --------------------------------------------------------------------------- registry

BINARY = ("0", "1")
NLI = ("entailment", "not_entailment")
GLUE: Dict[str, TsvTask] = {t.name: t for t in [
    TsvTask("cola", text_columns=(3,), label_column=1, labels=BINARY, header=False,
            metric="mcc", dir_name="CoLA", test_files=(SubmissionFile("test.tsv", "CoLA"),),
            test_text_columns=("sentence",)),
    TsvTask("sst2", text_columns=("sentence",), label_column="label", labels=BINARY,
            dir_name="SST-2", test_files=(SubmissionFile("test.tsv", "SST-2"),)),
    TsvTask("mrpc", text_columns=("#1 String", "#2 String"), label_column="Quality",
            labels=BINARY, metric="accuracy_f1", dir_name="MRPC", both_orders=True,
            test_files=(SubmissionFile("test.tsv", "MRPC"),)),
    TsvTask("stsb", text_columns=("sentence1", "sentence2"), label_column="score",
            metric="pearson_spearman", dir_name="STS-B", both_orders=True,
            regression_scale=5.0, num_train_epochs=10.0,
            test_files=(SubmissionFile("test.tsv", "STS-B"),)),
    TsvTask("qqp", text_columns=("question1", "question2"), label_column="is_duplicate",
            labels=BINARY, metric="accuracy_f1", dir_name="QQP",
            test_files=(SubmissionFile("test.tsv", "QQP"),), test_index_column="id"),
    TsvTask("mnli", text_columns=("sentence1", "sentence2"), label_column="gold_label",
            labels=("contradiction", "entailment", "neutral"), dir_name="MNLI",
            dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
            # AX, GLUE's diagnostic set, is predicted with the MNLI model.
            test_files=(SubmissionFile("test_matched.tsv", "MNLI-m"),
                        SubmissionFile("test_mismatched.tsv", "MNLI-mm"),
                        SubmissionFile("diagnostic.tsv", "AX", required=False))),
    TsvTask("qnli", text_columns=("question", "sentence"), label_column="label",
            labels=NLI, dir_name="QNLI", test_files=(SubmissionFile("test.tsv", "QNLI"),)),
    TsvTask("rte", text_columns=("sentence1", "sentence2"), label_column="label",
            labels=NLI, dir_name="RTE", num_train_epochs=10.0,
            test_files=(SubmissionFile("test.tsv", "RTE"),)),
]}

# The bundled demo set: SST-2's layout (sentence<TAB>label), in data/polarity.
POLARITY = TsvTask("polarity", text_columns=("sentence",), label_column="label",
                   labels=BINARY, dir_name="polarity")


def find_dir(data_dir: str, task: TsvTask) -> TsvTask:
    """`task` with the folder that exists: GLUE's script says `SST-2`, users `sst2`/`sst-2`."""
    for name in (task.dir_name, task.name, (task.dir_name or "").lower()):
        if name and fileio.isdir(os.path.join(data_dir, name)):
            return dataclasses.replace(task, dir_name=name)
    return task


# An inferred label is suspect (a typo, a shifted column) with fewer rows than 1% of the
# commonest's, or one row while the commonest has RARE_SINGLETON_MIN. Rare classes can be
# real: only a warning.
RARE_SHARE = 0.01
RARE_SINGLETON_MIN = 10
MAX_RARE_WARNINGS = 5


def rare_labels(counts: Dict[str, int]) -> List[str]:
    """The labels of `counts` (label -> rows) that the rule above flags, rarest first."""
    if not counts:
        return []
    top = max(counts.values())
    rare = [l for l, c in counts.items()
            if c < RARE_SHARE * top or (c == 1 and top >= RARE_SINGLETON_MIN)]
    return sorted(rare, key=lambda l: (counts[l], l))


def infer_labels(task: TsvTask, path: str) -> Tuple[str, ...]:
    """The sorted labels of the training file `path` (warning of rare ones, naming each
    one's count and first line); an empty label is an error."""
    indices, rows = task._table(path)
    counts: Dict[str, int] = collections.Counter()
    first: Dict[str, int] = {}
    for number, fields in rows:
        raw = fields[indices[-1]].strip()
        if not raw:
            raise DataError(f"{path}:{number}: empty label (column {task.label_column!r})")
        counts[raw] += 1
        first.setdefault(raw, number)
    if not counts:
        raise DataError(f"{path}: no examples")
    rare = rare_labels(counts)
    if rare:
        common = sorted(l for l in counts if l not in rare)
        top = max(counts, key=lambda l: (counts[l], l))
        for label in rare[:MAX_RARE_WARNINGS]:
            logging.warning(
                "Task %s: label %r has only %d of %d rows (first at %s; %r has %d): a typo "
                "or a shifted column? If it is not a class, fix those rows or give the "
                "labels with --labels=%s (then any other label is an error naming its line)",
                task.name, label, counts[label], len(rows), f"{path}:{first[label]}", top,
                counts[top], ",".join(common))
        if len(rare) > MAX_RARE_WARNINGS:
            logging.warning("Task %s: %d more rare labels in %s: %s", task.name,
                            len(rare) - MAX_RARE_WARNINGS, path,
                            ", ".join(rare[MAX_RARE_WARNINGS:]))
    return tuple(sorted(counts))


def tsv_task(name: str, text_columns: Sequence[str], label_column: str,
             labels: Optional[Sequence[str]], metric: str = "accuracy",
             data_dir: Optional[str] = None) -> TsvTask:
    """A user TSV task (columns by header name, every row as wide as the header). labels
    (): regression; None: `infer_labels`, and the existing dev files are checked against
    them now (a label the training file lacks is an error naming its line)."""
    task = TsvTask(name, tuple(text_columns), label_column,
                   labels=tuple(labels) if labels else None, metric=metric,
                   exact_columns=True)
    if labels is not None:
        return task
    if data_dir is None:
        raise DataError(f"task {name}: give its labels or a data_dir to read them from")
    path = task._path(data_dir, task.train_file)
    task = dataclasses.replace(task, labels=infer_labels(task, path), labels_from=path)
    for dev in task.dev_files:  # a missing one is reported where it is read
        dev_path = task._path(data_dir, dev)
        if fileio.exists(dev_path):
            task.read(dev_path)
    return task


def get_task(name: str, data_dir: Optional[str] = None, text_columns: Sequence[str] = (),
             label_column: Optional[str] = None, labels: Optional[Sequence[str]] = None,
             metric: str = "accuracy") -> Task:
    """A task by name: the GLUE eight (`sst2` or `sst-2`), `polarity`, `squad_v1`, `squad_v2`,
    `chunk`, `ner`; any other is a user TSV task (`text_columns` and `label_column` needed)."""
    key = name.lower().replace("-", "")
    if key in GLUE:
        return find_dir(data_dir, GLUE[key]) if data_dir else GLUE[key]
    if key == "polarity":
        return POLARITY
    if key in ("squad", "squad_v1", "squadv1", "squad1", "squad_v2", "squadv2", "squad2"):
        backend.require_tensorflow(f"--task={name} (its windows are made in-graph)")
        from electra_tf.finetune.qa_task import SquadTask
        return SquadTask(v2=key in ("squad_v2", "squadv2", "squad2"))
    if key in ("chunk", "chunking", "ner"):
        backend.require_tensorflow(f"--task={name} (its words are packed in-graph)")
        from electra_tf.finetune.tagging_task import TaggingTask
        return TaggingTask(name=key if key != "chunking" else "chunk",
                           label_column=-1 if label_column is None else int(label_column))
    if not text_columns or label_column is None:
        raise DataError(f"--task={name} is not a known task ({', '.join(sorted(GLUE))}, "
                        "polarity, squad_v1, squad_v2, chunk, ner); a TSV task of your own "
                        "needs --text_columns and --label_column")
    return tsv_task(name, text_columns, label_column, labels, metric, data_dir)
