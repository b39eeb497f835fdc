"""Raw text -> model inputs inside the TensorFlow graph (tensorflow-text), shared by the
fine-tuning data pipeline and the exported SavedModels, so both truncate alike.

The normalisation reproduces the pre-training builder's (`tfrecord_builder.tokenizers`):
invalid UTF-8 replaced then dropped with the other control characters, lower-casing, NFD
and accent stripping; WordPiece ids therefore equal the builder's on the same text.
"""

import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf import fileio
from tfrecord_builder import BuildError
from tfrecord_builder.tokenizers import SPECIAL_TOKENS, read_wordpiece_vocab

# Category C except tab/newline/CR, and U+FFFD (what invalid UTF-8 decodes to): the
# characters BERT's normaliser deletes.
_JUNK = r"[^\PC\t\n\r]|\x{FFFD}"


def normalize(strings: tf.Tensor, lower: bool) -> tf.Tensor:
    """BERT normalisation of a string tensor (any shape); never fails on bad bytes."""
    strings = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace",
                                           replacement_char=0xFFFD)
    strings = tf.strings.regex_replace(strings, _JUNK, "")
    if lower:
        strings = tf.strings.lower(strings, encoding="utf-8")
        strings = tf_text.normalize_utf8(strings, "NFD")
        strings = tf.strings.regex_replace(strings, r"\p{Mn}", "")
    return strings


def _read_model_file(path: str, flag: str) -> bytes:
    """The bytes of a SentencePiece model on any filesystem (gs://...)."""
    try:
        return fileio.read_bytes(path)
    except (OSError, tf.errors.OpError) as e:
        raise BuildError(f"{flag}: cannot read {path}: {fileio.error_reason(e)}") from None


