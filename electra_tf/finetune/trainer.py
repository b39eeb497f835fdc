"""The fine-tuning run: trials (seed -> fresh model -> the task's epochs, no early stopping
as in the paper -> dev metrics -> `trial_<i>/`) and their median. A finished trial (its
`result.json`) is not rerun; one stopped by SIGTERM resumes from its position."""

import dataclasses
import math
import os
from typing import Any, Dict, List, Optional

import numpy as np
from absl import logging
from keras import ops

from electra_tf import backend, fileio, text
from electra_tf.training import backends, lease, runtime
from electra_tf.configs import ConfigError, FinetuneConfig, ModelConfig
from electra_tf.finetune.model import (FinetuningModel, init_encoder,
                                       layerwise_lr_multipliers, make_head)
from electra_tf.finetune.batches import shuffled_batches
from electra_tf.finetune.base_task import Task, TaskData
from electra_tf.training.checkpoints import newest_complete
from electra_tf.training import loop
from electra_tf.training.options import FinetuneOptions
from electra_tf.training.runtime import Devices, Runtime

SEED_STREAM = 0xF17E


class FinetuningJob(runtime.Job):
    """Fine-tuning as a `runtime.Job`, the same on every runtime: the model (pre-trained
    encoder, new head), the optimizer section with its warm-up share, layer-wise rates, the
    weighted loss (keras.ops) and what prediction fetches."""

    # On a CPU, graph execution (oneDNN kernels, TF's own Philox for dropout) beat the
    # XLA step at every size measured (2 x 128, 6 x 384, 12 x 256) by 15-19% a step and
    # with a cheaper first step (README, Benchmarks); pre-training's step, many small
    # fused ops, is the other way round.
    xla_on_cpu = False

    def __init__(self, task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
                 num_train_steps: int, init_checkpoint: Optional[str], seed: int):
        self.task, self.model_config, self.cfg = task, model_config, cfg
        self.num_train_steps, self.init_checkpoint = num_train_steps, init_checkpoint
        optimizer = dataclasses.replace(  # warmup: a share of this run's steps
            cfg.optimizer, warmup_steps=int(round(cfg.warmup_proportion * num_train_steps)))
        self.settings = runtime.Settings(optimizer, num_train_steps, seed, SEED_STREAM,
                                         optimizer.clip_norm)

    def build_model(self):
        task = self.task
        head = make_head(task.kind, self.model_config, task.num_outputs(),
                         **task.head_options())
        model = FinetuningModel(self.model_config, head)
        if self.init_checkpoint:
            init_encoder(model.electra, self.init_checkpoint)
        return model

    def lr_multipliers(self, model) -> Dict[str, float]:
        return layerwise_lr_multipliers(model, self.cfg.layerwise_lr_decay,
                                        self.cfg.official_lr_bug)

    def loss(self, model, batch, seed, context, training, phase=0, step=None):
        outputs = model(batch, training=training, seed=seed)
        per_example = self.task.loss(outputs, batch)
        batch_size = float(self.cfg.train.train_batch_size)
        return ops.sum(per_example * batch["weight"]) / batch_size, {}

    def fetches(self, batch, outputs):
        """What evaluation brings back per example (and its loss where labels exist)."""
        fetched = dict(self.task.fetches(outputs))
        if "label" in batch or "start_positions" in batch or "label_ids" in batch:
            fetched["_loss"] = self.task.loss(outputs, batch)
        return fetched

    def train_batches(self, data: TaskData, seed: int, skip_batches: int = 0):
        """Shuffled (a fresh order each epoch, a function of the seed), repeated global
        batches as a tf.data pipeline; a resumed trial skips the batches it has consumed."""
        import tensorflow as tf
        ds = tf.data.Dataset.from_tensor_slices(data.arrays)
        ds = ds.shuffle(data.num_examples, seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(self.cfg.train.train_batch_size, drop_remainder=True).skip(skip_batches)
        return ds.prefetch(2)

    def host_batches(self, data: TaskData, seed: int, skip_batches: int = 0):
        """`train_batches`' batches, the same in the same order, as NumPy arrays."""
        return shuffled_batches(data.arrays, self.cfg.train.train_batch_size, seed,
                                skip_batches)


def make_finetuner(task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
                   devices: Devices, steps: int, init_checkpoint: Optional[str], seed: int,
                   jit_compile: Optional[bool] = None) -> Runtime:
    """A trial's runtime: the job on the devices' runtime (`reinitialize(seed)` starts the
    next trial on the same compiled step)."""
    return devices.runtime(FinetuningJob(task, model_config, cfg, steps, init_checkpoint, seed),
                           jit_compile)


def predict(finetuner: Runtime, data: TaskData) -> Dict[str, np.ndarray]:
    """The model over a split (no dropout) -> the fetched arrays of its examples."""
    out = finetuner.predict(data.arrays, finetuner.job.cfg.train.eval_batch_size)
    return {k: v[:data.num_examples] for k, v in out.items()}


def evaluate(finetuner: Runtime, data: TaskData) -> Dict[str, float]:
    """The task's metrics of a split (and the weighted loss where it has labels)."""
    fetched = predict(finetuner, data)
    result = finetuner.job.task.metrics(data, fetched)
    if "_loss" in fetched:
        weight = data.arrays["weight"][:data.num_examples]
        result["loss"] = float(np.sum(fetched["_loss"] * weight) / max(weight.sum(), 1.0))
    return result


def train_dataset(finetuner: Runtime, data: TaskData, seed: int, skip_batches: int = 0):
    """A trial's training batches spread over the runtime's replicas: the TensorFlow
    runtime's strategies distribute a tf.data pipeline, the others take host arrays."""
    job, devices = finetuner.job, finetuner.devices
    make = job.host_batches if devices.host_input else job.train_batches
    return devices.distribute(make(data, seed, skip_batches))


def num_train_steps(num_examples: int, cfg: FinetuneConfig) -> int:
    return max(1, int(math.ceil(num_examples * cfg.num_train_epochs / cfg.train.train_batch_size)))


def write_predictions(task: Task, finetuner: Runtime, tests: List[TaskData],
                      out_dir: str, chief: bool = True) -> Dict[str, str]:
    """`<out_dir>/<name>.tsv` (atomically) for each test split in the GLUE leaderboard's
    format: `index<TAB>prediction`, label strings or STS-B scores. Every worker calls it
    (prediction is collective); only the chief writes. Returns {name: path}."""
    paths = {}
    for data in tests:
        labels = task.predicted_labels(data, predict(finetuner, data))
        if not chief:
            continue
        fileio.makedirs(out_dir)
        lines = ["index\tprediction"] + [f"{i}\t{p}" for i, p in zip(data.meta, labels)]
        path = os.path.join(out_dir, f"{data.name}.tsv")
        fileio.write_atomic(path, "\n".join(lines) + "\n")
        paths[data.name] = path
        logging.info("Wrote %d test predictions to %s", len(labels), path)
    return paths


def train_trial(finetuner: Runtime, train: TaskData, trial_dir: str, seed: int,
                logdir: Optional[str] = None, profile_steps=None, chief: bool = True,
                run_lease=None) -> None:
    """Trains one trial to its last step, checkpointing every `save_checkpoints_steps`
    and on a preemption notice (then raises Preempted); resumes from `trial_dir` at its
    data position. TensorBoard scalars and a --profile_steps trace go to `logdir`."""
    manager = loop.open_checkpoints(finetuner, trial_dir, max_to_keep=1)
    iterator = iter(train_dataset(finetuner, train, seed, finetuner.data_position))
    # A log line (and TensorBoard point) after every host loop.
    loop.train(finetuner, iterator, manager, loop.Schedule.of(
                   finetuner.job.cfg.train, finetuner.job.num_train_steps, log_each_loop=True),
               writer=loop.summary_writer(logdir, chief and logdir is not None),
               profile_steps=profile_steps, profile_dir=logdir or "",
               chief=chief and logdir is not None, what="trial", lease=run_lease)


def median_trial(scores: List[float]) -> int:
    """Index of the trial whose score is the (lower) median."""
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return order[(len(order) - 1) // 2]


def _evaluate_all(finetuner: Runtime, evals: List[TaskData]) -> Dict[str, float]:
    """Metrics of every dev split; after the first, prefixed by the file name or tfds split
    (MNLI: `dev_mismatched/accuracy` or `validation_mismatched/accuracy`)."""
    result: Dict[str, float] = {}
    for i, data in enumerate(evals):
        prefix = os.path.splitext(data.name.rsplit(":", 1)[-1])[0]
        for k, v in evaluate(finetuner, data).items():
            result[k if i == 0 else f"{prefix}/{k}"] = v
    return result


def run(task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
        options: FinetuneOptions) -> Dict[str, Any]:
    """Fine-tunes `num_trials` seeds and writes `results.json` (every trial's metrics, the
    median of the primary metric); the median trial is exported (export_dir) and predicts
    the test sets (do_predict, `write_predictions`). Returns the results."""
    cfg.train.check(model_config)
    devices, cfg, chief = backends.setup(options, cfg.resolved(model_config, task).check())
    # Outputs first: a directory that cannot be written fails now, not after training.
    loop.check_writable(options.model_dir, "--model_dir")
    if options.export_dir and chief:
        missing = backend.tensorflow_missing("--export_dir (a SavedModel export)")
        if missing:
            raise backend.BackendError(missing)
        loop.check_writable(options.export_dir, "--export_dir")
    # One writer per run directory, from before its first write (training/lease.py).
    with lease.hold(options.model_dir, writer=chief) as run_lease:
        # The TensorFlow runtime exports with its in-graph encoder; a host task on another
        # runtime needs no TensorFlow (the same ids).
        host = devices.host_input and not task.in_graph_preprocessing
        encoder = (text.HostTextEncoder if host else text.TextEncoder)(
            options.vocab_file, options.do_lower_case, options.spm_model)
        if encoder.vocab_size != model_config.vocab_size:
            raise ConfigError(f"the vocabulary {encoder.vocab_path} has {encoder.vocab_size} "
                             f"tokens but the model has vocab_size={model_config.vocab_size}")
        train = task.train_split(options.data_dir, encoder, cfg.train.max_seq_length)
        evals = task.eval_splits(options.data_dir, encoder, cfg.train.max_seq_length)
        # Read before training, so that a missing or bad test file fails fast.
        tests = (task.test_splits(options.data_dir, encoder, cfg.train.max_seq_length)
                 if options.do_predict else [])
        steps = num_train_steps(train.num_examples, cfg)
        logging.info("Task %s: %d training examples (%s), %s; %d steps of %d (%.3g epochs), "
                     "lr %.3g, layer-wise decay %.3g", task.name, train.num_examples,
                     train.name, ", ".join(f"{d.name}: {d.num_examples}" for d in evals),
                     steps, cfg.train.train_batch_size, cfg.num_train_epochs,
                     cfg.optimizer.learning_rate, cfg.layerwise_lr_decay)
        labels = task.label_names()
        if labels is not None:
            logging.info("Task %s: %d labels (%s): %s", task.name, len(labels),
                         f"read from {task.labels_from}" if task.labels_from else "given",
                         ", ".join(labels))
        trials: List[Dict[str, float]] = []
        finetuner: Optional[Runtime] = None
        for trial in range(cfg.num_trials):
            trial_dir = devices.worker_dir(os.path.join(options.model_dir, f"trial_{trial}"))
            result_path = os.path.join(trial_dir, "result.json")
            if fileio.exists(result_path):  # written last: the trial is complete
                trials.append(fileio.read_json(result_path))
                logging.info("Trial %d already done: %s", trial, trials[-1])
                continue
            seed = cfg.train.seed + trial
            if finetuner is None:
                finetuner = make_finetuner(task, model_config, cfg, devices, steps,
                                           options.init_checkpoint, seed, options.jit_compile)
            else:  # the next seed on the same compiled step: compiles once per run
                finetuner.reinitialize(seed)
            train_trial(finetuner, train, trial_dir, seed,
                        fileio.join(options.model_dir, "train", f"trial_{trial}"),
                        loop.parse_profile_steps(options.profile_steps) if trial == 0 else None,
                        chief, run_lease)
            metrics = _evaluate_all(finetuner, evals)
            metrics["seed"] = seed
            logging.info("Trial %d (seed %d) dev: %s", trial, seed,
                         ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "seed"))
            if chief:
                loop.write_results(result_path, metrics, run_lease)
            trials.append(metrics)
        scores = [t[task.primary_metric] for t in trials]
        best = median_trial(scores)
        results = {"task": task.name, "metric": task.primary_metric,
                   "labels": list(labels) if labels is not None else None,
                   "labels_from": task.labels_from,
                   "median": float(np.median(scores)), "scores": scores, "trials": trials,
                   "median_trial": best, "num_train_steps": steps,
                   "config": dataclasses.asdict(cfg), "init_checkpoint": options.init_checkpoint}
        logging.info("%s %s over %d trial(s): median %.4f (all: %s)", task.name,
                     task.primary_metric, len(scores), results["median"],
                     ", ".join(f"{s:.4f}" for s in scores))
        if tests or (options.export_dir and chief):
            if finetuner is None:  # every trial was done by an earlier run
                finetuner = make_finetuner(task, model_config, cfg, devices, steps, None,
                                           cfg.train.seed + best, options.jit_compile)
            # Each worker restores its own copy: predicting runs on all of them.
            ckpt_dir = devices.worker_dir(os.path.join(options.model_dir, f"trial_{best}"))
            best_checkpoint = newest_complete(ckpt_dir)
            finetuner.restore(best_checkpoint)
            if tests:
                results["predictions"] = write_predictions(
                    task, finetuner, tests, os.path.join(options.model_dir, "predictions"), chief)
            if options.export_dir and chief and not devices.saved_model_in_process:
                from electra_tf.finetune.export_child import export_in_tensorflow
                logging.info("The SavedModel export needs TensorFlow's Keras: exporting %s "
                             "in a TensorFlow process", best_checkpoint)
                results["export"] = export_in_tensorflow(
                    task, model_config, best_checkpoint,
                    dict(vocab_file=options.vocab_file, do_lower_case=options.do_lower_case,
                         spm_model=options.spm_model), cfg.train.max_seq_length,
                    options.export_dir)
            elif options.export_dir and chief:
                from electra_tf.finetune import export as export_lib
                results["export"] = export_lib.export(task, finetuner.model, encoder,
                                                      cfg.train.max_seq_length, options.export_dir)
                logging.info("Exported %s", results["export"])
        if chief:
            loop.write_results(os.path.join(options.model_dir, "results.json"), results, run_lease)
        return results
