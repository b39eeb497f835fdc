"""The interface every fine-tuning task implements (`Task`) and the packed split it hands
the trainer (`TaskData`)."""

import abc
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from electra_tf.finetune import DataError

Tensor = Any  # a backend tensor (keras.ops), or a tf.Tensor in the serving signatures
Encoder = Any  # text.TextEncoder (in-graph), or text.HostTextEncoder (NumPy, no TensorFlow)


@dataclasses.dataclass
class TaskData:
    """One split, ready for the model: `arrays` (model inputs, labels and a `weight` that
    is 0 on padding rows) of `num_examples` rows, and whatever the metrics need."""
    arrays: Dict[str, np.ndarray]
    num_examples: int
    meta: Any = None
    name: str = ""


class Task(abc.ABC):
    """Every task's interface; subclasses have a `name` (directory and export name)."""
    kind: str = "classification"  # classification | regression | tagging | qa
    primary_metric: str = "accuracy"
    num_train_epochs: float = 3.0
    # The data file the label set was read from; None when the task or the user fixes it.
    labels_from: Optional[str] = None
    # Whether the splits are made by TensorFlow ops (`text.TextEncoder`'s in-graph
    # tokenizer); else by host code, which `text.HostTextEncoder` serves without TensorFlow.
    in_graph_preprocessing: bool = True

    @abc.abstractmethod
    def train_split(self, data_dir: str, encoder: Encoder, max_seq_length: int) -> TaskData:
        """The packed training set."""

    @abc.abstractmethod
    def eval_splits(self, data_dir: str, encoder: Encoder,
                    max_seq_length: int) -> List[TaskData]:
        """The dev sets, the first one being the one whose metric is reported."""

    @abc.abstractmethod
    def num_outputs(self) -> int:
        """Output units of the head (classes, 1 for regression, tags, ...)."""

    def head_options(self) -> Dict[str, Any]:
        return {}

    def label_names(self) -> Optional[Sequence[str]]:
        """Class names in output order (None: regression, SQuAD); known after train_split."""
        return None

    @abc.abstractmethod
    def loss(self, outputs: Dict[str, Tensor], batch: Dict[str, Tensor]) -> Tensor:
        """Per-example losses [B] (the train step weights and averages them)."""

    def fetches(self, outputs: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """What evaluation brings back to the host, per example."""
        return outputs

    @abc.abstractmethod
    def metrics(self, data: TaskData, fetched: Dict[str, np.ndarray]) -> Dict[str, float]:
        """The official metrics of one evaluated split."""

    # --- serving -----------------------------------------------------------------
    @abc.abstractmethod
    def text_fields(self) -> Tuple[str, ...]:
        """Names of the raw-string inputs of the serving signature."""

    @abc.abstractmethod
    def serving_outputs(self, outputs: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The serving signature's answers from the head's outputs."""

    def serve_text(self, model, encoder: Encoder, max_seq_length: int,
                   texts: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """Raw strings ([N] per `text_fields()` name) -> answers, in-graph, as in training."""
        fields = [texts[name] for name in self.text_fields()]
        batch = encoder.encode(fields[0], fields[1] if len(fields) > 1 else None,
                               max_seq_length)
        return self.serve_ids(model, batch)

    def serve_ids(self, model, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
        return self.serving_outputs(model(batch, training=False))

    def assets(self) -> Dict[str, str]:
        """Extra files written beside an export (e.g. the label list), name -> text."""
        return {}

    # --- test-set predictions ----------------------------------------------------
    def test_splits(self, data_dir: str, encoder: Encoder,
                    max_seq_length: int) -> List[TaskData]:
        """The test sets `--do_predict` predicts (`name`: the submission file's stem, `meta`:
        the index column); such tasks also implement `predicted_labels(data, fetched)`."""
        raise DataError(f"task {self.name}: --do_predict writes GLUE test-set predictions; "
                        "this task has no test sets")
