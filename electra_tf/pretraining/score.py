"""Scores text with an ELECTRIC model: one pass, no masking.

ELECTRIC's discriminator outputs an energy E(x_t | x) per token; -sum_t E over a text's
word pieces is its unnormalised pseudo-log-likelihood (Clark et al. 2020, section 5: one
pass where a masked LM needs one per token). Special tokens and padding do not count.

    python -m electra_tf.pretraining.score --model_dir=runs/electric --input=sentences.txt
        [--output=scores.tsv] [--vocab_file=... | --spm_model=...] [--max_seq_length=128]

Writes one row per input line, `line<TAB>score<TAB>tokens<TAB>text` (line numbers from 1,
`tokens` = the scored word pieces); blank lines get no row, and a text longer than
max_seq_length - 2 pieces is scored on its first pieces (counted in the log). Every path
may be on Cloud Storage; the output is written whole or not at all.
"""

import os
import sys
from typing import List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from electra_tf import DEFAULT_VOCAB, fileio  # noqa: E402
from electra_tf.configs import PretrainingConfig  # noqa: E402
from electra_tf.conversion import source  # noqa: E402
from electra_tf.conversion.formats import ConvertError  # noqa: E402
from electra_tf.text import TextEncoder, VocabError  # noqa: E402
from electra_tf.model.modeling import ElectraPretrainingModel, tf1_variables  # noqa: E402
from electra_tf.pretraining.losses import pseudo_log_likelihood  # noqa: E402
from electra_tf.pretraining.objectives import OBJECTIVES  # noqa: E402
from electra_tf.training.checkpoints import assign_arrays  # noqa: E402


class ScoreError(ValueError):
    """A bad --model_dir, vocabulary or input; the message is one line."""


def load_run(model_dir: str, checkpoint: Optional[str] = None,
             objective: Optional[str] = None
             ) -> Tuple[PretrainingConfig, ElectraPretrainingModel, str]:
    """(config, float32 model with its objective's heads, checkpoint path) of a
    pre-training run in `model_dir`: its config.json and its newest complete checkpoint
    (or `checkpoint`; `conversion.source`), every model weight checked to be there.
    `objective`: the run must have been trained with it."""
    found = source.find_run_config(model_dir)
    if found is None:
        raise ScoreError(f"--model_dir={model_dir}: no config.json (not a pre-training run "
                         "directory)")
    config_path, cfg = found
    if objective and cfg.objective.objective != objective:
        raise ScoreError(f"{config_path}: objective {cfg.objective.objective}, not "
                         f"{objective}")
    src = source.resolve(checkpoint or model_dir, cfg.model,
                         "--checkpoint" if checkpoint else "--model_dir")
    model = ElectraPretrainingModel(src.config, dtype="float32",
                                    heads=OBJECTIVES[cfg.objective.objective].heads)
    try:
        assign_arrays(model, src.arrays(tf1_variables(model)))
    except ValueError as e:
        raise ScoreError(f"{src.path}: does not hold this run's model "
                         f"({str(e).splitlines()[0]})") from None
    return cfg, model, src.path


