"""The TensorFlow runtime (`runtime.Runtime`): the state as variables (the checkpoint's
object graph), one compiled step per phase under `tf.distribute` (the job's loss in
micro-batches, then `update.py`'s step tail: all-reduce, unscale, clip, skip a non-finite
step, update, float16 loss scaling) and host loops that return replica-reduced sums."""

from typing import Callable, Dict, Optional

import keras
import numpy as np
import tensorflow as tf

from electra_tf import compat, kernels, rng
from electra_tf.training import runtime, update
from electra_tf.training.tf_runtime import distribute
from electra_tf.training.tf_runtime.optimizer import (all_reduce_gradients, make_optimizer,
                                                      update_loss_scale)


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


class TfRuntime(runtime.Runtime):
    """A job on TensorFlow: its model, optimizer and counters as variables under the
    strategy's scope, built after the global seed is set (every rerun and worker starts from
    the same model), and its compiled step, eval step and host loops, one per phase."""

    def __init__(self, job: runtime.Job, devices: runtime.Devices,
                 jit_compile: Optional[bool] = None):
        self.job, self.devices = job, devices
        self.strategy = strategy = devices.strategy
        s = job.settings
        # The model's precision (runtime.set_precision); float16 scales the loss.
        self.float16 = runtime.active_precision() == "float16"
        self.clip_norm = s.clip_norm
        self.grad_accum_steps = s.grad_accum_steps
        keras.utils.set_random_seed(s.seed)
        with strategy.scope():
            self.model = job.build_model()
            self.variables = list(self.model.trainable_variables)
            self.optimizer = make_optimizer(s.optimizer, s.total_steps)
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
            self.base_seed = tf.Variable([s.seed, s.seed_stream], dtype=tf.int32,
                                         trainable=False, name="base_seed", aggregation=agg)
        # CPU-only runs take the CPU-friendly LayerNorm statistics (modeling docs).
        kernels.use_matvec_means(distribute.is_cpu_only(strategy))
        self.jit_compile = (default_jit(strategy, job.xla_on_cpu) if jit_compile is None
                            else jit_compile)
        if (self.jit_compile and distribute.is_cpu_only(strategy)
                and not compat.xla_cpu_available()):
            raise runtime.StrategyError(
                "--jit_compile=true: this TensorFlow build cannot XLA-compile for the CPU (the "
                "TPU build has no XLA:CPU backend): drop the flag, or run on the TPU")
        multipliers = job.lr_multipliers(self.model)
        # None, or (variable, multiplier) pairs: layer-wise rates
        self.lr_multipliers = (None if multipliers is None else
                               [(v, multipliers[v.path]) for v in self.variables])
        # One compiled step, eval step and host loop per phase, made on first use.
        self._replica_steps: Dict[int, Callable] = {}
        self._replica_evals: Dict[int, Callable] = {}
        self._train_loops: Dict[int, Callable] = {}
        self._eval_loops: Dict[int, Callable] = {}
        self.predict_step = None
        self.trace_count = 0

    def describe_step(self) -> str:
        return (f"{'XLA-compiled' if self.jit_compile else 'graph execution, no XLA'} "
                "(--jit_compile to choose)")

    # ------------------------------------------------------------------ counters

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    @property
    def data_position(self) -> int:
        return int(self.data_batches.numpy())

    def advance_data(self, batches: int):
        self.data_batches.assign_add(batches)

    def learning_rate(self, step: int) -> float:
        return float(self.optimizer.learning_rate(step))

    # ------------------------------------------------------------------ the job's part

    def loss(self, batch, seed, context, training: bool, phase: int = 0):
        """The job's loss of this replica's (micro-)batch on this runtime's model."""
        return self.job.loss(self.model, batch, seed, context, training, phase,
                             self.global_step)

    def step_context(self, batch) -> Dict[str, tf.Tensor]:
        """The job's denominators of the whole global batch (summed over replicas)."""
        return {k: kernels.cross_replica_sum(v) for k, v in self.job.denominators(batch).items()}

    def eval_step(self, batch, phase: int = 0):
        """One replica's evaluation sums: the loss without dropout, evaluation's draws."""
        loss, sums = self.loss(batch, self.step_seed(batch, offset=1),
                               self.step_context(batch), False, phase)
        return dict(sums, loss_sum=loss, steps=tf.constant(1.0))

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, data_position: bool = True) -> tf.train.Checkpoint:
        """A training checkpoint's object graph; without `data_position`, that of
        checkpoints written before `data_batches` existed."""
        state = dict(model=self.model, optimizer=self.optimizer, global_step=self.global_step,
                     loss_scale=self.loss_scale, loss_scale_good_steps=self.good_steps)
        if data_position:
            state["data_batches"] = self.data_batches
        return tf.train.Checkpoint(**state)

    def checkpoint_manager(self, directory: str, max_to_keep: int):
        return tf.train.CheckpointManager(self.checkpoint(), directory, max_to_keep=max_to_keep,
                                          step_counter=self.global_step)

    def restore(self, path: str):
        """Restores a training checkpoint (one without data_batches resumes the input at
        global_step). The prefix's own reader: list_variables takes a ram:// one for a dir."""
        reader = tf.compat.v1.train.NewCheckpointReader(path)
        saved = {name.split("/")[0] for name in reader.get_variable_to_shape_map()}
        data_position = "data_batches" in saved
        self.checkpoint(data_position).restore(path).assert_existing_objects_matched()
        if not data_position:
            self.data_batches.assign(self.global_step)

    def sync_model(self):
        """Nothing: the model's variables are the state."""

    def model_changed(self):
        """Nothing: the compiled step reads the model's variables."""

    def reinitialize(self, seed: int):
        keras.utils.set_random_seed(seed)
        with self.strategy.scope():
            fresh = self.job.build_model()
        runtime.check_same_model(fresh, self.model)
        for target, value in zip(self.model.weights, fresh.weights):
            target.assign(value)
        for slot in self.optimizer.slot_variables().values():
            slot.assign(tf.zeros_like(slot))
        for counter in (self.global_step, self.good_steps, self.data_batches):
            counter.assign(0)
        self.loss_scale.assign(update.initial_loss_scale(self.float16))
        self.base_seed.assign([seed, self.job.settings.seed_stream])

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
        distributed iterator -> metric sums over replicas and steps."""
        if phase not in self._train_loops:
            self._train_loops[phase] = self._host_loop(self.replica_step(phase))
        return self._train_loops[phase]

    def make_eval_loop(self, phase: Optional[int] = None):
        if phase is None:
            phase = self.phase_at(self.step)
        if phase not in self._eval_loops:
            self._eval_loops[phase] = self._host_loop(self.replica_eval(phase))
        return self._eval_loops[phase]

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

        def host_loop(iterator, num_steps):
            return loop(iterator, tf.constant(num_steps)
                        if isinstance(num_steps, int) else num_steps)

        return host_loop

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

    # ------------------------------------------------------------------ prediction

    def predict(self, arrays: Dict[str, np.ndarray], batch_size: int) -> Dict[str, np.ndarray]:
        """XLA and several replicas want one batch shape: padded rows (weight 0). Else the
        last batch stays short, on one trace for every batch size (no wasted rows)."""
        rows = len(arrays["weight"])
        padded = self.jit_compile or self.strategy.num_replicas_in_sync > 1
        if padded:
            arrays = runtime.pad_rows(arrays, batch_size)
        ds = tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size, drop_remainder=padded)
        if self.predict_step is None:
            self.predict_step = tf.function(
                lambda batch: self.job.fetches(batch, self.model(batch, training=False)),
                jit_compile=self.jit_compile, autograph=False)
        step = self.predict_step
        if not padded:
            step.get_concrete_function(ds.element_spec)  # batch dimension None
        return runtime.concat_rows(
            ({k: self.strategy.gather(v, axis=0).numpy() for k, v in
              self.strategy.run(step, args=(element,)).items()}
             for element in self.devices.distribute(ds)), rows)


def first_row(batch):
    """Global index of this replica's first row (replicas hold equal, ordered shares)."""
    ctx = tf.distribute.get_replica_context()
    replica = ctx.replica_id_in_sync_group if ctx is not None else 0
    return replica * tf.shape(batch["input_ids"])[0]
