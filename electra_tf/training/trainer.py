"""The training state (the checkpoint's object graph) and the compiled step both jobs
share: the job's loss in micro-batches, then one step tail (all-reduce, unscale, clip, skip a
non-finite step, update, float16 loss scaling); host loops return replica-reduced sums."""

import abc
import dataclasses
from typing import Callable, Dict, List, Optional

import keras
import tensorflow as tf

from electra_tf import compat, rng
from electra_tf.training import distribute
from electra_tf.training.schedule import Phases
from electra_tf.kernels import use_matvec_means
from electra_tf.training import update
from electra_tf.training.optimization import all_reduce_gradients, update_loss_scale


def default_jit(strategy: tf.distribute.Strategy, on_cpu: bool = True) -> bool:
    """XLA on accelerators. CPU-only: `on_cpu` (`Trainer.xla_on_cpu`), but never under a
    MirroredStrategy (XLA cannot place per-replica variables) nor without XLA:CPU (the TPU
    build, `compat.xla_cpu_available`)."""
    if not distribute.is_cpu_only(strategy):
        return True
    if isinstance(strategy, (tf.distribute.MirroredStrategy,
                             tf.distribute.MultiWorkerMirroredStrategy)):
        return False
    return on_cpu and compat.xla_cpu_available()


@dataclasses.dataclass
class LoopOutput:
    """What one host loop returns to the host (Python numbers)."""
    loss: float
    metrics: Dict[str, float]
    grad_norm: float
    skipped_steps: int