def pair_lengths(a, b, budget):
    """How many tokens of each segment survive BERT's pair truncation (repeatedly drop the
    last token of the longer segment, the second one on ties) to fit `budget` tokens."""
    keep_a = tf.minimum(a, tf.maximum(budget - b, budget - budget // 2))
    keep_a = tf.where(a + b <= budget, a, keep_a)
    keep_b = tf.where(a + b <= budget, b, budget - keep_a)
    return keep_a, keep_b


def _truncate(ragged: tf.RaggedTensor, keep) -> tf.RaggedTensor:
    keep = tf.broadcast_to(tf.cast(keep, tf.int64), [ragged.nrows()])
    mask = tf.ragged.range(ragged.row_lengths()) < tf.expand_dims(keep, 1)
    return tf.ragged.boolean_mask(ragged, mask)


class TextEncoder(tf.Module):
    """WordPiece (a BERT vocab.txt) or SentencePiece tokenization and BERT packing.

    `tokenize(strings [N]) -> ragged ids [N, (tokens)]`; `pack(first, second=None,
    max_seq_length)` -> dict of input_ids / input_mask / segment_ids [N, max_seq_length]
    laid out as `[CLS] first [SEP] (second [SEP])` with BERT's truncation rule.
    """

    def __init__(self, vocab_file: Optional[str] = None, do_lower_case: bool = True,
                 spm_model: Optional[str] = None, name: str = "text_encoder"):
        super().__init__(name=name)
        if (vocab_file is None) == (spm_model is None):
            raise BuildError("give exactly one of --vocab_file and --spm_model")
        self.do_lower_case = bool(do_lower_case)
        if spm_model is not None:
            import sentencepiece as spm
            proto = _read_model_file(spm_model, "--spm_model")
            proc = spm.SentencePieceProcessor(model_proto=proto)
            self.vocab = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
            self.kind = "sentencepiece"
            self.asset = tf.saved_model.Asset(spm_model)
            self._tokenizer = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32)
        else:
            self.vocab = read_wordpiece_vocab(vocab_file)
            self.kind = "wordpiece"
            self.asset = tf.saved_model.Asset(vocab_file)
            self._tokenizer = tf_text.FastBertTokenizer(
                self.vocab, suffix_indicator="##", max_bytes_per_word=100,
                token_out_type=tf.int32, unknown_token="[UNK]",
                lower_case_nfd_strip_accents=False)
        lookup = {}
        for i, token in enumerate(self.vocab):
            lookup.setdefault(token, i)
        missing = [t for t in SPECIAL_TOKENS if t not in lookup]
        if missing:
            raise BuildError(f"{vocab_file or spm_model} lacks the special token(s) "
                             f"{', '.join(missing)}")
        self.special_ids: Dict[str, int] = {t: lookup[t] for t in SPECIAL_TOKENS}
        self.vocab_size = len(self.vocab)
        path = vocab_file or spm_model
        self.vocab_path = path if fileio.is_remote(path) else \
            os.path.abspath(path)  # local paths only: abspath would mangle gs://b/x
        self._tokenize_fn = tf.function(self.tokenize, reduce_retracing=True)

    # ------------------------------------------------------------------ graph ops

    def tokenize(self, strings) -> tf.RaggedTensor:
        """[N] strings -> [N, (tokens)] int32 ids."""
        strings = tf.convert_to_tensor(strings, tf.string)
        lower = self.do_lower_case
        if self.kind == "sentencepiece":
            strings = normalize(strings, lower=False)
            if lower:
                strings = tf.strings.lower(strings, encoding="utf-8")
            return self._tokenizer.tokenize(strings)
        return self._tokenizer.tokenize(normalize(strings, lower))

    def pack(self, first: tf.RaggedTensor, second: Optional[tf.RaggedTensor] = None,
             max_seq_length: int = 128) -> Dict[str, tf.Tensor]:
        """Token ids of one or two segments -> padded BERT inputs [N, max_seq_length]."""
        cls_id, sep_id = self.special_ids["[CLS]"], self.special_ids["[SEP]"]
        first = tf.cast(first, tf.int32)
        n = first.nrows()
        cls = tf.RaggedTensor.from_row_lengths(tf.fill([n], cls_id), tf.ones([n], tf.int64))
        sep = tf.RaggedTensor.from_row_lengths(tf.fill([n], sep_id), tf.ones([n], tf.int64))
        if second is None:
            first = _truncate(first, max_seq_length - 2)
            pieces, segments = [cls, first, sep], [0, 0, 0]
        else:
            second = tf.cast(second, tf.int32)
            keep_a, keep_b = pair_lengths(first.row_lengths(), second.row_lengths(),
                                          tf.constant(max_seq_length - 3, tf.int64))
            first, second = _truncate(first, keep_a), _truncate(second, keep_b)
            pieces, segments = [cls, first, sep, second, sep], [0, 0, 0, 1, 1]
        ids = tf.concat(pieces, axis=1)
        seg = tf.concat([tf.zeros_like(p) + s for p, s in zip(pieces, segments)], axis=1)
        shape = [None, max_seq_length]
        input_ids = ids.to_tensor(default_value=self.special_ids["[PAD]"], shape=shape)
        return {"input_ids": input_ids,
                "input_mask": tf.ones_like(ids).to_tensor(default_value=0, shape=shape),
                "segment_ids": seg.to_tensor(default_value=0, shape=shape)}

    def encode(self, first, second=None, max_seq_length: int = 128) -> Dict[str, tf.Tensor]:
        """Raw strings [N] (and an optional second segment [N]) -> packed inputs."""
        second_ids = None if second is None else self.tokenize(second)
        return self.pack(self.tokenize(first), second_ids, max_seq_length)

    # ------------------------------------------------------------------ host helpers

    def tokenize_lists(self, strings: Sequence[str], batch_size: int = 4096) -> List[List[int]]:
        """Python strings -> lists of ids, through the same graph ops (batched)."""
        out: List[List[int]] = []
        for start in range(0, len(strings), batch_size):
            chunk = list(strings[start:start + batch_size])
            ragged = self._tokenize_fn(tf.constant(chunk, tf.string))
            flat = ragged.flat_values.numpy()
            splits = ragged.row_splits.numpy()
            out.extend(flat[splits[i]:splits[i + 1]].tolist() for i in range(len(chunk)))
        return out

    def encode_numpy(self, first: Sequence[str], second: Optional[Sequence[str]] = None,
                     max_seq_length: int = 128, batch_size: int = 4096) -> Dict[str, np.ndarray]:
        """Python strings -> numpy int32 inputs [N, max_seq_length] (the training path)."""
        fn = self._encode_fn(max_seq_length, second is not None)
        parts: Dict[str, List[np.ndarray]] = {}
        for start in range(0, len(first), batch_size):
            args = [tf.constant(list(first[start:start + batch_size]), tf.string)]
            if second is not None:
                args.append(tf.constant(list(second[start:start + batch_size]), tf.string))
            for k, v in fn(*args).items():
                parts.setdefault(k, []).append(v.numpy())
        if not parts:
            return {k: np.zeros([0, max_seq_length], np.int32)
                    for k in ("input_ids", "input_mask", "segment_ids")}
        return {k: np.concatenate(v) for k, v in parts.items()}

    def _encode_fn(self, max_seq_length: int, pair: bool):
        key = (max_seq_length, pair)
        cache = self.__dict__.setdefault("_encode_cache", {})
        if key not in cache:
            if pair:
                fn = lambda a, b: self.encode(a, b, max_seq_length)
            else:
                fn = lambda a: self.encode(a, None, max_seq_length)
            cache[key] = tf.function(fn, reduce_retracing=True)
        return cache[key]
