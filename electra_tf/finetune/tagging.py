"""Token-tagging data: CoNLL reading, IOB1/BIO -> BIOES, the label map, the features'
container (made by tagging_task.pack_words) and sub-token predictions -> word tags."""

import dataclasses
import functools
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from electra_tf.finetune import DataError, Features, read_text

SCHEMES = ("bioes", "bio", "raw")
OUTSIDE = "O"
DOCSTART = "-DOCSTART-"

# CoNLL columns are separated by ASCII blanks; str.split() would also split on
# U+00A0 and friends, which do occur inside words of web-derived NER data.
_FIELD_SEP = re.compile(r"[ \t\f\v]+")
_BLANKS = " \t\f\v\r"
_PREFIXES = {"bioes": ("B", "I", "E", "S"), "bio": ("B", "I")}


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One CoNLL sentence; token i sits on line `line + i` of `path`."""
    words: Tuple[str, ...]
    labels: Tuple[str, ...]
    line: int
    path: str = ""

    def where(self, index: int = 0) -> str:
        """'path:line' of token `index`, for error messages."""
        return f"{self.path}:{self.line + index}"


def read_conll(path, label_column: int = -1) -> List[Sentence]:
    """Sentences of a CoNLL file (word in column 0, the label in `label_column`; blank lines
    separate sentences; `-DOCSTART-` lines are skipped). DataError (path:line) for a column
    count other than the first line's, bad UTF-8, a bad label column or no sentences."""
    path = os.fspath(path)
    lines = read_text(path).split("\n")
    sentences: List[Sentence] = []
    tokens: List[Tuple[int, List[str]]] = []  # (line, fields) of the sentence being read
    n_columns = label_index = None

    def flush():
        if tokens:
            sentences.append(Sentence(tuple(f[0] for _, f in tokens),
                                      tuple(f[label_index] for _, f in tokens), tokens[0][0],
                                      path))
            tokens.clear()

    for number, text in enumerate(lines, start=1):
        if number == 1:
            text = text.lstrip("\ufeff")
        text = text.strip(_BLANKS)
        fields = _FIELD_SEP.split(text) if text else []
        if not fields or fields[0] == DOCSTART:
            flush()
            continue
        if n_columns is None:
            n_columns = len(fields)
            # The word is column 0, so the label must be another column.
            label_index = label_column + n_columns if label_column < 0 else label_column
            if not 1 <= label_index < n_columns:
                raise DataError(f"{path}: label column {label_column} is out of range for "
                                f"{n_columns} columns (the word is column 0)")
        elif len(fields) != n_columns:
            raise DataError(f"{path}:{number}: expected {n_columns} columns, "
                            f"found {len(fields)}")
        tokens.append((number, fields))
    flush()
    if not sentences:
        raise DataError(f"{path}: no sentences (empty file or only -DOCSTART-/blank lines)")
    return sentences


class _BadTag(ValueError):
    """A tag that is neither O nor PREFIX-TYPE; `index` is its position in the sequence."""

    def __init__(self, index: int, tag: str):
        super().__init__(f"tag {tag!r} at position {index} is not 'O' or B-/I-/E-/S-TYPE")
        self.index = index


def _split_tag(index: int, tag: str) -> Tuple[str, str]:
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, dash, kind = tag.partition("-")
    if not dash or prefix not in ("B", "I", "E", "S") or not kind:
        raise _BadTag(index, tag)
    return prefix, kind


def to_bioes(labels: Sequence[str]) -> List[str]:
    """IOB1, IOB2 (BIO) or BIOES tags -> BIOES tags. A chunk starts at B-/S-, and at I-/E-
    after O, another type or a closed chunk (E-/S-): IOB1's I- opens chunks, its B- only
    separates adjacent chunks of one type. ValueError for other tags."""
    parts = [_split_tag(i, t) for i, t in enumerate(labels)]
    starts = []
    for i, (prefix, kind) in enumerate(parts):
        if prefix == OUTSIDE:
            starts.append(False)
            continue
        prev_prefix, prev_kind = parts[i - 1] if i else (OUTSIDE, "")
        starts.append(prefix in ("B", "S") or prev_prefix in (OUTSIDE, "E", "S")
                      or prev_kind != kind)
    out = []
    for i, (prefix, kind) in enumerate(parts):
        if prefix == OUTSIDE:
            out.append(OUTSIDE)
            continue
        last = i + 1 == len(parts)
        ends = prefix in ("E", "S") or last or parts[i + 1][0] == OUTSIDE or starts[i + 1]
        out.append(("S" if ends else "B") if starts[i] else ("E" if ends else "I"))
        out[-1] += "-" + kind
    return out


