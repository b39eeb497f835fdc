"""Raw text -> model inputs inside the TensorFlow graph (tensorflow-text), shared by the
fine-tuning data pipeline and the exported SavedModels, so both truncate alike.

Text is normalised by the pre-training builder's own `tfrecord_builder.tokenizers.normalize`,
so WordPiece ids equal the builder's on the same text.
"""

import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf import fileio
from tfrecord_builder import BuildError
from tfrecord_builder.tokenizers import (SPECIAL_TOKENS, normalize, read_spm_model,
                                         read_wordpiece_vocab, wordpiece_tokenizer)


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
            proto, proc = read_spm_model(spm_model)
            self.vocab = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
            self.kind = "sentencepiece"
            self.asset = tf.saved_model.Asset(spm_model)
            self._tokenizer = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32)
        else:
            self.vocab = read_wordpiece_vocab(vocab_file)
            self.kind = "wordpiece"
            self.asset = tf.saved_model.Asset(vocab_file)
            self._tokenizer = wordpiece_tokenizer(self.vocab)
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
        # SentencePiece keeps its accents: only WordPiece (BERT) strips them.
        strings = normalize(strings, self.do_lower_case,
                            strip_accents=self.kind == "wordpiece")
        return self._tokenizer.tokenize(strings)

    def pack(self, first: tf.RaggedTensor, second: Optional[tf.RaggedTensor] = None,
             max_seq_length: int = 128) -> Dict[str, tf.Tensor]:
        """Token ids of one or two segments -> padded BERT inputs [N, max_seq_length]."""
        segments = [tf.cast(first, tf.int32)]
        if second is not None:
            segments.append(tf.cast(second, tf.int32))
        # BERT's pair truncation (drop the last token of the longer segment, of the second
        # on ties) keeps what a round robin allots; tests/test_finetune_text.py checks
        # every pair of lengths. WaterfallTrimmer would empty the second segment first.
        budget = max_seq_length - 1 - len(segments)  # [CLS], and a [SEP] per segment
        segments = tf_text.RoundRobinTrimmer(budget).trim(segments)
        ids, segment_ids = tf_text.combine_segments(
            segments, self.special_ids["[CLS]"], self.special_ids["[SEP]"])
        input_ids, input_mask = tf_text.pad_model_inputs(ids, max_seq_length,
                                                         self.special_ids["[PAD]"])
        segment_ids, _ = tf_text.pad_model_inputs(segment_ids, max_seq_length, 0)
        return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}

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