class Scorer:
    """Texts -> pseudo-log-likelihoods with a restored ELECTRIC model."""

    def __init__(self, model: ElectraPretrainingModel, text_encoder, max_seq_length: int,
                 batch_size: int = 32):
        self.model, self.text = model, text_encoder
        self.max_seq_length, self.batch_size = int(max_seq_length), int(batch_size)
        special = text_encoder.special_ids
        self._not_scored = tf.constant(sorted({special["[CLS]"], special["[SEP]"],
                                               special["[PAD]"], special["[MASK]"]}))
        self._energies = tf.function(self._energy_fn, reduce_retracing=True)

    def _energy_fn(self, input_ids, input_mask, segment_ids):
        energies = self.model.discriminator(input_ids, input_mask, segment_ids,
                                            training=False)
        special = tf.reduce_any(input_ids[..., None] == self._not_scored, -1)
        weights = tf.cast(input_mask, tf.float32) * tf.cast(~special, tf.float32)
        return pseudo_log_likelihood(energies, weights), tf.reduce_sum(weights, -1)

    def score(self, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> (scores [N] float, scored pieces [N] int, truncated [N] bool)."""
        scores, counts, truncated = [], [], []
        for start in range(0, len(texts), self.batch_size):
            chunk = tf.constant(list(texts[start:start + self.batch_size]))
            pieces = self.text.tokenize(chunk)
            lengths = pieces.row_lengths().numpy()
            inputs = self.text.pack(pieces, max_seq_length=self.max_seq_length)
            s, n = self._energies(inputs["input_ids"], inputs["input_mask"],
                                  inputs["segment_ids"])
            scores.append(s.numpy())
            counts.append(n.numpy().astype(np.int64))
            truncated.append(lengths > self.max_seq_length - 2)
        if not scores:
            return np.zeros([0]), np.zeros([0], np.int64), np.zeros([0], bool)
        return np.concatenate(scores), np.concatenate(counts), np.concatenate(truncated)


def read_lines(path: str) -> List[Tuple[int, str]]:
    """(line number from 1, text) of every non-blank line of a UTF-8 text file."""
    if not fileio.exists(path):
        raise ScoreError(f"--input={path}: no such file")
    out = []
    try:
        for number, line in enumerate(fileio.open_text_lines(path), 1):
            text = line.rstrip("\r\n")
            if text.strip():
                out.append((number, text))
    except UnicodeDecodeError as e:
        raise ScoreError(f"{path}: line {len(out) + 1} or near it is not UTF-8 ({e.reason})"
                         ) from None
    return out


def define_flags():
    flags.DEFINE_string("model_dir", None, "An objective=electric pre-training run "
                        "(config.json + checkpoints).")
    flags.DEFINE_string("checkpoint", None, "A checkpoint path (default: the latest in "
                        "--model_dir).")
    flags.DEFINE_string("input", None, "Text file, one text per line.")
    flags.DEFINE_string("output", None, "TSV of line, score, scored pieces, text (default: "
                        "stdout).")
    flags.DEFINE_string("vocab_file", None, "WordPiece vocabulary (default: the bundled BERT "
                        "uncased one).")
    flags.DEFINE_string("spm_model", None, "SentencePiece model instead of --vocab_file.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case WordPiece input.")
    flags.DEFINE_integer("max_seq_length", None, "Pieces per text incl. [CLS]/[SEP] "
                         "(default: the run's train.max_seq_length).")
    flags.DEFINE_integer("batch_size", 32, "Texts per forward pass.")
    flags.mark_flags_as_required(["model_dir", "input"])


def main(argv):
    del argv
    f = flags.FLAGS
    try:
        # Only an ELECTRIC discriminator outputs energies.
        cfg, model, path = load_run(f.model_dir, f.checkpoint, objective="electric")
        vocab = None if f.spm_model else (f.vocab_file or DEFAULT_VOCAB)
        text = TextEncoder(vocab, f.do_lower_case, f.spm_model)
        if text.vocab_size != cfg.model.vocab_size:
            raise ScoreError(f"{vocab or f.spm_model}: {text.vocab_size} tokens, but the "
                             f"model's vocabulary has {cfg.model.vocab_size}")
        lines = read_lines(f.input)
        length = f.max_seq_length or cfg.train.max_seq_length
        if not 3 <= length <= cfg.model.max_position_embeddings:
            raise ScoreError(f"--max_seq_length={length} must be in 3.."
                             f"{cfg.model.max_position_embeddings}")
    except (ScoreError, ConvertError, VocabError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    logging.info("Scoring %d texts of %s with %s", len(lines), f.input, path)
    scores, counts, truncated = Scorer(model, text, length, f.batch_size).score(
        [t for _, t in lines])
    if truncated.any():
        logging.warning("%d of %d texts are longer than %d pieces and were scored on their "
                        "first ones", int(truncated.sum()), len(lines), length - 2)
    rows = "".join(f"{number}\t{score:.4f}\t{count}\t{text}\n"
                   for (number, text), score, count in zip(lines, scores, counts))
    if f.output:
        fileio.write_atomic(f.output, rows)
        logging.info("Wrote %d scores to %s", len(lines), f.output)
    else:
        sys.stdout.write(rows)
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
