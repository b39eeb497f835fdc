"""Scores text with an ELECTRIC model: its discriminator outputs an energy E(x_t | x) per
token, and -sum_t E over a text's word pieces is its unnormalised pseudo-log-likelihood
(Clark et al. 2020, section 5: one pass, no masking, where a masked LM needs one per
token). Special tokens and padding do not count.

    python -m electra_tf.pretraining.score --model_dir=runs/electric --input=sentences.txt
        [--output=scores.tsv] [--vocab_file=... | --spm_model=...] [--max_seq_length=128]

Writes one row per input line, `line<TAB>score<TAB>tokens<TAB>text` (line numbers from 1,
`tokens` = the scored word pieces); blank lines get no row, and a text longer than
max_seq_length - 2 pieces is scored on its first pieces (counted in the log). Every path
may be on Cloud Storage; the output is written whole or not at all."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402


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
    # Imported here, so that --help answers before TensorFlow loads.
    from electra_tf import DEFAULT_VOCAB, fileio
    from electra_tf.conversion.formats import ConvertError
    from electra_tf.pretraining.scoring import Scorer, ScoreError, load_run, read_lines
    from electra_tf.text import TextEncoder, VocabError
    f = flags.FLAGS
    try:
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
