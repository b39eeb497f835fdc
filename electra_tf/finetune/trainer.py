"""The fine-tuning run: trials (seed -> fresh model -> the task's epochs, no early stopping
as in the paper -> dev metrics -> `trial_<i>/`) and their median. A finished trial (its
`result.json`) is not rerun; one stopped by SIGTERM resumes from its position."""

import dataclasses
import math
import os
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf
from absl import logging
from keras import ops

from electra_tf import fileio
from electra_tf.training import distribute, lease
from electra_tf.configs import ConfigError, FinetuneConfig, ModelConfig
from electra_tf.finetune.model import (FinetuningModel, init_encoder,
                                       layerwise_lr_multipliers, make_head)
from electra_tf.finetune import export as export_lib
from electra_tf.finetune.base_task import Task, TaskData
from electra_tf.text import TextEncoder
from electra_tf.training.checkpoints import newest_complete
from electra_tf.training.optimization import make_optimizer
from electra_tf.training import loop
from electra_tf.training.options import FinetuneOptions
from electra_tf.training.trainer import Trainer


def pad_rows(arrays: Dict[str, np.ndarray], multiple: int) -> Dict[str, np.ndarray]:
    """Pads every array to a multiple of `multiple` rows (copies of row 0, weight 0): one
    batch shape, one XLA compilation."""
    n = len(arrays["weight"])
    extra = -n % multiple
    if not extra:
        return arrays
    out = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in arrays.items()}
    out["weight"][n:] = 0.0
    return out


