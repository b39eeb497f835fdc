"""The fine-tuning run: config, one XLA-compiled train step under a tf.distribute
strategy with layer-wise learning rates, evaluation, trials and their median.

Per trial: seed -> fresh model -> encoder from the pre-trained checkpoint -> train for the
task's epochs (no early stopping, as the paper) -> dev metrics -> `trial_<i>/` checkpoint.
A trial already finished (its `result.json`) is not rerun; a trial stopped by SIGTERM
saves its position and resumes from it.
"""

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from electra_tf import distribute, fileio, rng
from electra_tf.configs import ConfigError, ModelConfig
from electra_tf.finetune.model import (FinetuningModel, init_encoder, layerwise_lr_multipliers,
                                       make_head)
from electra_tf.finetune.tasks import Task, TaskData
from electra_tf.optimization import (AdamW, WarmupPolynomialDecay, clip_by_global_norm,
                                     update_loss_scale)
from electra_tf.pretraining import default_jit
from electra_tf.preemption import PreemptionWatch
from electra_tf.checkpoints import remove_torn_checkpoints, save_checkpoint
from electra_tf.train import _format_time, _Progress


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of a fine-tuning run (paper Appendix B defaults where None)."""
    learning_rate: Optional[float] = None  # None: 3e-4 small, 1e-4 base, 5e-5 large
    layerwise_lr_decay: Optional[float] = None  # None: 0.8, 0.9 for large
    official_lr_bug: bool = False  # the official code's top-layer decay^2
    num_train_epochs: Optional[float] = None  # None: the task's (3; 10 RTE/STS-B; 2 SQuAD)
    train_batch_size: int = 32
    eval_batch_size: int = 32
    max_seq_length: int = 128
    warmup_proportion: float = 0.1
    weight_decay: float = 0.0
    adam_epsilon: float = 1e-6
    clip_norm: float = 1.0
    num_trials: int = 1
    seed: int = 1
    precision: str = "auto"
    steps_per_loop: int = 50
    save_checkpoints_steps: int = 1000

    def resolved(self, model: ModelConfig, task: Task) -> "FinetuneConfig":
        large = model.hidden_size >= 1024
        lr = self.learning_rate
        if lr is None:
            lr = 5e-5 if large else (1e-4 if model.hidden_size >= 768 else 3e-4)
        decay = self.layerwise_lr_decay
        if decay is None:
            decay = 0.9 if large else 0.8
        epochs = task.num_train_epochs if self.num_train_epochs is None else self.num_train_epochs
        return dataclasses.replace(self, learning_rate=lr, layerwise_lr_decay=decay,
                                   num_train_epochs=float(epochs))

    def check(self):
        for name in ("train_batch_size", "eval_batch_size", "max_seq_length", "num_trials",
                     "steps_per_loop", "save_checkpoints_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name}={getattr(self, name)} must be at least 1")
        if self.layerwise_lr_decay is not None and not 0 < self.layerwise_lr_decay <= 1:
            raise ConfigError(f"--layerwise_lr_decay={self.layerwise_lr_decay} must be in (0, 1]")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ConfigError(f"--learning_rate={self.learning_rate} must be > 0")
        if self.num_train_epochs is not None and self.num_train_epochs <= 0:
            raise ConfigError(f"--num_train_epochs={self.num_train_epochs} must be > 0")
        return self


def pad_rows(arrays: Dict[str, np.ndarray], multiple: int) -> Dict[str, np.ndarray]:
    """Pads every array to a multiple of `multiple` rows (copies of row 0, weight 0), so
    that evaluation runs whole batches of one shape (one XLA compilation)."""
    n = len(arrays["weight"])
    extra = -n % multiple
    if not extra:
        return arrays
    out = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in arrays.items()}
    out["weight"][n:] = 0.0
    return out


class Finetuner:
    """One trial: the model, optimizer and step counter, and the compiled functions."""

    def __init__(self, task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
                 strategy: tf.distribute.Strategy, num_train_steps: int,
                 init_checkpoint: Optional[str], seed: int, jit_compile: Optional[bool] = None):
        self.task, self.cfg, self.strategy = task, cfg, strategy
        self.num_train_steps = num_train_steps
        keras.utils.set_random_seed(seed)
        # Dropout masks are a function of this, the step and the row: a resumed trial
        # redraws the masks an uninterrupted one would have drawn.
        self.base_seed = tf.constant([seed, 0xF17E], tf.int32)
        with strategy.scope():
            head = make_head(task.kind, model_config, task.num_outputs(), **task.head_options())
            self.model = FinetuningModel(model_config, head)
            if init_checkpoint:
                self.init_path = init_encoder(self.model.electra, init_checkpoint)
            self.variables = list(self.model.trainable_variables)
            schedule = WarmupPolynomialDecay(
                cfg.learning_rate, num_train_steps,
                int(round(cfg.warmup_proportion * num_train_steps)), 0.0, 1.0)
            self.optimizer = AdamW(schedule, weight_decay=cfg.weight_decay,
                                   epsilon=cfg.adam_epsilon, bias_correction=False)
            self.optimizer.build(self.variables)
            agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="global_step", aggregation=agg)
            # float16 (the global Keras policy) scales the loss dynamically, as pre-training.
            self.float16 = keras.mixed_precision.global_policy().compute_dtype == "float16"
            self.loss_scale = tf.Variable(2.0 ** 15 if self.float16 else 1.0, trainable=False,
                                          name="loss_scale", aggregation=agg)
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="loss_scale_good_steps", aggregation=agg)
            # Training batches consumed: the data position a resumed trial skips to. It
            # runs ahead of global_step by the steps skipped for non-finite gradients.
            self.data_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="data_batches", aggregation=agg)
        multipliers = layerwise_lr_multipliers(self.model, cfg.layerwise_lr_decay,
                                               cfg.official_lr_bug)
        self.lr_multipliers = [(v, multipliers[v.path]) for v in self.variables]
        if jit_compile is None:
            jit_compile = default_jit(strategy)
        self._replica_step = tf.function(self._step_fn, jit_compile=jit_compile)
        self._replica_eval = tf.function(self._eval_fn, jit_compile=jit_compile)
        self.trace_count = 0

    def checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                   global_step=self.global_step, loss_scale=self.loss_scale,
                                   loss_scale_good_steps=self.good_steps,
                                   data_batches=self.data_batches)

    # ------------------------------------------------------------------ replica functions

    def _step_fn(self, batch):
        self.trace_count += 1
        global_batch = float(self.cfg.train_batch_size)
        ctx = tf.distribute.get_replica_context()
        first_row = ctx.replica_id_in_sync_group * tf.shape(batch["weight"])[0]
        seed = rng.step_seed(self.base_seed, tf.cast(self.global_step, tf.int32), first_row)
        with tf.GradientTape() as tape:
            outputs = self.model(batch, training=True, seed=seed)
            per_example = self.task.loss(outputs, batch)
            loss = tf.reduce_sum(per_example * batch["weight"]) / global_batch
            scaled = loss * tf.cast(self.loss_scale, tf.float32)
        grads = tape.gradient(scaled, self.variables)
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        inv_scale = 1.0 / tf.cast(self.loss_scale, tf.float32)
        grads = [None if g is None else g * inv_scale for g in grads]
        grads, norm = clip_by_global_norm(grads, self.cfg.clip_norm)
        finite = tf.math.is_finite(norm)
        self.optimizer.apply_gradients(zip(grads, self.variables), self.global_step,
                                       lr_multipliers=self.lr_multipliers, should_update=finite)
        if self.float16:
            update_loss_scale(self.loss_scale, self.good_steps, finite)
        self.global_step.assign_add(tf.cast(finite, tf.int64))
        return {"loss": loss, "skipped": 1.0 - tf.cast(finite, tf.float32)}

    def _eval_fn(self, batch):
        outputs = self.model(batch, training=False)
        fetched = dict(self.task.fetches(outputs))
        per_example = self.task.loss(outputs, batch) if "label" in batch or \
            "start_positions" in batch or "label_ids" in batch else None
        if per_example is not None:
            fetched["_loss"] = per_example
        return fetched

    # ------------------------------------------------------------------ host side

    def make_train_loop(self):
        @tf.function
        def train_loop(iterator, num_steps):
            loss, skipped = tf.constant(0.0), tf.constant(0.0)
            for _ in tf.range(num_steps):
                out = self.strategy.run(self._replica_step, args=(next(iterator),))
                loss += self.strategy.reduce(tf.distribute.ReduceOp.SUM, out["loss"], None)
                # Every replica reports the same skip flag: take one.
                skipped += self.strategy.reduce(tf.distribute.ReduceOp.MEAN, out["skipped"],
                                                None)
            return {"loss": loss, "skipped": skipped}

        return train_loop

    def train_dataset(self, data: TaskData, seed: int, skip_batches: int = 0):
        """Shuffled (a fresh order each epoch, a function of the seed), repeated global
        batches; a resumed trial skips the batches it has consumed."""
        ds = tf.data.Dataset.from_tensor_slices(data.arrays)
        ds = ds.shuffle(data.num_examples, seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(self.cfg.train_batch_size, drop_remainder=True).skip(skip_batches)
        return self.strategy.experimental_distribute_dataset(ds.prefetch(2))

    def predict(self, data: TaskData) -> Dict[str, np.ndarray]:
        """Runs the model over a split (no dropout) and returns the fetched arrays."""
        batch = self.cfg.eval_batch_size
        arrays = pad_rows(data.arrays, batch)
        ds = tf.data.Dataset.from_tensor_slices(arrays).batch(batch, drop_remainder=True)
        parts: Dict[str, List[np.ndarray]] = {}
        for element in self.strategy.experimental_distribute_dataset(ds):
            out = self.strategy.run(self._replica_eval, args=(element,))
            for k, v in out.items():
                parts.setdefault(k, []).append(self.strategy.gather(v, axis=0).numpy())
        return {k: np.concatenate(v)[:data.num_examples] for k, v in parts.items()}

    def evaluate(self, data: TaskData) -> Dict[str, float]:
        fetched = self.predict(data)
        result = self.task.metrics(data, fetched)
        if "_loss" in fetched:
            weight = data.arrays["weight"][:data.num_examples]
            result["loss"] = float(np.sum(fetched["_loss"] * weight) / max(weight.sum(), 1.0))
        return result


# --------------------------------------------------------------------------- the run

def num_train_steps(num_examples: int, cfg: FinetuneConfig) -> int:
    return max(1, int(math.ceil(num_examples * cfg.num_train_epochs / cfg.train_batch_size)))


def _write_json(path: str, data: Any):
    fileio.write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_predictions(task: Task, finetuner: Finetuner, tests: List[TaskData],
                      out_dir: str, chief: bool = True) -> Dict[str, str]:
    """`<out_dir>/<name>.tsv` for each test split, in the GLUE leaderboard's format
    (`index<TAB>prediction`, the test file's index column, label strings or STS-B scores);
    each written to a temporary file, then renamed. Every worker must call it (prediction
    is collective); only the chief writes. Any filesystem (gs://...). Returns {name: path}."""
    paths = {}
    for data in tests:
        labels = task.predicted_labels(data, finetuner.predict(data))
        if not chief:
            continue
        fileio.makedirs(out_dir)
        lines = ["index\tprediction"] + [f"{i}\t{p}" for i, p in zip(data.meta, labels)]
        path = os.path.join(out_dir, f"{data.name}.tsv")
        fileio.write_atomic(path, "\n".join(lines) + "\n")
        paths[data.name] = path
        logging.info("Wrote %d test predictions to %s", len(labels), path)
    return paths


def train_trial(finetuner: Finetuner, train: TaskData, trial_dir: str, seed: int,
                writer=None) -> None:
    """Trains one trial to its last step, checkpointing every `save_checkpoints_steps`
    and on a preemption notice (then raises Preempted); resumes from `trial_dir` if it
    holds one, at the data position it had reached."""
    cfg, total = finetuner.cfg, finetuner.num_train_steps
    remove_torn_checkpoints(trial_dir)
    manager = tf.train.CheckpointManager(finetuner.checkpoint(), trial_dir, max_to_keep=1,
                                         step_counter=finetuner.global_step)
    if manager.latest_checkpoint:
        # A checkpoint from before data_batches existed restores global_step only.
        finetuner.data_batches.assign(-1)
        finetuner.checkpoint().restore(manager.latest_checkpoint).assert_existing_objects_matched()
        if int(finetuner.data_batches.numpy()) < 0:
            finetuner.data_batches.assign(finetuner.global_step)
        logging.info("Resumed trial from %s", manager.latest_checkpoint)
    step = int(finetuner.global_step.numpy())
    skip = int(finetuner.data_batches.numpy())
    iterator = iter(finetuner.train_dataset(train, seed, skip_batches=skip))
    loop = finetuner.make_train_loop()
    progress = _Progress(step, total, cfg.train_batch_size)
    last_saved = step  # a loop of only skipped (non-finite) steps does not save again
    with PreemptionWatch(finetuner.strategy, what="trial") as preemption:
        while step < total:
            n = min(cfg.steps_per_loop, total - step,
                    cfg.save_checkpoints_steps - step % cfg.save_checkpoints_steps)
            sums = loop(iterator, tf.constant(n))
            finetuner.data_batches.assign_add(n)
            step = int(finetuner.global_step.numpy())
            loss = float(sums["loss"]) / n
            seqs, eta = progress.rates(step)
            lr = float(finetuner.optimizer.learning_rate(step))
            skipped = int(round(float(sums["skipped"])))
            logging.info("step %d/%d | loss %.4f | lr %.3g | %.1f seq/s | ETA %s%s", step,
                         total, loss, lr, seqs, _format_time(eta),
                         f" | skipped {skipped} non-finite step(s)" if skipped else "")
            if writer is not None:
                with writer.as_default(step=step):
                    tf.summary.scalar("loss", loss)
                    tf.summary.scalar("learning_rate", lr)
            progress.loop_done(step)
            periodic = step != last_saved and (step % cfg.save_checkpoints_steps == 0 or
                                               step >= total)
            path = save_checkpoint(manager, step) if periodic else None
            last_saved = step if periodic else last_saved
            preemption.stop_if_noticed(step, lambda: path or save_checkpoint(manager, step))


def median_trial(scores: List[float]) -> int:
    """Index of the trial whose score is the (lower) median."""
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return order[(len(order) - 1) // 2]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Where things are and how to run: everything that is not a hyper-parameter."""
    data_dir: str
    model_dir: str
    init_checkpoint: Optional[str] = None
    export_dir: Optional[str] = None
    vocab_file: Optional[str] = None
    spm_model: Optional[str] = None
    do_lower_case: bool = True
    strategy: str = "auto"
    tpu: Optional[str] = None  # local, a TPU's name or grpc://HOST:PORT (distribute.py)
    tpu_zone: Optional[str] = None
    gcp_project: Optional[str] = None
    jit_compile: Optional[bool] = None
    do_predict: bool = False  # test-set predictions of the median trial


def _evaluate_all(finetuner: Finetuner, evals: List[TaskData]) -> Dict[str, float]:
    """Metrics of every dev split; the first split's names are plain, the others are
    prefixed by their file name (MNLI mismatched: `dev_mismatched/accuracy`) or tfds split
    (`validation_mismatched/accuracy` from `glue/mnli:validation_mismatched`)."""
    result: Dict[str, float] = {}
    for i, data in enumerate(evals):
        prefix = os.path.splitext(data.name.rsplit(":", 1)[-1])[0]
        for k, v in finetuner.evaluate(data).items():
            result[k if i == 0 else f"{prefix}/{k}"] = v
    return result


def run(task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
        options: RunOptions) -> Dict[str, Any]:
    """Fine-tunes `num_trials` seeds, writes `results.json` (every trial's metrics, the
    median of the task's primary metric), with an export_dir exports the median trial and
    with do_predict writes its test-set predictions to `<model_dir>/predictions/`
    (`write_predictions`). Returns the results dict."""
    from electra_tf.finetune import export as export_lib
    from electra_tf.finetune.text import TextEncoder

    strategy = distribute.make_strategy(options.strategy, options.tpu, options.tpu_zone,
                                        options.gcp_project)
    precision = cfg.precision
    if precision == "auto":
        precision = distribute.default_precision(strategy)
    distribute.set_precision(precision)
    cfg = cfg.resolved(model_config, task).check()
    chief = distribute.is_chief(strategy)
    encoder = TextEncoder(options.vocab_file, options.do_lower_case, options.spm_model)
    if encoder.vocab_size != model_config.vocab_size:
        raise ConfigError(f"the vocabulary {encoder.vocab_path} has {encoder.vocab_size} "
                         f"tokens but the model has vocab_size={model_config.vocab_size}")
    train = task.train_split(options.data_dir, encoder, cfg.max_seq_length)
    evals = task.eval_splits(options.data_dir, encoder, cfg.max_seq_length)
    # Read before training, so that a missing or bad test file fails fast.
    tests = (task.test_splits(options.data_dir, encoder, cfg.max_seq_length)
             if options.do_predict else [])
    steps = num_train_steps(train.num_examples, cfg)
    logging.info("Task %s: %d training examples (%s), %s; %d steps of %d (%.3g epochs), "
                 "lr %.3g, layer-wise decay %.3g", task.name, train.num_examples,
                 train.name, ", ".join(f"{d.name}: {d.num_examples}" for d in evals),
                 steps, cfg.train_batch_size, cfg.num_train_epochs, cfg.learning_rate,
                 cfg.layerwise_lr_decay)
    fileio.makedirs(options.model_dir)
    trials: List[Dict[str, float]] = []
    for trial in range(cfg.num_trials):
        trial_dir = distribute.worker_dir(os.path.join(options.model_dir, f"trial_{trial}"),
                                          strategy)
        result_path = os.path.join(trial_dir, "result.json")
        if fileio.exists(result_path):  # written last: the trial is complete
            trials.append(fileio.read_json(result_path))
            logging.info("Trial %d already done: %s", trial, trials[-1])
            continue
        seed = cfg.seed + trial
        finetuner = Finetuner(task, model_config, cfg, strategy, steps,
                              options.init_checkpoint, seed, options.jit_compile)
        writer = (tf.summary.create_file_writer(os.path.join(options.model_dir, "train",
                                                             f"trial_{trial}"))
                  if chief else None)
        train_trial(finetuner, train, trial_dir, seed, writer)
        metrics = _evaluate_all(finetuner, evals)
        metrics["seed"] = seed
        logging.info("Trial %d (seed %d) dev: %s", trial, seed,
                     ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "seed"))
        if chief:
            _write_json(result_path, metrics)
        trials.append(metrics)
    scores = [t[task.primary_metric] for t in trials]
    best = median_trial(scores)
    results = {"task": task.name, "metric": task.primary_metric,
               "median": float(np.median(scores)), "scores": scores, "trials": trials,
               "median_trial": best, "num_train_steps": steps,
               "config": dataclasses.asdict(cfg), "init_checkpoint": options.init_checkpoint}
    logging.info("%s %s over %d trial(s): median %.4f (all: %s)", task.name,
                 task.primary_metric, len(scores), results["median"],
                 ", ".join(f"{s:.4f}" for s in scores))
    if tests or (options.export_dir and chief):
        finetuner = Finetuner(task, model_config, cfg, strategy, steps, None, cfg.seed + best,
                              options.jit_compile)
        # Each worker restores its own copy: predicting runs on all of them.
        ckpt_dir = distribute.worker_dir(os.path.join(options.model_dir, f"trial_{best}"),
                                         strategy)
        finetuner.checkpoint().restore(
            tf.train.latest_checkpoint(ckpt_dir)).assert_existing_objects_matched()
        if tests:
            results["predictions"] = write_predictions(
                task, finetuner, tests, os.path.join(options.model_dir, "predictions"), chief)
        if options.export_dir and chief:
            results["export"] = export_lib.export(task, finetuner.model, encoder,
                                                  cfg.max_seq_length, options.export_dir)
            logging.info("Exported %s", results["export"])
    if chief:
        _write_json(os.path.join(options.model_dir, "results.json"), results)
    return results
