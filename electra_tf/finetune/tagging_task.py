"""The token-tagging task (CoNLL-2000 chunking, CoNLL NER): data, per-sentence loss,
entity F1 and serving, whose word packing (`pack_words`) also makes the training data."""

import dataclasses
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging
from keras import ops

from electra_tf import fileio, kernels as K
from electra_tf.finetune import DataError, metrics
from electra_tf.finetune.base_task import Task, TaskData
from electra_tf.finetune.tagging import (SCHEMES, LabelMap, Sentence, TaggingFeatures,
                                         convert_labels, predictions_to_tags, read_conll,
                                         sentence_labels)
from electra_tf.text import TextEncoder

# What a raw request is split on besides ASCII whitespace (tf.strings.split's set): BERT
# also treats the Unicode space separators as blanks, and tf_text.WhitespaceTokenizer
# cuts multi-byte spaces in the middle of their UTF-8 bytes.
_UNICODE_SPACES = r"[\p{Zs}\x{85}\x{2028}\x{2029}]"


@dataclasses.dataclass
class TaggingSplit:
    """What one split's metrics need; `gold`: every word's tag in the task's scheme."""
    features: TaggingFeatures
    label_map: LabelMap
    gold: List[List[str]]


@dataclasses.dataclass
class TaggingTask(Task):
    """Word tagging from CoNLL files `<data_dir>/<name>/{train,dev}.txt`.

    label_column: the tag's column (0 is the word; -1, the last, is CoNLL-2000's chunk and
      CoNLL-2003's NER tag). scheme: 'bioes', 'bio' or 'raw', what the model predicts.
    label_map: set by `train_split` from the training file (it sizes the head, so the
      task is not frozen); give one to serve or evaluate without reading train."""
    name: str = "chunk"
    label_column: int = -1
    scheme: str = "bioes"
    num_train_epochs: float = 3.0
    train_file: str = "train.txt"
    dev_files: Tuple[str, ...] = ("dev.txt",)
    label_map: Optional[LabelMap] = None

    # Unannotated so that the dataclass keeps them out of the constructor.
    kind = "tagging"
    primary_metric = "f1"

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown tagging scheme {self.scheme!r}; expected one of "
                             f"{SCHEMES}")
        if self.label_map is not None and self.label_map.scheme != self.scheme:
            raise ValueError(f"label map scheme {self.label_map.scheme!r} differs from the "
                             f"task's {self.scheme!r}")

    def _labels(self) -> LabelMap:
        if self.label_map is None:
            raise ValueError(f"task {self.name}: the label map is unknown until train_split "
                             "has read the training file (or pass label_map=)")
        return self.label_map

    def num_outputs(self) -> int:
        return len(self._labels())

    def label_names(self):
        return self.label_map.labels if self.label_map is not None else None

    # --- data --------------------------------------------------------------------
    def _read(self, data_dir: str, file: str) -> List[Sentence]:
        path = os.path.join(data_dir, self.name, file)
        if not fileio.isfile(path):
            hint = (" (CoNLL-2000 ships train.txt and test.txt: use test.txt as dev.txt)"
                    if file == "dev.txt" else "")
            raise DataError(f"{path}: no such file{hint}")
        return read_conll(path, self.label_column)

    def features(self, sentences: Sequence[Sentence], encoder: TextEncoder,
                 max_seq_length: int, what: str = "") -> TaggingFeatures:
        """Model inputs of `sentences` (`pack_words`), labels on first sub-tokens. DataError
        (path:line) for a label not in the map, kept word or not; warns of cut words."""
        if max_seq_length < 2:
            raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS] "
                             f"and [SEP]")
        label_map = self._labels()
        tag_ids = []
        for sentence in sentences:
            for w, tag in enumerate(sentence_labels(sentence, self.scheme)):
                tag_id = label_map.get(tag)
                if tag_id is None:
                    raw = sentence.labels[w]
                    shown = repr(raw) if tag == raw else f"{raw!r} ({tag!r} in {self.scheme})"
                    raise DataError(f"{sentence.where(w)}: label {shown} is not in the label "
                                    f"map built from the training data")
                tag_ids.append(tag_id)
        lengths = [len(s.words) for s in sentences]
        words = tf.RaggedTensor.from_row_lengths(
            tf.constant([w for s in sentences for w in s.words], tf.string, shape=[sum(lengths)]),
            tf.constant(lengths, tf.int64))
        packed = pack_words(encoder, words, max_seq_length)
        position = packed["position"].flat_values.numpy()
        num_tokens = packed["num_tokens"].numpy()
        row = np.repeat(np.arange(len(sentences)), lengths)
        kept = position >= 0
        label_ids = np.zeros([len(sentences), max_seq_length], np.int32)
        label_weights = np.zeros([len(sentences), max_seq_length], np.float32)
        label_ids[row[kept], position[kept]] = np.asarray(tag_ids, np.int32)[kept]
        label_weights[row[kept], position[kept]] = 1.0
        feats = TaggingFeatures(
            *(packed["batch"][k].numpy() for k in ("input_ids", "input_mask", "segment_ids")),
            label_ids, label_weights,
            np.split(position.astype(np.int32), np.cumsum(lengths)[:-1]),
            int(np.sum((num_tokens > 0) & ~kept)))
        if feats.num_truncated_words:
            logging.warning("%s: %d word(s) beyond max_seq_length=%d tokens are not tagged "
                            "(they count as 'O')", what or self.name,
                            feats.num_truncated_words, max_seq_length)
        return feats

    def _data(self, sentences: List[Sentence], encoder: TextEncoder, max_seq_length: int,
              file: str) -> TaskData:
        feats = self.features(sentences, encoder, max_seq_length, f"{self.name}/{file}")
        gold = [convert_labels(s.labels, self.scheme) for s in sentences]
        return TaskData(feats.arrays(), len(feats), TaggingSplit(feats, self._labels(), gold),
                        name=file)

    def train_split(self, data_dir, encoder, max_seq_length):
        sentences = self._read(data_dir, self.train_file)
        # Rebuilt on every call: the head's size follows the training data it is given.
        self.label_map = LabelMap.from_sentences(sentences, self.scheme)
        self.labels_from = os.path.join(data_dir, self.name, self.train_file)
        return self._data(sentences, encoder, max_seq_length, self.train_file)

    def eval_splits(self, data_dir, encoder, max_seq_length):
        return [self._data(self._read(data_dir, f), encoder, max_seq_length, f)
                for f in self.dev_files]

    # --- model -------------------------------------------------------------------
    def loss(self, outputs, batch):
        """Per sentence, the mean cross-entropy over its labelled words (first sub-tokens): each
        sentence counts once, ln(num_labels) at init; 0 for a row without labelled words."""
        weights = ops.cast(batch["label_weights"], "float32")
        ce = K.softmax_xent(ops.cast(batch["label_ids"], "int32"), outputs["logits"])
        return ops.sum(ce * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)

    def fetches(self, outputs):
        return {"predictions": K.argmax(outputs["logits"])}

    def metrics(self, data, fetched):
        """conlleval entity precision/recall/F1 (percent) over every word (truncated ones
        predicted 'O'), and `accuracy` (0-1) of the labelled words' tags."""
        split: TaggingSplit = data.meta
        n = data.num_examples
        predicted = fetched["predictions"][:n]
        result = metrics.entity_f1(split.gold,
                                   predictions_to_tags(split.features, predicted,
                                                       split.label_map))
        labelled = split.features.label_weights[:n] > 0
        gold_ids = split.features.label_ids[:n][labelled]
        result["accuracy"] = (metrics.accuracy(gold_ids, predicted[labelled])
                              if gold_ids.size else 0.0)
        return result

    # --- serving -----------------------------------------------------------------
    def text_fields(self):
        return ("text",)

    def serving_outputs(self, outputs):
        logits = outputs["logits"]
        return {"tag_ids": tf.argmax(logits, axis=-1, output_type=tf.int32),
                "probabilities": tf.nn.softmax(logits)}

    def serve_text(self, model, encoder, max_seq_length, texts) -> Dict[str, tf.Tensor]:
        """Raw sentences [N] -> `words` and `tags` [N, W] (padded with ""), `tag_ids`
        [N, W] (padded with -1) and `num_words` [N]. Words are split at whitespace and
        tagged as in training (`pack_words`; words without a kept token are 'O')."""
        labels = tf.constant(list(self._labels().labels))
        text = tf.convert_to_tensor(texts[self.text_fields()[0]], tf.string)
        # Bad bytes become U+FFFD (dropped by the encoder's normalisation) so the words
        # handed back are valid UTF-8 and a word of only bad bytes stays a word.
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                            replacement_char=0xFFFD)
        text = tf.strings.regex_replace(text, _UNICODE_SPACES, " ")
        words = tf.strings.split(text)                        # [N, (W)]
        packed = pack_words(encoder, words, max_seq_length)
        predicted = self.serving_outputs(model(packed["batch"], training=False))["tag_ids"]
        position = packed["position"].flat_values
        kept = position >= 0
        index = tf.stack([words.value_rowids(), tf.where(kept, position, 0)], axis=1)
        # Id 0 is 'O' (LabelMap's guarantee), as training reads unkept words.
        tag_ids = tf.where(kept, tf.gather_nd(predicted, index), 0)
        return {"words": words.to_tensor(default_value=""),
                "tags": words.with_flat_values(tf.gather(labels, tag_ids)).to_tensor(
                    default_value=""),
                "tag_ids": words.with_flat_values(tag_ids).to_tensor(default_value=-1),
                "num_words": tf.cast(words.row_lengths(), tf.int32)}

    def assets(self):
        return {"labels.json": self._labels().to_json()}


def pack_words(encoder: TextEncoder, words: tf.RaggedTensor,
               max_seq_length: int) -> Dict[str, tf.Tensor]:
    """The one tagging preprocessor (serving and training data): words [N, (W)], each WordPiece'd
    alone -> `batch` (`[CLS] sub-tokens [SEP]` [N, L]), `position` [N, (W)] (each word's first
    sub-token, -1 without one or past max_seq_length - 2) and `num_tokens` [total W]."""
    pieces = encoder.tokenize(words.flat_values)         # [total W, (P)]
    tokens = tf.RaggedTensor.from_row_splits(pieces, words.row_splits).merge_dims(1, 2)
    batch = encoder.pack(tokens, None, max_seq_length)
    # A word's first sub-token sits after [CLS] and the tokens of the words before it
    # in its sentence: pieces' row_splits are the running total over all words.
    starts = pieces.row_splits[:-1]
    before = starts - tf.gather(pieces.row_splits,
                                tf.gather(words.row_splits, words.value_rowids()))
    kept = (pieces.row_lengths() > 0) & (before < max_seq_length - 2)
    return {"batch": batch, "num_tokens": pieces.row_lengths(),
            "position": words.with_flat_values(tf.where(kept, before + 1, -1))}