class FinetuningJob:
    """Fine-tuning's part of either runtime's trainer (`Finetuner`, TensorFlow;
    `jax_trainer.JaxFinetuner`): the model (pre-trained encoder, new head), the optimizer
    config with its warm-up share, layer-wise rates, the weighted loss (keras.ops)."""

    def _setup_job(self, task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
                   num_train_steps: int, init_checkpoint: Optional[str]):
        self.task, self.cfg = task, cfg
        self.num_train_steps = num_train_steps

        def build_model():
            head = make_head(task.kind, model_config, task.num_outputs(), **task.head_options())
            model = FinetuningModel(model_config, head)
            if init_checkpoint:
                init_encoder(model.electra, init_checkpoint)
            return model

        optimizer = dataclasses.replace(  # warmup: a share of this run's steps
            cfg.optimizer, warmup_steps=int(round(cfg.warmup_proportion * num_train_steps)))
        return build_model, optimizer

    def layerwise_multipliers(self) -> Dict[str, float]:
        return layerwise_lr_multipliers(self.model, self.cfg.layerwise_lr_decay,
                                        self.cfg.official_lr_bug)

    def loss(self, batch, seed, context, training, phase=0, step=None):
        outputs = self.model(batch, training=training, seed=seed)
        per_example = self.task.loss(outputs, batch)
        batch_size = float(self.cfg.train.train_batch_size)
        return ops.sum(per_example * batch["weight"]) / batch_size, {}

    def fetches(self, batch, outputs):
        """What evaluation brings back per example (and its loss where labels exist)."""
        fetched = dict(self.task.fetches(outputs))
        if "label" in batch or "start_positions" in batch or "label_ids" in batch:
            fetched["_loss"] = self.task.loss(outputs, batch)
        return fetched

    def evaluate(self, data: TaskData) -> Dict[str, float]:
        fetched = self.predict(data)
        result = self.task.metrics(data, fetched)
        if "_loss" in fetched:
            weight = data.arrays["weight"][:data.num_examples]
            result["loss"] = float(np.sum(fetched["_loss"] * weight) / max(weight.sum(), 1.0))
        return result

    def train_batches(self, data: TaskData, seed: int, skip_batches: int = 0
                      ) -> tf.data.Dataset:
        """Shuffled (a fresh order each epoch, a function of the seed), repeated global
        batches; a resumed trial skips the batches it has consumed."""
        ds = tf.data.Dataset.from_tensor_slices(data.arrays)
        ds = ds.shuffle(data.num_examples, seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(self.cfg.train.train_batch_size, drop_remainder=True).skip(skip_batches)
        return ds.prefetch(2)


class Finetuner(FinetuningJob, Trainer):
    """A trial's model (pre-trained encoder, new head), optimizer with layer-wise learning
    rates and loss; `reinitialize(seed)` starts the next trial on the same compiled step."""

    # On a CPU, graph execution (oneDNN kernels, TF's own Philox for dropout) beat the
    # XLA step at every size measured (2 x 128, 6 x 384, 12 x 256) by 15-19% a step and
    # with a cheaper first step (README, Benchmarks); pre-training's step, many small
    # fused ops, is the other way round.
    xla_on_cpu = False

    def __init__(self, task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
                 strategy: tf.distribute.Strategy, num_train_steps: int,
                 init_checkpoint: Optional[str], seed: int, jit_compile: Optional[bool] = None):
        build_model, optimizer = self._setup_job(task, model_config, cfg, num_train_steps,
                                                 init_checkpoint)
        super().__init__(strategy, build_model,
                         lambda: make_optimizer(optimizer, num_train_steps), seed=seed,
                         seed_stream=0xF17E, clip_norm=optimizer.clip_norm,
                         jit_compile=jit_compile)
        multipliers = self.layerwise_multipliers()
        self.lr_multipliers = [(v, multipliers[v.path]) for v in self.variables]

    def eval_step(self, batch, phase=0):
        outputs = self.model(batch, training=False)
        return self.fetches(batch, outputs)

    def train_dataset(self, data: TaskData, seed: int, skip_batches: int = 0):
        return self._distributed(self.train_batches(data, seed, skip_batches))

    def _distributed(self, ds: tf.data.Dataset):
        """`ds` spread over the replicas, without tf.data's autotuner: the splits are in
        memory and the pipelines have nothing to tune. Where a strategy's multi-device
        iterator owns a pipeline, releasing the iterator waits for the autotuner's thread to
        wake by itself (up to a minute: 5-56 s after the last step in 7 of 12 fine-tuning
        runs measured)."""
        options = tf.data.Options()
        options.autotune.enabled = False
        return self.strategy.experimental_distribute_dataset(ds.with_options(options))

    def predict(self, data: TaskData) -> Dict[str, np.ndarray]:
        """Runs the model over a split (no dropout) and returns the fetched arrays."""
        batch = self.cfg.train.eval_batch_size
        # XLA and several replicas want one batch shape: padded rows (weight 0). Else the
        # last batch stays short, on one trace for every batch size (no wasted rows).
        padded = self.jit_compile or self.strategy.num_replicas_in_sync > 1
        arrays = pad_rows(data.arrays, batch) if padded else data.arrays
        ds = tf.data.Dataset.from_tensor_slices(arrays).batch(batch, drop_remainder=padded)
        step = self.replica_eval()
        if not padded:
            step.get_concrete_function(ds.element_spec)  # batch dimension None
        parts: Dict[str, List[np.ndarray]] = {}
        for element in self._distributed(ds):
            out = self.strategy.run(step, args=(element,))
            for k, v in out.items():
                parts.setdefault(k, []).append(self.strategy.gather(v, axis=0).numpy())
        return {k: np.concatenate(v)[:data.num_examples] for k, v in parts.items()}


# --------------------------------------------------------------------------- the run


def _on_jax(strategy) -> bool:
    return hasattr(strategy, "process_count")  # distribute.jax_devices' JaxDevices


def make_finetuner(task: Task, model_config: ModelConfig, cfg: FinetuneConfig, strategy,
                   steps: int, init_checkpoint: Optional[str], seed: int,
                   jit_compile: Optional[bool] = None):
    """The backend's trainer: `Finetuner` (tf.distribute) or `JaxFinetuner` (JAX's
    devices, always XLA: --jit_compile is not read there)."""
    if not _on_jax(strategy):
        return Finetuner(task, model_config, cfg, strategy, steps, init_checkpoint, seed,
                         jit_compile)
    from electra_tf.finetune.jax_trainer import JaxFinetuner
    return JaxFinetuner(task, model_config, cfg, strategy, steps, init_checkpoint, seed)

def num_train_steps(num_examples: int, cfg: FinetuneConfig) -> int:
    return max(1, int(math.ceil(num_examples * cfg.num_train_epochs / cfg.train.train_batch_size)))


def write_predictions(task: Task, finetuner: Finetuner, tests: List[TaskData],
                      out_dir: str, chief: bool = True) -> Dict[str, str]:
    """`<out_dir>/<name>.tsv` (atomically) for each test split in the GLUE leaderboard's
    format: `index<TAB>prediction`, label strings or STS-B scores. Every worker calls it
    (prediction is collective); only the chief writes. Returns {name: path}."""
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
                logdir: Optional[str] = None, profile_steps=None, chief: bool = True,
                run_lease=None) -> None:
    """Trains one trial to its last step, checkpointing every `save_checkpoints_steps`
    and on a preemption notice (then raises Preempted); resumes from `trial_dir` at its
    data position. TensorBoard scalars and a --profile_steps trace go to `logdir`."""
    manager = loop.open_checkpoints(finetuner, trial_dir, max_to_keep=1)
    skip = int(finetuner.data_batches.numpy())
    iterator = iter(finetuner.train_dataset(train, seed, skip_batches=skip))
    # A log line (and TensorBoard point) after every host loop.
    loop.train(finetuner, iterator, manager, loop.Schedule.of(
                   finetuner.cfg.train, finetuner.num_train_steps, log_each_loop=True),
               writer=loop.summary_writer(logdir, chief and logdir is not None),
               profile_steps=profile_steps, profile_dir=logdir or "",
               chief=chief and logdir is not None, what="trial", lease=run_lease)


