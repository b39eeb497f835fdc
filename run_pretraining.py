"""Pre-trains ELECTRA: flags -> config -> `electra_tf.pretraining.pretrain.run`.

With no flags it pre-trains the `tiny` preset on the bundled Wikipedia sample (built into
./cache on first use) and writes checkpoints and TensorBoard logs to runs/pretrain_tiny.
Exit codes: 0 done, 1 bad flags or data (one line on stderr), 75 stopped by a preemption
notice (SIGTERM, a GCE maintenance event; electra_tf/training/preemption.py) after saving a
checkpoint, 130 stopped by Ctrl-C after saving one (rerun the same command to resume
either). 69 (a multi-process JAX job): another process of the job
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
from electra_tf.training.options import (PretrainingOptions, RunOptions,  # noqa: E402
                                         options_from_flags)

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "tiny", "A preset (tiny, small, small_plus, base, large) or a "
                    "JSON config file.")
flags.DEFINE_string("params_override", "", "Comma-separated key=value config overrides, "
                    "e.g. learning_rate=1e-3,model.generator_hidden_size=0.5.")
flags.DEFINE_string("model_dir", None, "Checkpoints, TensorBoard logs and config.json "
                    "(default runs/pretrain_<config>). A rerun resumes from here.")
flags.DEFINE_string("train_data", None, "TFRecord glob(s) or a tfrecord_builder output "
                    "directory; default: the bundled sample, built on first use.")
flags.DEFINE_string("eval_data", None, "Held-out TFRecords for --do_eval.")
flags.DEFINE_enum("generator_tying", None, list(configs.TYINGS),
                  "Weights the generator shares with the discriminator: none, the embeddings "
                  "(default), all (needs generator_hidden_size=1.0), or gdes (DeBERTaV3's "
                  "gradient-disentangled sharing: the discriminator reads the generator's "
                  "tables without gradient, plus its own deltas).")
configs.define_flags(configs.PretrainingConfig)
configs.define_flags(RunOptions)
flags.adopt_module_key_flags(configs.schema)  # --help lists them as this CLI's own
flags.DEFINE_bool("do_train", True, "Train.")
flags.DEFINE_bool("do_eval", False, "Report the metrics on held-out data (no dropout).")
flags.DEFINE_bool("count_flops", False, "Print the FLOPs of the configured run per component "
                  "(paper and hardware conventions; see electra_tf/pretraining/flops.py) and exit "
                  "without training.")

def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.INFO)
    from electra_tf.pretraining import pretrain
    from electra_tf.training import loop, preemption
    from tfrecord_builder import BuildError
    from electra_tf.conversion.formats import ConvertError
    try:
        cfg = configs.config_from_flags(FLAGS, configs.PretrainingConfig)
        if FLAGS.count_flops:
            from electra_tf.pretraining import flops
            print(flops.format_table(cfg, FLAGS.config))
            return
        # A config file on a bucket names the default run by its stem, never a local
        # folder named "gs:".
        config_name = (os.path.splitext(os.path.basename(FLAGS.config))[0]
                       if "://" in FLAGS.config else FLAGS.config)
        model_dir = FLAGS.model_dir or os.path.join("runs", f"pretrain_{config_name}")
        train_data, eval_data = FLAGS.train_data, FLAGS.eval_data
        if not train_data:  # the bundled sample; its last shard is held out
            from tfrecord_builder.sample import SAMPLE_VOCAB_SIZE, bundled_sample
            if cfg.model.vocab_size != SAMPLE_VOCAB_SIZE:
                raise configs.ConfigError(
                    f"no --train_data given, and the bundled sample uses the "
                    f"{SAMPLE_VOCAB_SIZE}-token BERT vocabulary but model.vocab_size="
                    f"{cfg.model.vocab_size}")
            train_data, held_out = bundled_sample(cfg.train.max_seq_length)
            eval_data = eval_data or held_out
        options = options_from_flags(FLAGS, PretrainingOptions, model_dir=model_dir,
                                     train_data=train_data, eval_data=eval_data)
        pretrain.run(cfg, options)
    except preemption.Preempted as e:
        print(f"run_pretraining: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except loop.USER_ERRORS + (BuildError, ConvertError) as e:
        print(f"run_pretraining: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
