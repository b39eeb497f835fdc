"""Pre-training's part of the training core: the model, optimizer and loss of the configured
objective (`objectives.py`); the step tail and host loops are `training/trainer.py`'s."""

from typing import Dict, List, Optional

import tensorflow as tf

from electra_tf.pretraining import losses as obj
from electra_tf.configs import PretrainingConfig
from electra_tf.model.modeling import ElectraPretrainingModel
from electra_tf.objective_specs import LOG_GROUPS, SPECS
from electra_tf.pretraining.objectives import build_objective
from electra_tf.training.optimization import make_optimizer
from electra_tf.training.trainer import Trainer


class PretrainingJob:
    """Pre-training's part of either runtime's trainer (`Pretrainer`, TensorFlow;
    `jax_trainer.JaxPretrainer`): the objective's model, phases, log fields and loss.
    Set `cfg` and `objective` before the runtime's constructor builds the model."""

    cfg: PretrainingConfig

    def _build_model_of_config(self):
        model = ElectraPretrainingModel(self.cfg.model, heads=self.objective.heads)
        if self.cfg.objective.generator == "fixed":
            # Forward only: not among the trained variables (no gradient, no optimizer
            # state); still in the checkpoints, which resume it.
            model.generator.trainable = False
            model.generator_predictions.trainable = False
        return model

    def phases(self):
        return self.objective.phases()

    def on_phase_start(self, phase: int):
        self.objective.on_phase_start(self.model, phase)

    def log_fields(self, metrics: Dict[str, float]) -> List[str]:
        """The spec's log groups whose metrics this run reports (a uniform generator has
        no generator MLM; two_stage's first stage no discriminator)."""
        groups = (LOG_GROUPS[g] for g in SPECS[self.cfg.objective.objective].log_groups)
        return [text.format(**metrics) for key, text in groups if key in metrics]

    def step_context(self, batch):
        """The loss denominators of the whole global batch (summed over replicas)."""
        return {k: obj.cross_replica_sum(v)
                for k, v in self.objective.denominators(batch).items()}


class Pretrainer(PretrainingJob, Trainer):
    """Pre-training: the objective's ELECTRA model, optimizer and loss (global denominators)."""

    def __init__(self, cfg: PretrainingConfig, strategy: tf.distribute.Strategy,
                 special_ids=None, unigram_counts=None, jit_compile: Optional[bool] = None):
        self.cfg = cfg
        self.objective = build_objective(cfg, special_ids, unigram_counts)
        tc = cfg.train
        super().__init__(
            strategy, self._build_model_of_config,
            lambda: make_optimizer(cfg.optimizer, tc.num_train_steps), seed=tc.seed,
            seed_stream=0x5EED, clip_norm=cfg.optimizer.clip_norm,
            grad_accum_steps=tc.grad_accum_steps, jit_compile=jit_compile)
        self.objective.global_step = self.global_step  # a temperature schedule reads it

    def loss(self, batch, seed, context, training, phase=0):
        return self.objective.loss(self.model, batch, seed, context, training, phase)

    def eval_step(self, batch, phase=0):
        dens = self.step_context(batch)
        loss, sums = self.loss(batch, self.step_seed(batch, offset=1), dens, False, phase)
        return dict(sums, loss_sum=loss, steps=tf.constant(1.0))

    def make_eval_loop(self, phase: Optional[int] = None):
        """Eval steps of `phase` (default: the phase of the current global step)."""
        if phase is None:
            phase = self.phase_at(int(self.global_step.numpy()))
        return self._host_loop(self.replica_eval(phase))
