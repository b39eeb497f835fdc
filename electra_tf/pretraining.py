"""Pre-training objectives and the compiled train step.

An objective turns (model, batch, seed) into a scalar loss and additive metric sums; the
train step (one XLA-compiled function per replica) adds gradients, all-reduce, clipping
and the optimizer update, and `Pretrainer.train_loop` runs `steps_per_loop` of them per
host visit. New objectives subclass `Objective` and register in `OBJECTIVES`.
"""

import dataclasses
from typing import Callable, Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from electra_tf import distribute
from electra_tf import objective as obj
from electra_tf import rng
from electra_tf.configs import PretrainingConfig
from electra_tf.modeling import ElectraPretrainingModel, use_matvec_means
from electra_tf.optimization import (all_reduce_gradients, clip_by_global_norm, make_optimizer,
                                     update_loss_scale)

BERT_SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
_EPS = 1e-5


class Objective:
    """Base class: what a pre-training objective must provide.

    `denominators(batch)` returns the loss denominators that depend on the batch alone
    (no randomness), so they can be summed over replicas and micro-batches before the
    forward pass; `loss(...)` divides its local sums by those global values, which makes
    N replicas (or k micro-batches) give exactly the update of one device on the whole
    global batch.
    """

    def __init__(self, cfg: PretrainingConfig, special_ids: Dict[str, int],
                 unigram_counts: Optional[np.ndarray] = None):
        self.cfg = cfg
        self.oc = cfg.objective
        self.special = dict(special_ids)
        self.max_predictions = self.oc.predictions_per_seq(cfg.train.max_seq_length)
        self.unigram_counts = unigram_counts

    def denominators(self, batch) -> Dict[str, tf.Tensor]:
        raise NotImplementedError

    def loss(self, model, batch, seed, denominators, training: bool):
        """-> (scalar float32 loss, dict of additive float32 metric sums)."""
        raise NotImplementedError


class ElectraObjective(Objective):
    """Replaced-token detection: generator MLM + disc_weight x discriminator BCE."""

    def _mask_args(self):
        s = self.special
        return dict(mask_prob=self.oc.mask_prob, max_predictions=self.max_predictions,
                    mask_id=s["[MASK]"], cls_id=s["[CLS]"], sep_id=s["[SEP]"])

    def denominators(self, batch):
        _, count = obj.num_to_mask(batch["input_ids"], batch["input_mask"], **self._mask_args())
        return {"mlm": tf.cast(tf.reduce_sum(count), tf.float32),
                "disc": tf.reduce_sum(tf.cast(batch["input_mask"], tf.float32))}

    def generator_logits(self, model, masked, batch, seed, training):
        """Logits [B, P, V] of the proposal distribution at the masked slots."""
        if self.oc.generator == "masked_lm":
            return model.generator_mlm_logits(masked["masked_input_ids"], batch["input_mask"],
                                              batch["segment_ids"], masked["masked_positions"],
                                              training=training, seed=seed)
        if self.oc.generator == "uniform":
            return obj.uniform_logits(masked["masked_ids"], self.cfg.model.vocab_size)
        return obj.unigram_logits(masked["masked_ids"], self.unigram_counts)

    def loss(self, model, batch, seed, denominators, training):
        seeds = obj.split_seed(seed, 4)  # masking, sampling, generator and disc dropout
        masked = obj.mask_tokens(
            batch["input_ids"], batch["input_mask"], seeds[0],
            vocab_size=self.cfg.model.vocab_size, mask_token_prob=self.oc.mask_token_prob,
            random_token_prob=self.oc.random_token_prob, **self._mask_args())
        mlm_logits = self.generator_logits(model, masked, batch, seeds[2], training)
        sampled = obj.categorical_sample(
            mlm_logits, seeds[1], self.oc.temperature,
            disallow_ids=masked["masked_ids"] if self.oc.disallow_correct else None)
        fake_ids, labels = obj.corrupt(batch["input_ids"], masked["masked_positions"],
                                       sampled, masked["masked_weights"])
        disc_logits = model.discriminator(fake_ids, batch["input_mask"], batch["segment_ids"],
                                          training=training, seed=seeds[3])
        total = 0.0
        has_generator = self.oc.generator == "masked_lm"
        if has_generator:
            mlm_sum, _, _ = obj.mlm_loss_sums(mlm_logits, masked["masked_ids"],
                                              masked["masked_weights"])
            total += self.oc.gen_weight * mlm_sum / tf.maximum(denominators["mlm"], _EPS)
        disc_sum, _, _ = obj.disc_loss_sums(disc_logits, labels, batch["input_mask"])
        total += self.oc.disc_weight * disc_sum / tf.maximum(denominators["disc"], _EPS)
        sums = obj.metric_sums(
            disc_logits=disc_logits, disc_labels=labels, input_mask=batch["input_mask"],
            masked_ids=masked["masked_ids"], masked_weights=masked["masked_weights"],
            sampled_ids=sampled, mlm_logits=mlm_logits if has_generator else None)
        return total, sums


