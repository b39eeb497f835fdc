"""The jobs on the TensorFlow runtime from a `tf.distribute.Strategy`, as most tests build
them: `tf_pretrainer(cfg, strategy, ...)` and `tf_finetuner(task, model_config, cfg,
strategy, ...)` (`backends.setup` makes the devices in a run)."""

import tensorflow as tf

from electra_tf.finetune.trainer import make_finetuner
from electra_tf.pretraining.trainer import make_pretrainer
from electra_tf.training.tf_runtime.devices import TfDevices


def tf_pretrainer(cfg, strategy=None, special_ids=None, unigram_counts=None, jit_compile=None):
    return make_pretrainer(cfg, TfDevices(strategy or tf.distribute.get_strategy()),
                           special_ids, unigram_counts, jit_compile)


def tf_finetuner(task, model_config, cfg, strategy, steps, init_checkpoint, seed,
                 jit_compile=None):
    return make_finetuner(task, model_config, cfg, TfDevices(strategy), steps,
                          init_checkpoint, seed, jit_compile)
