"""Command line: `build` (default) packs a corpus into TFRecords; `learn_vocab` learns a
WordPiece vocabulary or a SentencePiece model from the same corpus. No logic lives here.
"""

import dataclasses
import gc
import os
import sys

from absl import app, flags, logging

from electra_tf import DEFAULT_CORPUS, DEFAULT_VOCAB
from tfrecord_builder import BuildError, import_tensorflow

DEFAULT_OUTPUT = os.path.join("cache", "tfrecords", "enwiki_sample-seq128")

FLAGS = flags.FLAGS
flags.DEFINE_list("input", [DEFAULT_CORPUS],
                  "Input files, directories or glob patterns (plain text, .gz, .bz2), local "
                  "or on any filesystem TensorFlow knows (gs://bucket/dir/*.txt): one "
                  "sentence per line, a blank line between documents.")
flags.DEFINE_string("output_dir", DEFAULT_OUTPUT,
                    "Where shards and manifest.json go (a local directory or gs://...).")
flags.DEFINE_integer("max_seq_length", 128, "Tokens per example, [CLS] and [SEP]s included.")
flags.DEFINE_integer("num_shards", 16, "Number of output TFRecord files.")
flags.DEFINE_integer("num_workers", os.cpu_count() or 1,
                     "Tokenizer processes; the output does not depend on it.")
flags.DEFINE_integer("seed", 12345, "Seed of the packing randomness.")
flags.DEFINE_string("vocab_file", DEFAULT_VOCAB, "WordPiece vocabulary (one token a line).")
flags.DEFINE_string("spm_model", None, "SentencePiece model; replaces --vocab_file.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case (and, for WordPiece, strip accents).")
flags.DEFINE_integer("chunk_bytes", 1 << 19,
                     "Input bytes per unit of work; part of the output's identity.")
flags.DEFINE_bool("resume", True, "Reuse the finished pieces of an interrupted build.")
flags.DEFINE_bool("overwrite", False, "Replace a different finished build in --output_dir.")
flags.DEFINE_string("tfds_name", None,
                    "Read a locally prepared tensorflow-datasets text dataset instead of "
                    "--input (e.g. wikipedia/20230601.en); nothing is downloaded.")
flags.DEFINE_string("tfds_split", "train", "Split of --tfds_name.")
flags.DEFINE_string("tfds_text_key", "text", "Feature of --tfds_name that holds the text.")
flags.DEFINE_string("tfds_data_dir", None, "tensorflow-datasets data_dir (default: TFDS's).")
flags.DEFINE_string("runner", None,
                    "Run the build as an Apache Beam pipeline on this runner (DirectRunner, "
                    "DataflowRunner, FlinkRunner, SparkRunner, ...). Needs the [beam] extra.")
flags.DEFINE_list("beam_options", [], "Extra Beam pipeline options, e.g. --project=x.")

# learn_vocab
flags.DEFINE_enum("vocab_type", "wordpiece", ["wordpiece", "sentencepiece"],
                  "learn_vocab: what to learn.")
flags.DEFINE_integer("vocab_size", 8000, "learn_vocab: target vocabulary size.")
flags.DEFINE_string("vocab_output", None,
                    "learn_vocab: output path (WordPiece: vocab.txt; SentencePiece: model "
                    "prefix, writes PREFIX.model and PREFIX.vocab; a directory works too).")
flags.DEFINE_enum("spm_model_type", "unigram", ["unigram", "bpe", "char", "word"],
                  "learn_vocab: SentencePiece model type.")
flags.DEFINE_integer("max_sentences", 2_000_000,
                     "learn_vocab: at most this many lines are sampled to learn from.")

SUBCOMMANDS = ("build", "learn_vocab")


def _build_config():
    """BuildConfig from the flags of the same names (--input gives `inputs`)."""
    from tfrecord_builder.build import BuildConfig
    fields = {f.name: FLAGS[f.name].value for f in dataclasses.fields(BuildConfig)
              if f.name not in ("inputs", "vocab_file")}
    return BuildConfig(**fields, inputs=() if FLAGS.tfds_name else tuple(FLAGS.input),
                       vocab_file=None if FLAGS.spm_model else FLAGS.vocab_file)


def _build():
    cfg = _build_config()
    if FLAGS.runner:
        from tfrecord_builder import beam_pipeline
        manifest = beam_pipeline.build_with_beam(cfg, FLAGS.runner, FLAGS.beam_options)
    else:
        from tfrecord_builder.build import build
        manifest = build(cfg)
    print(summary(manifest, cfg.output_dir))


