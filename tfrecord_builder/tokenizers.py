"""Tokenizers for the builder: WordPiece (tf-text FastBertTokenizer) and SentencePiece.

Both tokenize whole batches of lines in C++ and hand back flat ids plus row splits; the
vocabulary is checked for the special tokens ELECTRA needs before any work starts.
Vocabulary files and SentencePiece models are read through TensorFlow's filesystem layer,
so they may be local or on any filesystem TensorFlow knows (gs://...).
"""

import dataclasses
import functools
import hashlib
import os
import re
import unicodedata
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from electra_tf import fileio
from tfrecord_builder import BuildError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with fileio.open_file(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read(path: str, flag: str) -> bytes:
    try:
        return fileio.read_bytes(path)
    except (OSError, tf.errors.OpError) as e:
        raise BuildError(f"{flag}: cannot read {path}: {fileio.error_reason(e)}") from None


def read_wordpiece_vocab(path: str, data: Optional[bytes] = None) -> List[str]:
    """One token per line, id = line number (the BERT vocab.txt layout). `data`: the
    file's bytes when they are at hand (then `path` only names it in errors)."""
    raw = _read(path, "--vocab_file") if data is None else data
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BuildError(f"--vocab_file: {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    tokens = [t.rstrip("\r") for t in tokens]
    if not tokens:
        raise BuildError(f"--vocab_file: {path} is empty")
    return tokens


def _special_ids(lookup: Dict[str, int], path: str, flag: str) -> Dict[str, int]:
    missing = [t for t in SPECIAL_TOKENS if t not in lookup]
    if missing:
        raise BuildError(f"{flag}: {path} lacks the special token(s) {', '.join(missing)}")
    return {t: lookup[t] for t in SPECIAL_TOKENS}


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """What the manifest records of a vocabulary."""
    kind: str  # "wordpiece" or "sentencepiece"
    path: str
    vocab_size: int
    sha256: str
    special_ids: Dict[str, int]
    do_lower_case: bool

    def to_json(self) -> dict:
        return {"kind": self.kind, "vocab_file": os.path.basename(self.path),
                "vocab_size": self.vocab_size, "vocab_sha256": self.sha256,
                "do_lower_case": self.do_lower_case, "special_token_ids": self.special_ids}


def _read_spm(path: str, data: Optional[bytes] = None):
    """(model bytes, SentencePieceProcessor) of the model at `path` (or in `data`)."""
    import sentencepiece as spm
    model = _read(path, "--spm_model") if data is None else data
    try:
        return model, spm.SentencePieceProcessor(model_proto=model)
    except RuntimeError as e:
        raise BuildError(f"--spm_model: {path} is not a SentencePiece model "
                         f"({str(e).splitlines()[0]})") from None


def vocab_info(vocab_file: Optional[str] = None, spm_model: Optional[str] = None,
               do_lower_case: bool = True) -> VocabInfo:
    """Reads and checks a WordPiece vocab or SentencePiece model."""
    if spm_model:
        model, proc = _read_spm(spm_model)
        pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
        lookup = {p: i for i, p in enumerate(pieces)}
        return VocabInfo("sentencepiece", spm_model, len(pieces),
                         hashlib.sha256(model).hexdigest(),
                         _special_ids(lookup, spm_model, "--spm_model"), do_lower_case)
    if not vocab_file:
        raise BuildError("give --vocab_file (WordPiece) or --spm_model (SentencePiece)")
    raw = _read(vocab_file, "--vocab_file")
    tokens = read_wordpiece_vocab(vocab_file, raw)
    lookup = {}
    for i, t in enumerate(tokens):
        lookup.setdefault(t, i)
    return VocabInfo("wordpiece", vocab_file, len(tokens), hashlib.sha256(raw).hexdigest(),
                     _special_ids(lookup, vocab_file, "--vocab_file"), do_lower_case)


def read_vocab_data(info: VocabInfo) -> bytes:
    """The bytes of `info`'s vocabulary, checked against its sha256. Worker processes get
    these rather than the path: they need not see the file (a ram:// file is private to
    its process; a Beam worker may not see the launcher's disk)."""
    flag = "--spm_model" if info.kind == "sentencepiece" else "--vocab_file"
    data = _read(info.path, flag)
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise BuildError(f"{flag}: {info.path} changed while it was read; run again")
    return data


@functools.lru_cache(maxsize=65536)
def _removed(ch: str, kind: str) -> bool:
    """Whether the reference BERT normaliser drops `ch`: `junk` is NUL, U+FFFD and
    category C except tab/newline/CR; `marks` is category Mn (after NFD)."""
    if kind == "marks":
        return unicodedata.category(ch) == "Mn"
    return ch in "\x00\ufffd" or (ch not in "\t\n\r" and unicodedata.category(ch)[0] == "C")


def _drop(text: str, kind: str) -> str:
    # Classify each distinct character once, then remove the offenders with a small
    # regex: a class of all of Unicode category C would make `re` ~100x slower.
    bad = sorted(ch for ch in set(text) if _removed(ch, kind))
    if not bad:
        return text
    return re.sub("[" + "".join(map(re.escape, bad)) + "]+", "", text)


_ASCII_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def bert_normalize(lines: List[str], lower: bool) -> List[str]:
    """BERT's text normalisation before WordPiece: drop control characters and U+FFFD;
    if `lower`, str.lower(), NFD and drop non-spacing marks.

    Done here rather than by FastBertTokenizer, which splits at control characters and
    case-folds with NFKC (e.g. '²' -> '2', '…' -> '...', final 'ς' -> 'σ'), departing
    from the reference BERT ids on ~0.2% of Wikipedia lines.
    """
    text = "\n".join(lines)
    if not text.isascii() or _ASCII_CONTROL.search(text):
        text = _drop(text, "junk")
    if lower:
        text = text.lower()
        if not text.isascii():
            text = _drop(unicodedata.normalize("NFD", text), "marks")
    return text.split("\n")


class Tokenizer:
    """Batched C++ tokenization: FastBertTokenizer (WordPiece) or SentencepieceTokenizer."""

    def __init__(self, info: VocabInfo, data: Optional[bytes] = None):
        """`data`: the vocabulary file's bytes (`read_vocab_data`); read from
        `info.path` when not given."""
        import tensorflow_text as tf_text
        self.info = info
        self.special_ids = info.special_ids
        self._tf = tf
        if info.kind == "sentencepiece":
            model, proc = _read_spm(info.path, data)
            self.vocab = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
            self._tok = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)
        else:
            self.vocab = read_wordpiece_vocab(info.path, data)
            self._tok = tf_text.FastBertTokenizer(
                self.vocab, suffix_indicator="##", max_bytes_per_word=100,
                token_out_type=tf.int32, unknown_token="[UNK]",
                lower_case_nfd_strip_accents=False)
        if info.kind == "wordpiece":
            self._normalize = functools.partial(bert_normalize, lower=info.do_lower_case)
        elif info.do_lower_case:
            self._normalize = lambda lines: [line.lower() for line in lines]
        else:
            self._normalize = None

    def tokenize(self, lines: List[str]) -> Tuple[np.ndarray, np.ndarray]:
        """Batch of lines -> (flat int32 ids, int64 row splits of len(lines) + 1)."""
        if not lines:
            return np.zeros([0], np.int32), np.zeros([1], np.int64)
        if self._normalize is not None:
            lines = self._normalize(lines)
        ragged = self._tok.tokenize(self._tf.constant(lines, dtype=self._tf.string))
        return ragged.flat_values.numpy(), ragged.row_splits.numpy()

    def ids_to_tokens(self, ids) -> List[str]:
        return [self.vocab[i] for i in ids]