OBJECTIVES: Dict[str, Callable[..., Objective]] = {"electra": ElectraObjective}


def build_objective(cfg: PretrainingConfig, special_ids=None, unigram_counts=None) -> Objective:
    name = cfg.objective.objective
    if name not in OBJECTIVES:
        raise ValueError(f"objective.objective={name!r}: expected one of {', '.join(OBJECTIVES)}")
    if cfg.objective.generator == "unigram" and unigram_counts is None:
        raise ValueError("objective.generator=unigram needs token counts (the builder's "
                         "token_counts.txt beside the training data)")
    return OBJECTIVES[name](cfg, special_ids or BERT_SPECIAL_IDS, unigram_counts)


@dataclasses.dataclass
class LoopOutput:
    """What one `train_loop` call returns to the host (numpy scalars)."""
    loss: float
    metrics: Dict[str, float]
    grad_norm: float
    skipped_steps: int


class Pretrainer:
    """Owns the model, optimizer, step counter and the compiled step functions."""

    def __init__(self, cfg: PretrainingConfig, strategy: tf.distribute.Strategy,
                 special_ids=None, unigram_counts=None, jit_compile: Optional[bool] = None):
        self.cfg = cfg
        self.strategy = strategy
        self.objective = build_objective(cfg, special_ids, unigram_counts)
        tc = cfg.train
        # Initial weights are a function of the seed: reruns and every worker of a
        # multi-worker job start from the same model.
        keras.utils.set_random_seed(tc.seed)
        with strategy.scope():
            self.model = ElectraPretrainingModel(cfg.model)
            self.variables = list(self.model.trainable_variables)
            self.optimizer = make_optimizer(cfg.optimizer, tc.num_train_steps)
            self.optimizer.build(self.variables)
            agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="global_step", aggregation=agg)
            self.loss_scale = tf.Variable(2.0 ** 15 if tc.precision == "float16" else 1.0,
                                          trainable=False, name="loss_scale", aggregation=agg)
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="loss_scale_good_steps", aggregation=agg)
            # Global batches read so far (skipped non-finite steps included): where the
            # input pipeline resumes.
            self.data_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="data_batches", aggregation=agg)
        self.base_seed = tf.constant([tc.seed, 0x5EED], tf.int32)
        # CPU-only runs take the CPU-friendly LayerNorm statistics (modeling docs).
        use_matvec_means(distribute.is_cpu_only(strategy))
        if jit_compile is None:
            jit_compile = default_jit(strategy)
        self.jit_compile = jit_compile
        self._replica_step = tf.function(self._replica_step_fn, jit_compile=jit_compile)
        self._replica_eval = tf.function(self._replica_eval_fn, jit_compile=jit_compile)
        self.trace_count = 0

    def checkpoint(self) -> tf.train.Checkpoint:
        """The object graph of a training checkpoint: model, optimizer slots, step, loss
        scale and the data position (what a rerun resumes from)."""
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                   global_step=self.global_step, loss_scale=self.loss_scale,
                                   loss_scale_good_steps=self.good_steps,
                                   data_batches=self.data_batches)

    # ------------------------------------------------------------------ one replica step

    def _grads(self, batch, seed, denominators):
        with tf.GradientTape() as tape:
            loss, sums = self.objective.loss(self.model, batch, seed, denominators, True)
            scaled = loss * tf.cast(self.loss_scale, tf.float32)
        grads = tape.gradient(scaled, self.variables)
        return grads, loss, sums

    def _replica_step_fn(self, batch):
        """One optimizer update on this replica's share of the global batch."""
        self.trace_count += 1  # Python side effect: counts traces, not calls
        seed = obj.step_seed(self.base_seed, tf.cast(self.global_step, tf.int32),
                             self._first_row(batch))
        dens = {k: obj.cross_replica_sum(v)
                for k, v in self.objective.denominators(batch).items()}
        grads, loss, sums = self._accumulated_grads(batch, seed, dens)
        grads = all_reduce_gradients(grads, "sum")
        inv_scale = 1.0 / tf.cast(self.loss_scale, tf.float32)
        grads = [None if g is None else g * inv_scale for g in grads]
        grads, norm = clip_by_global_norm(grads, self.cfg.optimizer.clip_norm)
        finite = tf.math.is_finite(norm)
        self.optimizer.apply_gradients(zip(grads, self.variables), self.global_step,
                                       should_update=finite)
        self._update_loss_scale(finite)
        self.global_step.assign_add(tf.cast(finite, tf.int64))
        sums = dict(sums)
        sums["loss_sum"] = loss
        sums["steps"] = tf.constant(1.0)
        sums["grad_norm_sum"] = tf.where(finite, norm, 0.0)
        sums["skipped"] = 1.0 - tf.cast(finite, tf.float32)
        return sums

    def _accumulated_grads(self, batch, seed, dens):
        """Gradients of the replica's batch, in `grad_accum_steps` micro-batches.

        Micro-batch losses are already divided by the denominators of the whole global
        batch, so their gradients simply add up; the loop keeps one running sum, so
        memory is that of one micro-batch.
        """
        k = self.cfg.train.grad_accum_steps
        if k == 1:
            return self._grads(batch, seed, dens)
        micro_batches = {n: tf.reshape(t, [k, -1] + t.shape[1:].as_list())
                         for n, t in batch.items()}
        take = lambda i: {n: t[i] for n, t in micro_batches.items()}
        rows = batch["input_ids"].shape[0] // k
        grads, loss, sums = self._grads(take(0), seed, dens)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, self.variables)]

        def body(i, grads, loss, sums):
            g, l, s = self._grads(take(i), rng.offset_rows(seed, i * rows), dens)
            grads = [a if b is None else a + b for a, b in zip(grads, g)]
            return i + 1, grads, loss + l, {n: sums[n] + s[n] for n in sums}

        _, grads, loss, sums = tf.while_loop(lambda i, *_: i < k, body,
                                             (tf.constant(1), grads, loss, sums),
                                             maximum_iterations=k - 1)
        return grads, loss, sums

    @staticmethod
    def _first_row(batch):
        """Global index of this replica's first row (replicas hold equal, ordered shares)."""
        ctx = tf.distribute.get_replica_context()
        replica = ctx.replica_id_in_sync_group if ctx is not None else 0
        return replica * tf.shape(batch["input_ids"])[0]

    def _update_loss_scale(self, finite):
        """Dynamic loss scaling for float16: halve on overflow, double after 2000 good steps."""
        if self.cfg.train.precision != "float16":
            return
        update_loss_scale(self.loss_scale, self.good_steps, finite)

    def _replica_eval_fn(self, batch):
        dens = {k: obj.cross_replica_sum(v)
                for k, v in self.objective.denominators(batch).items()}
        seed = obj.step_seed(self.base_seed + 1, tf.cast(self.global_step, tf.int32),
                             self._first_row(batch))
        loss, sums = self.objective.loss(self.model, batch, seed, dens, False)
        sums = dict(sums)
        sums["loss_sum"] = loss
        sums["steps"] = tf.constant(1.0)
        return sums

    # ------------------------------------------------------------------ host loops

    def make_train_loop(self):
        """A tf.function running `num_steps` train steps from a distributed iterator and
        returning the metric sums, reduced over replicas and summed over the steps."""

        @tf.function
        def train_loop(iterator, num_steps):
            sums = self._reduce(self.strategy.run(self._replica_step, args=(next(iterator),)))
            for _ in tf.range(num_steps - 1):
                step_sums = self._reduce(
                    self.strategy.run(self._replica_step, args=(next(iterator),)))
                sums = {k: sums[k] + step_sums[k] for k in sums}
            return sums

        return train_loop

    def make_eval_loop(self):
        @tf.function
        def eval_loop(iterator, num_steps):
            sums = self._reduce(self.strategy.run(self._replica_eval, args=(next(iterator),)))
            for _ in tf.range(num_steps - 1):
                step_sums = self._reduce(
                    self.strategy.run(self._replica_eval, args=(next(iterator),)))
                sums = {k: sums[k] + step_sums[k] for k in sums}
            return sums

        return eval_loop

    def _reduce(self, per_replica):
        sums = {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
                for k, v in per_replica.items()}
        # Replica losses are shares of the global loss (global denominators) and add up;
        # step counts and gradient norms are the same on every replica: undo the SUM.
        n = float(self.strategy.num_replicas_in_sync)
        for key in ("steps", "grad_norm_sum", "skipped"):
            if key in sums:
                sums[key] = sums[key] / n
        return sums


def summarize(sums: Dict[str, tf.Tensor]) -> LoopOutput:
    """Metric sums of one or more steps -> the reported numbers."""
    sums = {k: v for k, v in sums.items()}
    steps = max(float(sums.pop("steps")), 1.0)
    loss = float(sums.pop("loss_sum")) / steps
    skipped = int(round(float(sums.pop("skipped", 0.0))))
    norm = float(sums.pop("grad_norm_sum", 0.0)) / max(steps - skipped, 1.0)
    metrics = {k: float(v) for k, v in obj.metrics_from_sums(sums).items()}
    return LoopOutput(loss, metrics, norm, skipped)


def default_jit(strategy: tf.distribute.Strategy) -> bool:
    """XLA everywhere except MirroredStrategy over several logical CPU devices, where XLA
    cannot place the per-replica variables (and on TPU the strategy compiles anyway)."""
    if isinstance(strategy, (tf.distribute.MirroredStrategy,
                             tf.distribute.MultiWorkerMirroredStrategy)):
        return not distribute.is_cpu_only(strategy)
    return True