# How the console names the reasons manifest.json records under skipped_lines.
SKIP_REASONS = {"invalid_utf8": "with invalid UTF-8", "nul_bytes": "with NUL bytes"}
# Counted under skipped_lines too, but the text is kept: the line is only cut.
LINE_SPLIT = "long_line_split"


def summary(manifest: dict, output_dir: str) -> str:
    """The console summary of a build. Retention counts the tokens of the lines that
    were read, so lines dropped before tokenization (binary junk) and inputs without text
    are reported beside it: they are otherwise only in manifest.json."""
    from electra_tf import fileio
    from electra_tf.data.manifest import MANIFEST_NAME
    shards = manifest["shards"]
    empty = sum(1 for s in shards if not s["examples"])
    lines = [f"{manifest['examples']} examples, {manifest['example_tokens']} of "
             f"{manifest['corpus_tokens']} corpus tokens kept (retention "
             f"{100 * manifest['retention']:.2f}%), {len(shards)} shards"
             f"{f' ({empty} empty)' if empty else ''} in {output_dir}"]
    counted = dict(manifest.get("skipped_lines", {}))
    split = counted.pop(LINE_SPLIT, 0)
    skipped = sum(counted.values())
    where = (f"; file:line examples in {fileio.join(output_dir, MANIFEST_NAME)}"
             if manifest.get("skipped_line_examples") else "")
    if skipped:
        why = ", ".join(f"{n} {SKIP_REASONS.get(reason, reason)}"
                        for reason, n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"{skipped} of {manifest['lines']} input lines skipped ({why}){where}")
    if split:
        lines.append(f"{split} over-long lines cut at a space and kept"
                     f"{'' if skipped else where}")
    empty_inputs = manifest.get("empty_inputs", [])
    if empty_inputs:
        shown = ", ".join(empty_inputs[:3]) + (", ..." if len(empty_inputs) > 3 else "")
        lines.append(f"{len(empty_inputs)} of {len(manifest['inputs'])} inputs hold no "
                     f"text: {shown}")
    return "\n".join(lines)


def _learn_vocab():
    from tfrecord_builder import tensorflow_installed
    if not tensorflow_installed():  # its WordPiece learner is tensorflow-text's
        raise BuildError("learn_vocab needs TensorFlow and tensorflow-text, which are not "
                         "installed: pip install -e \".[tensorflow]\" (building TFRecords "
                         "from an existing vocabulary does not)")
    from tfrecord_builder import vocab_learning
    if not FLAGS.vocab_output:
        raise BuildError("learn_vocab: give --vocab_output")
    path = vocab_learning.learn_vocab(
        inputs=FLAGS.input, output=FLAGS.vocab_output, vocab_type=FLAGS.vocab_type,
        vocab_size=FLAGS.vocab_size, do_lower_case=FLAGS.do_lower_case,
        max_sentences=FLAGS.max_sentences, seed=FLAGS.seed,
        spm_model_type=FLAGS.spm_model_type)
    print(f"wrote {path}")


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] not in SUBCOMMANDS):
        raise app.UsageError(f"unknown arguments {argv[1:]}; subcommands: {', '.join(SUBCOMMANDS)}")
    command = argv[1] if len(argv) == 2 else "build"
    # Here rather than before app.run: imported once absl has parsed the flags,
    # TensorFlow probes for GPUs during the import (a CUDA error line where none is).
    _import_tensorflow_quietly()
    # TensorFlow's million objects, alive until exit: out of the collector's passes, during
    # the build and at exit (0.5-0.8 s a process of tearing them down otherwise).
    gc.freeze()
    from electra_tf.text import VocabError
    logging.set_verbosity(logging.INFO)
    try:
        _build() if command == "build" else _learn_vocab()
    except (BuildError, VocabError) as e:
        print(f"tfrecord_builder: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("tfrecord_builder: interrupted; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)


def _import_tensorflow_quietly():
    """`import_tensorflow` without TensorFlow's start-up lines (electra_tf.quiet): they
    would bury the one-line error of a bad flag. A failed import raises again where
    TensorFlow is used."""
    from electra_tf import quiet
    with quiet.quiet_native_stderr():
        try:
            import_tensorflow()
        except Exception:  # pylint: disable=broad-except
            pass


def run():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main)