def median_trial(scores: List[float]) -> int:
    """Index of the trial whose score is the (lower) median."""
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return order[(len(order) - 1) // 2]


def _evaluate_all(finetuner: Finetuner, evals: List[TaskData]) -> Dict[str, float]:
    """Metrics of every dev split; after the first, prefixed by the file name or tfds split
    (MNLI: `dev_mismatched/accuracy` or `validation_mismatched/accuracy`)."""
    result: Dict[str, float] = {}
    for i, data in enumerate(evals):
        prefix = os.path.splitext(data.name.rsplit(":", 1)[-1])[0]
        for k, v in finetuner.evaluate(data).items():
            result[k if i == 0 else f"{prefix}/{k}"] = v
    return result


def run(task: Task, model_config: ModelConfig, cfg: FinetuneConfig,
        options: FinetuneOptions) -> Dict[str, Any]:
    """Fine-tunes `num_trials` seeds and writes `results.json` (every trial's metrics, the
    median of the primary metric); the median trial is exported (export_dir) and predicts
    the test sets (do_predict, `write_predictions`). Returns the results."""
    cfg.train.check(model_config)
    strategy, cfg, chief = loop.setup(options, cfg.resolved(model_config, task).check())
    # Outputs first: a directory that cannot be written fails now, not after training.
    loop.check_writable(options.model_dir, "--model_dir")
    if options.export_dir and chief:
        loop.check_writable(options.export_dir, "--export_dir")
    # One writer per run directory, from before its first write (training/lease.py).
    with lease.hold(options.model_dir, writer=chief) as run_lease:
        encoder = TextEncoder(options.vocab_file, options.do_lower_case, options.spm_model)
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
        finetuner: Optional[Finetuner] = None
        for trial in range(cfg.num_trials):
            trial_dir = distribute.worker_dir(os.path.join(options.model_dir, f"trial_{trial}"),
                                              strategy)
            result_path = os.path.join(trial_dir, "result.json")
            if fileio.exists(result_path):  # written last: the trial is complete
                trials.append(fileio.read_json(result_path))
                logging.info("Trial %d already done: %s", trial, trials[-1])
                continue
            seed = cfg.train.seed + trial
            if finetuner is None:
                finetuner = make_finetuner(task, model_config, cfg, strategy, steps,
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
                finetuner = make_finetuner(task, model_config, cfg, strategy, steps, None,
                                           cfg.train.seed + best, options.jit_compile)
            # Each worker restores its own copy: predicting runs on all of them.
            ckpt_dir = distribute.worker_dir(os.path.join(options.model_dir, f"trial_{best}"),
                                             strategy)
            best_checkpoint = newest_complete(ckpt_dir)
            finetuner.restore(best_checkpoint)
            if tests:
                results["predictions"] = write_predictions(
                    task, finetuner, tests, os.path.join(options.model_dir, "predictions"), chief)
            if options.export_dir and chief and _on_jax(strategy):
                from electra_tf.finetune.export_child import export_in_tensorflow
                logging.info("The SavedModel export needs TensorFlow's Keras: exporting %s "
                             "in a TensorFlow process", best_checkpoint)
                results["export"] = export_in_tensorflow(
                    task, model_config, best_checkpoint,
                    dict(vocab_file=options.vocab_file, do_lower_case=options.do_lower_case,
                         spm_model=options.spm_model), cfg.train.max_seq_length,
                    options.export_dir)
            elif options.export_dir and chief:
                results["export"] = export_lib.export(task, finetuner.model, encoder,
                                                      cfg.train.max_seq_length, options.export_dir)
                logging.info("Exported %s", results["export"])
        if chief:
            loop.write_results(os.path.join(options.model_dir, "results.json"), results, run_lease)
        return results