class Trainer(Phases, abc.ABC):
    """A run's state and compiled functions. `build_model()` and `build_optimizer()` run
    under the strategy's scope after the global seed is set (every rerun and worker starts
    from the same model); `seed_stream` tells this job's random streams from another's."""

    # XLA on a CPU-only run without --jit_compile; a job's measured choice (README).
    xla_on_cpu = True

    def __init__(self, strategy: tf.distribute.Strategy, build_model: Callable,
                 build_optimizer: Callable, *, seed: int, seed_stream: int, clip_norm: float,
                 grad_accum_steps: int = 1, jit_compile: Optional[bool] = None):
        self.strategy = strategy
        # The model's precision (distribute.set_precision); float16 scales the loss.
        self.float16 = distribute.active_precision() == "float16"
        self.clip_norm = clip_norm
        self.grad_accum_steps = grad_accum_steps
        self.seed_stream = seed_stream
        self._build_model = build_model
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            self.model = build_model()
            self.variables = list(self.model.trainable_variables)
            self.optimizer = build_optimizer()
            self.optimizer.build(self.variables)
            agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="global_step", aggregation=agg)
            self.loss_scale = tf.Variable(update.initial_loss_scale(self.float16),
                                          trainable=False, name="loss_scale", aggregation=agg)
            self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="loss_scale_good_steps", aggregation=agg)
            # Global batches read: where the input resumes (ahead of global_step by the
            # skipped non-finite steps).
            self.data_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="data_batches", aggregation=agg)
            # Masks and dropout are a function of this, the step and the row, so a resumed
            # run redraws the same. Not checkpointed (from the flags); a variable so that
            # `reinitialize` can change it under the compiled step.
            self.base_seed = tf.Variable([seed, seed_stream], dtype=tf.int32,
                                         trainable=False, name="base_seed", aggregation=agg)
        # CPU-only runs take the CPU-friendly LayerNorm statistics (modeling docs).
        use_matvec_means(distribute.is_cpu_only(strategy))
        self.jit_compile = (default_jit(strategy, self.xla_on_cpu) if jit_compile is None
                            else jit_compile)
        if (self.jit_compile and distribute.is_cpu_only(strategy)
                and not compat.xla_cpu_available()):
            raise distribute.StrategyError(
                "--jit_compile=true: this TensorFlow build cannot XLA-compile for the CPU (the "
                "TPU build has no XLA:CPU backend): drop the flag, or run on the TPU")
        self.lr_multipliers = None  # or (variable, multiplier) pairs: layer-wise rates
        # One compiled step, eval step and host loop per phase, made on first use.
        self._replica_steps: Dict[int, Callable] = {}
        self._replica_evals: Dict[int, Callable] = {}
        self._train_loops: Dict[int, Callable] = {}
        self.trace_count = 0

    # ------------------------------------------------------------------ the job's part

    @abc.abstractmethod
    def loss(self, batch, seed, context, training: bool, phase: int = 0):
        """-> (float32 loss, additive float32 metric sums) of this replica's (micro-)batch,
        over global denominators: replicas and micro-batches add up to the global batch's."""

    def step_context(self, batch) -> Dict[str, tf.Tensor]:
        """Whatever `loss` needs from the whole replica batch before it is split into
        micro-batches (pre-training: global loss denominators). Default: nothing."""
        return {}

    @abc.abstractmethod
    def eval_step(self, batch, phase: int = 0):
        """One replica's evaluation outputs (a dict of tensors)."""

    def on_phase_start(self, phase: int):
        """Called (eagerly, before its first step) when phase `phase` > 0 begins."""

    def log_fields(self, metrics: Dict[str, float]) -> List[str]:
        """The job's groups of the log line, between the loss and the learning rate, from
        a host loop's metrics (`LoopOutput.metrics`). Default: none."""
        return []

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, data_position: bool = True) -> tf.train.Checkpoint:
        """A training checkpoint's object graph; without `data_position`, that of
        checkpoints written before `data_batches` existed."""
        state = dict(model=self.model, optimizer=self.optimizer, global_step=self.global_step,
                     loss_scale=self.loss_scale, loss_scale_good_steps=self.good_steps)
        if data_position:
            state["data_batches"] = self.data_batches
        return tf.train.Checkpoint(**state)

    def restore(self, path: str):
        """Restores a training checkpoint (one without data_batches resumes the input at
        global_step). The prefix's own reader: list_variables takes a ram:// one for a dir."""
        reader = tf.compat.v1.train.NewCheckpointReader(path)
        saved = {name.split("/")[0] for name in reader.get_variable_to_shape_map()}
        data_position = "data_batches" in saved
        self.checkpoint(data_position).restore(path).assert_existing_objects_matched()
        if not data_position:
            self.data_batches.assign(self.global_step)

    def before_save(self):
        """Nothing: the variables a checkpoint saves are the state (the JAX runtime copies
        its device state into them here)."""

    def sync_model(self):
        """Nothing: the model's variables are the state (see `jax_trainer.JaxTrainer`)."""

    def model_changed(self):
        """Nothing: the compiled step reads the model's variables (see `before_save`)."""

    def reinitialize(self, seed: int):
        """Puts the trainer where a new one built with `seed` would start (weights, zero
        slots and counters, loss scale, random streams), keeping its compiled functions:
        several trials (fine-tuning seeds) trace once."""
        keras.utils.set_random_seed(seed)
        with self.strategy.scope():
            fresh = self._build_model()
        new, old = fresh.weights, self.model.weights
        if [w.path for w in new] != [w.path for w in old]:
            raise ValueError("build_model made a different model on reinitialize")
        for target, value in zip(old, new):
            target.assign(value)
        for slot in self.optimizer.slot_variables().values():
            slot.assign(tf.zeros_like(slot))
        for counter in (self.global_step, self.good_steps, self.data_batches):
            counter.assign(0)
        self.loss_scale.assign(update.initial_loss_scale(self.float16))
        self.base_seed.assign([seed, self.seed_stream])

    # ------------------------------------------------------------------ phases

    def enter_phase(self, step: int):
        """Runs the phase-start hook when `step` is the first of a phase > 0 (idempotent:
        the hook's effect does not depend on when it ran before)."""
        starts = self.phases()
        if step in starts[1:]:
            self.on_phase_start(starts.index(step))

    # ------------------------------------------------------------------ compiled steps

    def replica_step(self, phase: int = 0):
        """The compiled one-replica train step of `phase` (for `strategy.run`)."""
        return self._compiled(self._replica_steps, self._replica_step_fn, phase)

    def replica_eval(self, phase: int = 0):
        """The compiled one-replica eval step of `phase`."""
        return self._compiled(self._replica_evals, self.eval_step, phase)

    def _compiled(self, cache: Dict[int, Callable], fn, phase: int):
        if phase not in cache:
            cache[phase] = tf.function(lambda batch: fn(batch, phase),
                                       jit_compile=self.jit_compile, autograph=False)
        return cache[phase]

    def step_seed(self, batch, offset: int = 0):
        """The seed of this replica's rows at the current global step (`offset` tells
        evaluation's draws apart from training's)."""
        return rng.step_seed(self.base_seed + offset, tf.cast(self.global_step, tf.int32),
                             first_row(batch))

    def _grads(self, batch, seed, context, phase=0):
        with tf.GradientTape() as tape:
            loss, sums = self.loss(batch, seed, context, True, phase)
            scaled = loss * tf.cast(self.loss_scale, tf.float32)
        grads = tape.gradient(scaled, self.variables)
        return grads, loss, sums

    def _replica_step_fn(self, batch, phase=0):
        """One optimizer update on this replica's share of the global batch."""
        self.trace_count += 1  # Python side effect: counts traces, not calls
        seed = self.step_seed(batch)
        context = self.step_context(batch)
        grads, loss, sums = self._accumulated_grads(batch, seed, context, phase)
        grads, norm, finite, scale = update.prepare(
            all_reduce_gradients(grads), self.loss_scale, self.clip_norm, self.float16)
        # Clipping scales the gradients inside the update (no pass of its own).
        self.optimizer.apply_gradients(zip(grads, self.variables), self.global_step,
                                       lr_multipliers=self.lr_multipliers,
                                       should_update=finite, grad_scale=scale)
        if self.float16:  # halve on overflow, double after 2000 good steps
            update_loss_scale(self.loss_scale, self.good_steps, finite)
        self.global_step.assign_add(tf.cast(finite, tf.int64))
        return update.step_sums(sums, loss, norm, finite)

    def _accumulated_grads(self, batch, seed, context, phase=0):
        """Gradients of the replica's batch in `grad_accum_steps` micro-batches, summed as
        they go (the memory of one micro-batch)."""
        k = self.grad_accum_steps
        if k == 1:
            return self._grads(batch, seed, context, phase)
        micro_batches = {n: tf.reshape(t, [k, -1] + t.shape[1:].as_list())
                         for n, t in batch.items()}
        take = lambda i: {n: t[i] for n, t in micro_batches.items()}
        rows = batch["input_ids"].shape[0] // k
        grads, loss, sums = self._grads(take(0), seed, context, phase)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, self.variables)]

        def body(i, grads, loss, sums):
            g, l, s = self._grads(take(i), rng.offset_rows(seed, i * rows), context, phase)
            grads = [a if b is None else a + b for a, b in zip(grads, g)]
            return i + 1, grads, loss + l, {n: sums[n] + s[n] for n in sums}

        _, grads, loss, sums = tf.while_loop(lambda i, *_: i < k, body,
                                             (tf.constant(1), grads, loss, sums),
                                             maximum_iterations=k - 1)
        return grads, loss, sums

    # ------------------------------------------------------------------ host loops

    def make_train_loop(self, phase: int = 0):
        """The tf.function (one per phase) running `num_steps` steps of `phase` from a
        distributed iterator -> metric sums over replicas and steps. A loop must not cross
        a phase boundary (`steps_left_in_phase`)."""
        if phase not in self._train_loops:
            self._train_loops[phase] = self._host_loop(self.replica_step(phase))
        return self._train_loops[phase]

    def _host_loop(self, step_fn):
        # No autograph: the loop, the step and the model are written with TF control
        # flow, and converting the Keras layers' Python cost ~2 s of every trace.
        def run(batch):
            return self._reduce(self.strategy.run(step_fn, args=(batch,)))

        @tf.function(autograph=False)
        def loop(iterator, num_steps):
            # The sums start at zeros, shaped as a (cached) trace of the step gives them:
            # 0 + x is x, and the step sits in the graph once, not also peeled before the
            # loop, which halves the graph to optimise and instantiate (~3 s of a 6 x 384
            # fine-tuning run's first step on a CPU).
            outputs = tf.function(run, autograph=False).get_concrete_function(
                iterator.element_spec).structured_outputs
            sums = {k: tf.zeros(v.shape, v.dtype) for k, v in outputs.items()}

            def body(i, sums):
                step_sums = run(next(iterator))
                return i + 1, {k: sums[k] + step_sums[k] for k in sums}

            _, sums = tf.while_loop(lambda i, _: i < tf.cast(num_steps, tf.int32), body,
                                    (tf.constant(0), sums))
            return sums

        return loop

    def _reduce(self, per_replica):
        sums = {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
                for k, v in per_replica.items()}
        # Replica losses are shares of the global loss (global denominators) and add up;
        # step counts and gradient norms are the same on every replica: undo the SUM.
        n = float(self.strategy.num_replicas_in_sync)
        for key in update.PER_STEP:
            if key in sums:
                sums[key] = sums[key] / n
        return sums


def first_row(batch):
    """Global index of this replica's first row (replicas hold equal, ordered shares)."""
    ctx = tf.distribute.get_replica_context()
    replica = ctx.replica_id_in_sync_group if ctx is not None else 0
    return replica * tf.shape(batch["input_ids"])[0]


def summarize(sums: Dict[str, tf.Tensor],
              metrics_from_sums: Callable = lambda sums: sums) -> LoopOutput:
    """Metric sums of one or more steps -> the reported numbers (`metrics_from_sums`
    turns the job's own sums into its metrics)."""
    sums = dict(sums)
    steps = max(float(sums.pop("steps")), 1.0)
    loss = float(sums.pop("loss_sum")) / steps
    skipped = int(round(float(sums.pop("skipped", 0.0))))
    norm = float(sums.pop("grad_norm_sum", 0.0)) / max(steps - skipped, 1.0)
    metrics = {k: float(v) for k, v in metrics_from_sums(sums).items()}
    return LoopOutput(loss, metrics, norm, skipped)