def convert_labels(labels: Sequence[str], scheme: str = "bioes") -> List[str]:
    """`labels` in `scheme`: 'bioes', 'bio' (IOB2) or 'raw' (as read)."""
    if scheme == "bioes":
        return to_bioes(labels)
    if scheme == "bio":
        return [t if t == OUTSIDE else {"S": "B", "E": "I"}.get(t[0], t[0]) + t[1:]
                for t in to_bioes(labels)]
    if scheme == "raw":
        return list(labels)
    raise ValueError(f"unknown tagging scheme {scheme!r}; expected one of {SCHEMES}")


def sentence_labels(sentence: Sentence, scheme: str) -> List[str]:
    """`sentence`'s labels in `scheme`; DataError naming the path:line of a bad tag."""
    try:
        return convert_labels(sentence.labels, scheme)
    except _BadTag as e:
        raise DataError(f"{sentence.where(e.index)}: label {sentence.labels[e.index]!r} is "
                        f"not 'O' or B-/I-/E-/S-TYPE (needed for scheme {scheme!r})") from None


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Tag name <-> class id (its index in `labels`). 'O' is id 0 (so padding/unweighted
    positions read as O), the other names follow in sorted order."""
    labels: Tuple[str, ...]
    scheme: str = "bioes"

    @classmethod
    def from_sentences(cls, sentences: Iterable[Sentence], scheme: str = "bioes") -> "LabelMap":
        """The map for training `sentences` in `scheme`. For 'bioes'/'bio' every chunk type seen
        gets all its prefixes, so a dev/test tag of a known type in a position training never
        showed (e.g. S-X) still maps; an unseen type does not."""
        seen = set()
        for sentence in sentences:
            seen.update(sentence_labels(sentence, scheme))
        if scheme in _PREFIXES:
            kinds = {t[2:] for t in seen if t != OUTSIDE}
            seen = {f"{p}-{k}" for k in kinds for p in _PREFIXES[scheme]}
        return cls((OUTSIDE,) + tuple(sorted(seen - {OUTSIDE})), scheme)

    def __len__(self) -> int:
        return len(self.labels)

    @functools.cached_property
    def _ids(self) -> Dict[str, int]:
        return {name: i for i, name in enumerate(self.labels)}

    def get(self, label: str) -> Optional[int]:
        """The class id of `label`; None for a label not in the map."""
        return self._ids.get(label)

    def names(self, ids: Iterable[int]) -> List[str]:
        """Tag names of class `ids`; ValueError for an id outside [0, len)."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.labels):
                raise ValueError(f"label id {i} is outside [0, {len(self.labels)})")
            out.append(self.labels[i])
        return out

    def to_json(self) -> str:
        return json.dumps({"scheme": self.scheme, "labels": list(self.labels)}, indent=1)


@dataclasses.dataclass
class TaggingFeatures(Features):
    """Model inputs of N sentences padded to L tokens. word_positions[n][w]: the token of
    word w's first sub-token in row n; -1 (read as 'O') without tokens or truncated."""
    ARRAYS = Features.ARRAYS + ("label_ids", "label_weights")
    input_ids: np.ndarray       # int32 [N, L]
    input_mask: np.ndarray      # int32 [N, L]
    segment_ids: np.ndarray     # int32 [N, L]
    label_ids: np.ndarray       # int32 [N, L]
    label_weights: np.ndarray   # float32 [N, L]
    word_positions: List[np.ndarray]  # N x int32 [num words]
    num_truncated_words: int


def predictions_to_tags(features: TaggingFeatures, predicted_ids,
                        label_map: LabelMap) -> List[List[str]]:
    """Word tags per sentence from [N, L] class ids at first sub-tokens ('O' without one)."""
    predicted = np.asarray(predicted_ids)
    if predicted.shape != features.input_ids.shape:
        raise ValueError(f"predicted_ids has shape {predicted.shape}, "
                         f"features have {features.input_ids.shape}")
    out = []
    for row, positions in enumerate(features.word_positions):
        kept = positions >= 0
        tags = [OUTSIDE] * len(positions)
        for w, name in zip(np.flatnonzero(kept),
                           label_map.names(predicted[row, positions[kept]])):
            tags[w] = name
        out.append(tags)
    return out
