"""The compiled pre-training step.

The objective (`objectives.py`) gives a loss and metric sums; the train step (one
XLA-compiled function per replica) adds gradients, all-reduce, clipping and the optimizer
update, and `Pretrainer.make_train_loop` runs `steps_per_loop` of them per host visit.
"""

import dataclasses
from typing import Callable, Dict, Optional

import keras
import tensorflow as tf

from electra_tf import distribute
from electra_tf import objective as obj
from electra_tf import rng
from electra_tf.configs import PretrainingConfig
from electra_tf.modeling import ElectraPretrainingModel, use_matvec_means
from electra_tf.objectives import build_objective
from electra_tf.optimization import (all_reduce_gradients, clip_by_global_norm, make_optimizer,
                                     update_loss_scale)


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
            self.model = ElectraPretrainingModel(cfg.model, heads=self.objective.heads)
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
        # One compiled step (and eval step) per phase of the objective, made on first use.
        self._replica_steps: Dict[int, Callable] = {}
        self._replica_evals: Dict[int, Callable] = {}
        self.trace_count = 0

    def checkpoint(self) -> tf.train.Checkpoint:
        """The object graph of a training checkpoint: model, optimizer slots, step, loss
        scale and the data position (what a rerun resumes from)."""
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                   global_step=self.global_step, loss_scale=self.loss_scale,
                                   loss_scale_good_steps=self.good_steps,
                                   data_batches=self.data_batches)

    # ------------------------------------------------------------------ phases

    def phase_at(self, step: int) -> int:
        """The objective's phase that global step `step` (0-based, about to run) is in."""
        return sum(1 for start in self.objective.phases()[1:] if step >= start)

    def steps_left_in_phase(self, step: int) -> Optional[int]:
        """Steps from `step` to the next phase start (None in the last phase)."""
        later = [start for start in self.objective.phases() if start > step]
        return later[0] - step if later else None

    def enter_phase(self, step: int):
        """Runs the objective's phase-start hook when `step` is the first of a phase > 0
        (idempotent: the hook's effect does not depend on when it ran before)."""
        starts = self.objective.phases()
        if step in starts[1:]:
            self.objective.on_phase_start(self.model, starts.index(step))

    def replica_step(self, phase: int = 0):
        """The compiled one-replica train step of `phase` (for `strategy.run`)."""
        return self._compiled(self._replica_steps, self._replica_step_fn, phase)

    def replica_eval(self, phase: int = 0):
        """The compiled one-replica eval step of `phase`."""
        return self._compiled(self._replica_evals, self._replica_eval_fn, phase)

    def _compiled(self, cache: Dict[int, Callable], fn, phase: int):
        if phase not in cache:
            cache[phase] = tf.function(lambda batch: fn(batch, phase),
                                       jit_compile=self.jit_compile)
        return cache[phase]

    # ------------------------------------------------------------------ one replica step

    def _grads(self, batch, seed, denominators, phase=0):
        with tf.GradientTape() as tape:
            loss, sums = self.objective.loss(self.model, batch, seed, denominators, True,
                                             phase)
            scaled = loss * tf.cast(self.loss_scale, tf.float32)
        grads = tape.gradient(scaled, self.variables)
        return grads, loss, sums

    def _replica_step_fn(self, batch, phase=0):
        """One optimizer update on this replica's share of the global batch."""
        self.trace_count += 1  # Python side effect: counts traces, not calls
        seed = rng.step_seed(self.base_seed, tf.cast(self.global_step, tf.int32),
                             self._first_row(batch))
        dens = {k: obj.cross_replica_sum(v)
                for k, v in self.objective.denominators(batch).items()}
        grads, loss, sums = self._accumulated_grads(batch, seed, dens, phase)
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

    def _accumulated_grads(self, batch, seed, dens, phase=0):
        """Gradients of the replica's batch, in `grad_accum_steps` micro-batches.

        Micro-batch losses are already divided by the denominators of the whole global
        batch, so their gradients simply add up; the loop keeps one running sum, so
        memory is that of one micro-batch.
        """
        k = self.cfg.train.grad_accum_steps
        if k == 1:
            return self._grads(batch, seed, dens, phase)
        micro_batches = {n: tf.reshape(t, [k, -1] + t.shape[1:].as_list())
                         for n, t in batch.items()}
        take = lambda i: {n: t[i] for n, t in micro_batches.items()}
        rows = batch["input_ids"].shape[0] // k
        grads, loss, sums = self._grads(take(0), seed, dens, phase)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, self.variables)]

        def body(i, grads, loss, sums):
            g, l, s = self._grads(take(i), rng.offset_rows(seed, i * rows), dens, phase)
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

    def _replica_eval_fn(self, batch, phase=0):
        dens = {k: obj.cross_replica_sum(v)
                for k, v in self.objective.denominators(batch).items()}
        seed = rng.step_seed(self.base_seed + 1, tf.cast(self.global_step, tf.int32),
                             self._first_row(batch))
        loss, sums = self.objective.loss(self.model, batch, seed, dens, False, phase)
        sums = dict(sums)
        sums["loss_sum"] = loss
        sums["steps"] = tf.constant(1.0)
        return sums

    # ------------------------------------------------------------------ host loops

    def make_train_loop(self, phase: int = 0):
        """A tf.function running `num_steps` train steps of `phase` from a distributed
        iterator and returning the metric sums, reduced over replicas and summed over the
        steps (a loop must not cross a phase boundary: `steps_left_in_phase`)."""
        step_fn = self.replica_step(phase)

        @tf.function
        def train_loop(iterator, num_steps):
            sums = self._reduce(self.strategy.run(step_fn, args=(next(iterator),)))
            for _ in tf.range(num_steps - 1):
                step_sums = self._reduce(
                    self.strategy.run(step_fn, args=(next(iterator),)))
                sums = {k: sums[k] + step_sums[k] for k in sums}
            return sums

        return train_loop

    def make_eval_loop(self, phase: Optional[int] = None):
        """Eval steps of `phase` (default: the phase of the current global step)."""
        if phase is None:
            phase = self.phase_at(int(self.global_step.numpy()))
        eval_fn = self.replica_eval(phase)

        @tf.function
        def eval_loop(iterator, num_steps):
            sums = self._reduce(self.strategy.run(eval_fn, args=(next(iterator),)))
            for _ in tf.range(num_steps - 1):
                step_sums = self._reduce(
                    self.strategy.run(eval_fn, args=(next(iterator),)))
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
