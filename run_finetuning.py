"""Fine-tunes a pre-trained ELECTRA discriminator: flags -> task and config ->
`electra_tf.finetune.trainer.run`.

With no flags it fine-tunes the checkpoint left by `python run_pretraining.py` on the
bundled movie-snippets polarity set (8,568 / 2,000 sentences), prints dev accuracy beside
that of the same recipe from random initialisation, exports a SavedModel and answers one
raw-text request from it. Exit codes: 0 done, 1 bad flags or data (one line on stderr),
75 stopped by a preemption notice (SIGTERM, a GCE maintenance event;
electra_tf/training/preemption.py) after saving a checkpoint, 130 stopped by Ctrl-C after
saving one (rerun the same command to resume either). 69 (a multi-process JAX job): another process of the job
was lost (one line names it; electra_tf/training/jax_runtime/guard.py): rerun every process
to resume from the last checkpoint.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

# --backend (or KERAS_BACKEND) before anything imports Keras.
from electra_tf import backend  # noqa: E402

try:
    backend.select()
except backend.BackendError as e:
    sys.exit(f"{os.path.basename(__file__)}: error: {e}")

# No TensorFlow import in these two:
from electra_tf import configs  # noqa: E402
from electra_tf.training.options import RunOptions  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("task", "polarity", "sst2, cola, mrpc, stsb, qqp, mnli, qnli, rte, "
                    "squad_v1, squad_v2, chunk, ner, polarity (the bundled set), or the name "
                    "of a TSV task of your own (with --text_columns and --label_column).")
flags.DEFINE_string("data_dir", None, "Holds <task>/{train,dev}.tsv (GLUE folder names "
                    "such as SST-2 work too; test.tsv for --do_predict), "
                    "squad/{train,dev}-v*.json or chunk/{train,dev}.txt. Default: the "
                    "bundled data/.")
flags.DEFINE_enum("data_source", "auto", ["auto", "files", "tfds"], "files: the "
                  "--data_dir files. tfds: GLUE and SQuAD as tensorflow-datasets has prepared "
                  "them under --tfds_data_dir (glue/<task>, glue/ax, squad/v1.1, "
                  "squad/v2.0; prepare with `tfds build glue/sst2 --data_dir DIR`; nothing "
                  "is downloaded here). auto: tfds when --tfds_data_dir is given, else files.")
flags.DEFINE_string("tfds_data_dir", None, "Where tensorflow-datasets prepared the data "
                    "(implies --data_source=tfds); with --data_source=tfds and no value, "
                    "TFDS's default ($TFDS_DATA_DIR or ~/tensorflow_datasets).")
flags.DEFINE_bool("do_predict", False, "GLUE: after training, write the median trial's "
                  "test-set predictions to <model_dir>/predictions/<TASK>.tsv in the "
                  "leaderboard's format (CoLA, SST-2, MRPC, STS-B, QQP, MNLI-m, MNLI-mm, "
                  "QNLI, RTE; AX with MNLI when diagnostic.tsv is in MNLI/ or diagnostic/, "
                  "or glue/ax is prepared). Reads test.tsv (MNLI: test_matched.tsv, "
                  "test_mismatched.tsv) or the tfds test splits.")
flags.DEFINE_string("init_checkpoint", None, "Pre-trained discriminator: a pre-training "
                    "model_dir, its discriminator/ export, a ckpt-N prefix or a released "
                    "TF1 checkpoint; `none` for a randomly initialised baseline. Default: "
                    "runs/pretrain_tiny.")
flags.DEFINE_bool("untrained_baseline", None, "Also fine-tune a randomly initialised model "
                  "of the same size with the same recipe and seeds (in <model_dir>/untrained) "
                  "and print its dev score beside the checkpoint's: what pre-training bought. "
                  "Default: on for the bundled demo, off otherwise.")
flags.DEFINE_string("config", None, "Model preset or JSON (default: the config.json of the "
                    "pre-training run that wrote --init_checkpoint).")
flags.DEFINE_string("finetune_config", None, "A JSON file of fine-tuning hyper-parameters "
                    "(electra_tf.configs.FinetuneConfig keys, e.g. {\"learning_rate\": 1e-4, "
                    "\"num_train_epochs\": 2}); --params_override and the flags below win "
                    "over it.")
flags.DEFINE_string("params_override", "", "Comma-separated key=value FinetuneConfig "
                    "overrides, e.g. learning_rate=1e-4,epsilon=1e-8,steps_per_loop=20; "
                    "the flags win over it.")
flags.DEFINE_string("model_dir", None, "Trial checkpoints, TensorBoard logs and "
                    "results.json (default runs/finetune_<task>). A rerun resumes here.")
flags.DEFINE_string("export_dir", None, "Write SavedModels (task + encoder) here; default "
                    "<model_dir>/export for the bundled demo, none otherwise.")
flags.DEFINE_list("text_columns", [], "User TSV task: header names of one or two text "
                  "columns.")
flags.DEFINE_string("label_column", None, "User TSV task: header name of the label column "
                    "(tagging: the CoNLL column index of the label).")
flags.DEFINE_list("labels", None, "User TSV task: the labels (default: read from "
                  "train.tsv; an empty value makes it a regression).")
flags.DEFINE_enum("metric", "accuracy", ["accuracy", "accuracy_f1", "mcc",
                                         "pearson_spearman"], "User TSV task metric.")
flags.DEFINE_string("vocab_file", None, "WordPiece vocabulary (default: the bundled BERT "
                    "uncased one, that of the pre-training demo).")
flags.DEFINE_string("spm_model", None, "SentencePiece model instead of --vocab_file.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents.")
configs.define_flags(configs.FinetuneConfig)
configs.define_flags(RunOptions)
flags.adopt_module_key_flags(configs.schema)  # --help lists them as this CLI's own
REPO = os.path.dirname(os.path.abspath(__file__))  # local-only: this checkout (bundled data)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.INFO)
    from electra_tf.finetune import cli
    from electra_tf.training.preemption import Preempted
    try:
        cli.main(FLAGS, REPO)
    except Preempted as e:
        print(f"run_finetuning: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except cli.USER_ERRORS as e:
        print(f"run_finetuning: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
