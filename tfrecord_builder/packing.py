"""Packing tokenized sentences into fixed-length [CLS] A [SEP] (B [SEP]) examples.

The segment rules follow the official ELECTRA builder (10% single-segment examples, 5%
random short target lengths, the 50% rule for a sentence that overflows segment A), with
two changes: tokens that do not fit are carried into the next example of the same
document instead of being dropped, and segments stay contiguous text (see `_emit`).
"""

import dataclasses
from typing import Iterable, List

import numpy as np

SINGLE_SEGMENT_PROB = 0.1
SHORT_TARGET_PROB = 0.05
MIN_SHORT_TARGET = 5


@dataclasses.dataclass
class PackedExamples:
    """Examples of one chunk: `input_ids`/`segment_ids` int32 [n, L], `lengths` [n]."""
    input_ids: np.ndarray
    segment_ids: np.ndarray
    lengths: np.ndarray
    content_tokens: int  # corpus tokens placed in these examples (no CLS/SEP)

    @property
    def input_mask(self) -> np.ndarray:
        return (np.arange(self.input_ids.shape[1])[None, :] < self.lengths[:, None]).astype(np.int32)


class Packer:
    """Turns documents (lists of token-id arrays) into examples; state is one buffer.

    `rng` draws, per example and in order: single-segment (p=0.1), the 50% coin for each
    sentence that would overflow segment A, then the next target length (p=0.05 short).
    """

    def __init__(self, max_seq_length: int, cls_id: int, sep_id: int,
                 rng: np.random.Generator):
        if max_seq_length < 5:
            raise ValueError("max_seq_length must be at least 5")
        self.max_len = max_seq_length
        self.cls = cls_id
        self.sep = sep_id
        self._specials = np.array([cls_id], np.int32), np.array([sep_id], np.int32)
        self.rng = rng
        self.target = max_seq_length
        self.buffer: List[np.ndarray] = []
        self.buffered = 0
        self._pieces: List[np.ndarray] = []  # every example's tokens, in order
        self._lens: List[int] = []
        self._b_starts: List[int] = []  # where segment B starts (max_len: no B)
        self._content = 0

    def add_document(self, sentences: Iterable[np.ndarray]):
        for sentence in sentences:
            if len(sentence) == 0:
                continue
            self.buffer.append(sentence)
            self.buffered += len(sentence)
            while self.buffered >= self.target:
                self._emit()
        while self.buffered > 0:  # document end: flush everything, carried tokens too
            self._emit()

    def _emit(self):
        if self.rng.random() < SINGLE_SEGMENT_PROB:
            first_target = np.inf
        else:
            first_target = (self.target - 3) // 2
        first: List[np.ndarray] = []
        second: List[np.ndarray] = []
        n_first = n_second = 0
        for sentence in self.buffer:
            # Once B has begun every later sentence joins B: the official rule would let a
            # short sentence jump back into A, putting text out of order.
            if n_first == 0 or (n_second == 0 and (
                    n_first + len(sentence) < first_target or
                    (n_first < first_target and self.rng.random() < 0.5))):
                first.append(sentence)
                n_first += len(sentence)
            else:
                second.append(sentence)
                n_second += len(sentence)
        # Capacity as in the official builder: A gets at most L-2, B what is left after
        # three special tokens. What does not fit is carried, in order, to the next example.
        first_cap = self.max_len - 2
        kept_first, carry = _take(first, first_cap)
        if carry:
            carry += second
            kept_second = []
        else:
            second_cap = max(0, self.max_len - sum(map(len, kept_first)) - 3)
            kept_second, carry = _take(second, second_cap)
        self.buffer = carry
        self.buffered = sum(map(len, carry))

        # Only the pieces here: take_examples lays every example out at once.
        n_a, n_b = sum(map(len, kept_first)), sum(map(len, kept_second))
        cls, sep = self._specials
        self._pieces += [cls] + kept_first + [sep] + (kept_second + [sep] if kept_second else [])
        self._lens.append(n_a + 2 + (n_b + 1 if kept_second else 0))
        self._b_starts.append(n_a + 2 if kept_second else self.max_len)
        self._content += n_a + n_b

        if self.rng.random() < SHORT_TARGET_PROB:
            self.target = int(self.rng.integers(MIN_SHORT_TARGET, self.max_len + 1))
        else:
            self.target = self.max_len

    def take_examples(self) -> PackedExamples:
        """Returns (and forgets) the examples emitted so far, zero-padded."""
        lens = np.asarray(self._lens, np.int32)
        columns = np.arange(self.max_len)
        tokens = columns < lens[:, None]
        ids = np.zeros(tokens.shape, np.int32)
        if len(lens):
            ids[tokens] = np.concatenate(self._pieces)  # row-major: each row's tokens in order
        segs = (tokens & (columns >= np.asarray(self._b_starts)[:, None])).astype(np.int32)
        out = PackedExamples(ids, segs, lens, self._content)
        self._pieces, self._lens, self._b_starts, self._content = [], [], [], 0
        return out


def _take(sentences: List[np.ndarray], capacity: int):
    """Splits a sentence list at `capacity` tokens -> (kept, carried)."""
    kept, used = [], 0
    for i, sentence in enumerate(sentences):
        room = capacity - used
        if len(sentence) <= room:
            kept.append(sentence)
            used += len(sentence)
            continue
        if room > 0:
            kept.append(sentence[:room])
        return kept, [sentence[room:]] + sentences[i + 1:]
    return kept, []
