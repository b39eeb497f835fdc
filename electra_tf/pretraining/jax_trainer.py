"""Pre-training on the JAX runtime: `PretrainingJob` (the objective's model, phases, log
fields, denominators) over `training/jax_trainer.JaxTrainer` (the compiled step, host
loops, checkpoints in the TensorFlow runtime's format)."""

from electra_tf.configs import PretrainingConfig
from electra_tf.pretraining.objectives import build_objective
from electra_tf.pretraining.trainer import PretrainingJob
from electra_tf.training import distribute
from electra_tf.training.jax_trainer import JaxDevices, JaxTrainer


class JaxPretrainer(PretrainingJob, JaxTrainer):
    """`Pretrainer`'s JAX twin: the same model, objective, seeds and optimizer semantics."""

    def __init__(self, cfg: PretrainingConfig, devices: JaxDevices, special_ids=None,
                 unigram_counts=None):
        self.cfg = cfg
        self.objective = build_objective(cfg, special_ids, unigram_counts)
        tc = cfg.train
        super().__init__(devices, self._build_model_of_config, cfg.optimizer,
                         tc.num_train_steps, seed=tc.seed, seed_stream=0x5EED,
                         clip_norm=cfg.optimizer.clip_norm, grad_accum_steps=tc.grad_accum_steps,
                         float16=distribute.active_precision() == "float16")

    def loss(self, batch, seed, context, training, phase=0, step=None):
        self.objective.global_step = step  # a temperature schedule reads it (traced)
        return self.objective.loss(self.model, batch, seed, context, training, phase)
