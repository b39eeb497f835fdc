"""The SQuAD 1.1 / 2.0 task: data, loss and metrics of the joint head, and its in-graph windows."""

import dataclasses
import os
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf
from absl import logging
from keras import ops
import tensorflow_text as tf_text

from electra_tf import fileio, kernels as K
from electra_tf.configs import ConfigError
from electra_tf.finetune import DataError
from electra_tf.finetune.base_task import Task, TaskData
from electra_tf.finetune.metrics import squad_scores
from electra_tf.finetune.squad import (WORD_SEPARATORS, SquadExample, SquadFeatures,
                                       improve_answer_span, postprocess, read_squad,
                                       word_pieces)
from electra_tf.text import TextEncoder

# Serving must cut the context into the very words the training features were made from.
_DELIMITERS = f"[{WORD_SEPARATORS}]+"

_TOP_K = ("start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index")


@dataclasses.dataclass
class SquadSplit:
    """What the metrics of one dev file need beside the model outputs."""
    examples: List[SquadExample]
    features: SquadFeatures
    do_lower_case: bool


@dataclasses.dataclass(frozen=True)
class SquadTask(Task):
    """SQuAD 1.1, or 2.0 (`v2`, with the answerability classifier), from
    `<data_dir>/squad/{train,dev}.json` or the official `{train,dev}-v1.1.json` / `-v2.0.json`.
    do_lower_case: of answers mapped back to the text (None: the TextEncoder's).
    serve_windows_per_call: windows per model call in serving (bounds the memory)."""
    v2: bool = False
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    beam: int = 20
    answerable_weight: float = 0.5
    do_lower_case: Optional[bool] = None
    serve_windows_per_call: int = 64

    kind = "qa"
    primary_metric = "f1"
    num_train_epochs = 2.0  # the paper's SQuAD setting

    @property
    def name(self) -> str:
        return "squad_v2" if self.v2 else "squad_v1"

    def num_outputs(self) -> int:
        return 1  # unused by the QA head, whose outputs are fixed

    def head_options(self):
        return {"beam": self.beam, "answerable": self.v2}

    def text_fields(self):
        return ("question", "context")

    # --- data --------------------------------------------------------------------
    def data_file(self, data_dir: str, split: str) -> str:
        folder = os.path.join(data_dir, "squad")
        names = [f"{split}.json", f"{split}-v{'2.0' if self.v2 else '1.1'}.json"]
        for name in names:
            path = os.path.join(folder, name)
            if fileio.isfile(path):
                return path
        raise DataError(f"{self.name}: no {split} file in {folder} (looked for "
                        f"{' and '.join(names)})")

    def features(self, examples: List[SquadExample], encoder: TextEncoder,
                 max_seq_length: int, is_training: bool,
                 chunk: int = 2048) -> SquadFeatures:
        """The `windows` of `examples` (`chunk` at a time) but a token-less context's.
        Training: a window holding the whole (`improve_answer_span`) answer points at it, any
        other at the CLS with is_impossible 1; an answer without sub-tokens is dropped."""
        keys = ("input_ids", "input_mask", "segment_ids", "token_word", "max_context",
                "token_index", "request")
        parts = {k: [] for k in keys + ("doc_ids", "doc_word")}
        for first in range(0, max(len(examples), 1), chunk):
            rows = examples[first:first + chunk]
            win = self.windows(encoder, max_seq_length, [ex.question for ex in rows],
                               [" ".join(ex.doc_words) for ex in rows])
            win.update(win.pop("batch"), request=win["request"] + first)
            keep = tf.gather(win["num_tokens"], win["request"] - first) > 0
            for k in keys:  # int32 (or bool) on the host: SQuAD has ~10^5 windows
                value = tf.boolean_mask(win[k], keep)
                parts[k].append(tf.cast(value, tf.int32).numpy() if value.dtype == tf.int64
                                else value.numpy())
            for k in ("doc_ids", "doc_word"):
                parts[k].extend(np.split(win[k].flat_values.numpy(),
                                         win[k].row_splits.numpy()[1:-1]))
        f = {k: np.concatenate(parts[k]) for k in keys}
        answer_ids = dict.fromkeys(ex.answer_text for ex in examples
                                   if is_training and not ex.is_impossible)
        answer_ids = dict(zip(answer_ids, encoder.tokenize_lists(list(answer_ids))
                              if answer_ids else []))
        # Which basic piece of its word each context token is, for dev postprocessing.
        pieces = word_pieces([w for ex in examples for w in ex.doc_words],
                             encoder.tokenize_lists)
        span = np.full([len(examples), 2], -1, np.int64)  # answer tokens; -2: dropped
        docs, doc_piece = {}, []
        for e, ex in enumerate(examples):
            word = parts["doc_word"][e]
            if id(ex.doc_words) not in docs:
                doc = docs[id(ex.doc_words)] = np.zeros([len(word)], np.int16)
                for w, text in enumerate(ex.doc_words):
                    if text in pieces:
                        doc[np.searchsorted(word, w):np.searchsorted(word, w, "right")] = \
                            pieces[text]
            doc_piece.append(docs[id(ex.doc_words)])
            if ex.answer_text not in answer_ids or ex.is_impossible:
                continue
            first_tok = int(np.searchsorted(word, ex.start_word, "left"))
            last_tok = int(np.searchsorted(word, ex.end_word, "right")) - 1
            if last_tok < first_tok:
                logging.warning("SQuAD: skipping training question %s: its answer words "
                                "have no sub-tokens", ex.qid)
                span[e] = -2
                continue
            span[e] = improve_answer_span(parts["doc_ids"][e], first_tok, last_tok,
                                          np.asarray(answer_ids[ex.answer_text]))
        f = {k: v[span[f["request"], 0] != -2] for k, v in f.items()}
        request, index = f["request"], f["token_index"]
        at_start = index == span[request, 0][:, None]
        at_end = index == span[request, 1][:, None]
        found = (span[request, 0] >= 0) & at_start.any(axis=1) & at_end.any(axis=1)
        offsets = np.cumsum([0] + [len(d) for d in doc_piece])
        flat_piece = np.concatenate(doc_piece + [np.zeros([1], np.int16)])
        piece = np.where(index >= 0, flat_piece[offsets[request][:, None]
                                                + np.maximum(index, 0)], -1)
        return SquadFeatures(
            f["input_ids"], f["input_mask"], f["segment_ids"],
            np.where(found, at_start.argmax(axis=1), 0).astype(np.int32),
            np.where(found, at_end.argmax(axis=1), 0).astype(np.int32),
            (~found & is_training).astype(np.int32), request, f["token_word"],
            f["max_context"], piece.astype(np.int16), len(examples))

    def read_examples(self, data_dir: str, split: str, is_training: bool):
        """(questions of "train" / "dev", their source for messages, a short name)."""
        path = self.data_file(data_dir, split)
        return read_squad(path, is_training=is_training, v2=self.v2), path, \
            os.path.basename(path)

    def train_split(self, data_dir, encoder, max_seq_length):
        examples, source, name = self.read_examples(data_dir, "train", is_training=True)
        features = self.features(examples, encoder, max_seq_length, True)
        if not len(features):
            raise DataError(f"{source}: no usable training questions")
        return TaskData(features.arrays(), len(features), name=name)

    def eval_splits(self, data_dir, encoder, max_seq_length):
        examples, source, name = self.read_examples(data_dir, "dev", is_training=False)
        if not examples:
            raise DataError(f"{source}: no questions")
        features = self.features(examples, encoder, max_seq_length, False)
        # No gold positions (several answers, unlabelled windows): no meaningless dev loss.
        arrays = {k: v for k, v in features.arrays().items()
                  if k in ("input_ids", "input_mask", "segment_ids", "weight")}
        lower = encoder.do_lower_case if self.do_lower_case is None else self.do_lower_case
        # Rows are windows; the metrics map them to questions by features.example_index.
        return [TaskData(arrays, len(features), SquadSplit(list(examples), features, lower),
                         name=name)]

    # --- model -------------------------------------------------------------------
    def loss(self, outputs, batch):
        """Per-feature losses (keras.ops: either runtime)."""
        def ce(logits, positions):
            return K.softmax_xent(ops.cast(positions, "int32"), logits)

        losses = (ce(outputs["start_logits"], batch["start_positions"])
                  + ce(outputs["end_logits"], batch["end_positions"])) / 2.0
        if self.v2:
            losses += self.answerable_weight * K.sigmoid_xent(
                ops.cast(batch["is_impossible"], "float32"), outputs["null_logit"])
        return losses

    def fetches(self, outputs):
        return {k: outputs[k] for k in _TOP_K + (("null_logit",) if self.v2 else ())}

    def predictions(self, data: TaskData, fetched: Dict[str, np.ndarray]):
        """(answers {qid: text}, na_probs {qid: p} or None) of a dev split."""
        split: SquadSplit = data.meta
        n = len(split.features)
        outputs = {k: np.asarray(v)[:n] for k, v in fetched.items() if not k.startswith("_")}
        return postprocess(split.examples, split.features, outputs, self.max_answer_length,
                           split.do_lower_case, self.v2)

    def metrics(self, data, fetched):
        preds, na_probs = self.predictions(data, fetched)
        # v2: abstain above 0.5, as the served model does; best_f1 etc. sweep the threshold.
        golds = {ex.qid: list(ex.answers) for ex in data.meta.examples}
        scores = squad_scores(golds, preds, na_probs, na_prob_thresh=0.5 if self.v2 else 1.0)
        return {k: float(v) for k, v in scores.items()}

    # --- serving -----------------------------------------------------------------
    def serving_outputs(self, outputs):
        return self.fetches(outputs)

    def windows(self, encoder: TextEncoder, max_seq_length: int, question, context):
        """The one SQuAD preprocessor: windows `[CLS] query [SEP] doc-window [SEP]` (official
        layout) of every (question, context) row, in-graph. The context is cut into words at
        WORD_SEPARATORS, each WordPiece'd alone; windows of `room` tokens slide by doc_stride; a
        context without tokens gets one empty window. Returns `batch` (the inputs [W, L]),
        `request` [W] (each window's row), `token_word` / `token_index` [W, L] (each token's
        context word / index, -1 outside it), `max_context` [W, L], `window_splits` [N + 1], the
        context `words` with byte `begins` / `ends`, `doc_ids` / `doc_word` (sub-tokens, their
        words) and `num_tokens` [N]."""
        if self.max_query_length + 3 >= max_seq_length:
            raise ConfigError(f"{self.name}: --max_seq_length={max_seq_length} leaves no "
                              f"room for the context after a question of up to "
                              f"{self.max_query_length} tokens (max_query_length)")
        if self.doc_stride < 1:
            raise ConfigError(f"{self.name}: doc_stride must be positive, got "
                              f"{self.doc_stride}")
        L = max_seq_length
        specials = encoder.special_ids
        question = tf.convert_to_tensor(question, tf.string)
        context = tf.convert_to_tensor(context, tf.string)
        query = encoder.tokenize(question)[:, :self.max_query_length]
        query = tf.cast(query, tf.int32).with_row_splits_dtype(tf.int64)
        words, begins, ends = tf_text.regex_split_with_offsets(context, _DELIMITERS)
        # Word by word, as training tokenizes each distinct context word on its own.
        pieces = tf.cast(encoder.tokenize(words.flat_values), tf.int32)
        pieces = pieces.with_row_splits_dtype(tf.int64)
        n = words.nrows(out_type=tf.int64)
        doc_splits = tf.gather(pieces.row_splits, words.row_splits)
        num_tokens = doc_splits[1:] - doc_splits[:-1]
        word_of_token = tf.repeat(tf.range(tf.size(words.flat_values, tf.int64)),
                                  pieces.row_lengths())
        word_of_token -= tf.gather(words.row_splits,
                                   tf.gather(words.value_rowids(), word_of_token))

        # Windows of `room` tokens, `step` apart, the last one ending at the context's end.
        room = L - 3 - query.row_lengths()
        step = tf.minimum(room, self.doc_stride)
        count = tf.where(num_tokens <= room, tf.ones_like(room),
                         (num_tokens - room + step - 1) // step + 1)
        request = tf.repeat(tf.range(n), count)
        window_splits = tf.concat([[0], tf.cumsum(count)], 0)
        total = window_splits[-1]
        local = tf.range(total) - tf.gather(window_splits, request)
        start = local * tf.gather(step, request)
        length = tf.minimum(tf.gather(num_tokens, request) - start, tf.gather(room, request))
        first = tf.gather(doc_splits, request) + start
        index = tf.ragged.range(first, first + length)  # into the flat context tokens
        doc = index.with_flat_values(tf.gather(pieces.flat_values, index.flat_values))
        word = index.with_flat_values(
            tf.gather(word_of_token, index.flat_values)).with_row_splits_dtype(tf.int64)

        # A token's window: the first with the largest min(left, right) + 0.01 * length
        # (float64 as numpy).
        k = tf.ragged.range(length).flat_values
        span = tf.repeat(length, length)
        score = (tf.cast(tf.minimum(k, span - 1 - k), tf.float64)
                 + 0.01 * tf.cast(span, tf.float64))
        key = index.flat_values
        num_doc = tf.size(pieces.flat_values, tf.int64)
        best = tf.gather(tf.math.unsorted_segment_max(score, key, num_doc), key)
        window_of = tf.repeat(tf.range(total), length)
        owner = tf.math.unsorted_segment_min(
            tf.where(score == best, window_of, total), key, num_doc)
        max_context = index.with_flat_values(tf.gather(owner, key) == window_of)

        q = tf.gather(query, request)
        ones_w = tf.ones([total], tf.int64)

        def row(cls, q_fill, sep, body, last, default, dtype):
            """[CLS] query [SEP] window [SEP] of one per-token quantity, padded to L."""
            column = lambda v: tf.RaggedTensor.from_row_lengths(
                tf.fill([total], tf.cast(v, dtype)), ones_w)
            parts = [column(cls), tf.cast(q_fill, dtype), column(sep), tf.cast(body, dtype),
                     column(last)]
            return tf.concat(parts, axis=1).to_tensor(default_value=tf.cast(default, dtype),
                                                      shape=[None, L])

        ones_q, ones_d = tf.ones_like(q), tf.ones_like(doc)
        batch = {
            "input_ids": row(specials["[CLS]"], q, specials["[SEP]"], doc,
                             specials["[SEP]"], specials["[PAD]"], tf.int32),
            "input_mask": row(1, ones_q, 1, ones_d, 1, 0, tf.int32),
            "segment_ids": row(0, 0 * ones_q, 0, ones_d, 1, 0, tf.int32),
        }
        minus_q = -1 * tf.cast(ones_q, tf.int64)
        token_word = row(-1, minus_q, -1, word, -1, -1, tf.int64)
        token_index = row(-1, minus_q, -1, tf.ragged.range(start, start + length), -1, -1,
                          tf.int64)
        flags = row(0, 0 * ones_q, 0, tf.cast(max_context, tf.int32), 0, 0, tf.int32)
        return {"batch": batch, "request": request, "token_word": token_word,
                "token_index": token_index, "max_context": flags > 0,
                "window_splits": window_splits, "words": words, "begins": begins,
                "ends": ends, "num_tokens": num_tokens,
                "doc_ids": tf.RaggedTensor.from_row_splits(pieces.flat_values, doc_splits),
                "doc_word": tf.RaggedTensor.from_row_splits(word_of_token, doc_splits)}

    def _run(self, model, batch, L: int) -> Dict[str, tf.Tensor]:
        """The head's top-k outputs for every window, `serve_windows_per_call` at a time
        (equal chunks, padded with all-zero windows whose outputs are dropped)."""
        n = tf.shape(batch["input_ids"])[0]
        per = self.serve_windows_per_call
        chunks = tf.maximum(1, (n + per - 1) // per)
        size = tf.maximum(1, (n + chunks - 1) // chunks)
        elems = {k: tf.reshape(tf.pad(v, [[0, chunks * size - n], [0, 0]]), [chunks, size, L])
                 for k, v in batch.items()}
        keys = _TOP_K + (("null_logit",) if self.v2 else ())
        signature = {k: tf.int32 if k.endswith("index") else tf.float32 for k in keys}
        out = tf.map_fn(lambda b: self.fetches(model(b, training=False)), elems,
                        fn_output_signature=signature)
        return {k: tf.reshape(v, tf.concat([[chunks * size], tf.shape(v)[2:]], 0))[:n]
                for k, v in out.items()}

    def serve_text(self, model, encoder, max_seq_length, texts):
        """Answers [N] from raw `question` and `context`: postprocess's best span over a
        row's windows, as whole words cut from the context bytes. Outputs: answer (""
        when there is none or, v2, no_answer_probability > 0.5), start_word / end_word
        (-1 when none), score (-inf when none), v2: no_answer_probability."""
        context = tf.convert_to_tensor(texts["context"], tf.string)
        win = self.windows(encoder, max_seq_length, texts["question"], context)
        out = self._run(model, win["batch"], max_seq_length)
        s_lp, s_idx = out["start_top_log_probs"], out["start_top_index"]
        e_lp, e_idx = out["end_top_log_probs"], out["end_top_index"]
        token_word = win["token_word"]
        start_word = tf.gather(token_word, s_idx, batch_dims=1)  # [W, K]
        start_ok = (start_word >= 0) & tf.gather(win["max_context"], s_idx, batch_dims=1)
        end_word = tf.gather(token_word, e_idx, batch_dims=1)  # [W, K, K]
        width = e_idx - s_idx[:, :, None]
        valid = (start_ok[:, :, None] & (end_word >= 0) & (width >= 0)
                 & (width < self.max_answer_length))
        # float64 sums, as postprocess ranks them; invalid spans never win.
        score = tf.cast(s_lp, tf.float64)[:, :, None] + tf.cast(e_lp, tf.float64)
        score = tf.where(valid, score, tf.constant(-np.inf, tf.float64))
        k2 = tf.cast(tf.shape(s_idx)[1] ** 2, tf.int64)
        splits = win["window_splits"]
        # Row-major over (window, start, end): argmax's first maximum is postprocess's
        # first best candidate.
        per_row = tf.RaggedTensor.from_row_splits(tf.reshape(score, [-1]), splits * k2)
        dense = tf.concat([per_row.to_tensor(default_value=-np.inf),
                           tf.fill([per_row.nrows(), 1], tf.constant(-np.inf, tf.float64))],
                          axis=1)
        best = tf.argmax(dense, axis=1)
        best_score = tf.reduce_max(dense, axis=1)
        found = best_score > -np.inf
        flat = splits[:-1] * k2 + best
        pair_start = tf.broadcast_to(start_word[:, :, None], tf.shape(end_word))
        first_word = tf.where(found, tf.gather(tf.reshape(pair_start, [-1]), flat), -1)
        last_word = tf.where(found, tf.gather(tf.reshape(end_word, [-1]), flat), -1)

        word_starts = win["words"].row_splits[:-1]
        begins = tf.concat([win["begins"].flat_values, [0]], 0)
        ends = tf.concat([win["ends"].flat_values, [0]], 0)
        pad_word = tf.size(win["begins"].flat_values, tf.int64)
        begin = tf.gather(begins, tf.where(found, word_starts + first_word, pad_word))
        end = tf.gather(ends, tf.where(found, word_starts + last_word, pad_word))
        answer = tf.where(found, tf.strings.substr(context, begin, end - begin), "")
        result = {"start_word": tf.cast(first_word, tf.int32),
                  "end_word": tf.cast(last_word, tf.int32),
                  "score": tf.cast(best_score, tf.float32)}
        if self.v2:
            null = tf.math.unsorted_segment_min(out["null_logit"], win["request"],
                                                tf.size(win["num_tokens"]))
            # As postprocess: a context without tokens has no window to answer from.
            no_answer = tf.where(win["num_tokens"] > 0, tf.sigmoid(null), 1.0)
            answer = tf.where(no_answer > 0.5, "", answer)
            result["no_answer_probability"] = no_answer
        result["answer"] = answer
        return result

