"""Pre-training as a `runtime.Job`: the configured objective's model, phases, log fields,
denominators and loss (`objectives.py`), the same on every runtime; `make_pretrainer` hands
it to the runtime the devices belong to."""

from typing import Dict, List, Optional

from electra_tf.configs import PretrainingConfig
from electra_tf.model.modeling import ElectraPretrainingModel
from electra_tf.objective_specs import LOG_GROUPS, SPECS
from electra_tf.pretraining.objectives import build_objective
from electra_tf.training import runtime

SEED_STREAM = 0x5EED


class PretrainingJob(runtime.Job):
    """Pre-training: the objective's ELECTRA model and loss (global denominators)."""

    def __init__(self, cfg: PretrainingConfig, special_ids=None, unigram_counts=None):
        self.cfg = cfg
        self.objective = build_objective(cfg, special_ids, unigram_counts)
        tc = cfg.train
        self.settings = runtime.Settings(cfg.optimizer, tc.num_train_steps, tc.seed,
                                         SEED_STREAM, cfg.optimizer.clip_norm,
                                         tc.grad_accum_steps)

    def build_model(self):
        model = ElectraPretrainingModel(self.cfg.model, heads=self.objective.heads)
        if self.cfg.objective.generator == "fixed":
            # Forward only: not among the trained variables (no gradient, no optimizer
            # state); still in the checkpoints, which resume it.
            model.generator.trainable = False
            model.generator_predictions.trainable = False
        return model

    def loss(self, model, batch, seed, context, training, phase=0, step=None):
        self.objective.global_step = step  # a temperature schedule reads it
        return self.objective.loss(model, batch, seed, context, training, phase)

    def denominators(self, batch):
        return self.objective.denominators(batch)

    def phases(self):
        return self.objective.phases()

    def on_phase_start(self, model, phase: int):
        self.objective.on_phase_start(model, phase)

    def log_fields(self, metrics: Dict[str, float]) -> List[str]:
        """The spec's log groups whose metrics this run reports (a uniform generator has
        no generator MLM; two_stage's first stage no discriminator)."""
        groups = (LOG_GROUPS[g] for g in SPECS[self.cfg.objective.objective].log_groups)
        return [text.format(**metrics) for key, text in groups if key in metrics]


def make_pretrainer(cfg: PretrainingConfig, devices: runtime.Devices, special_ids=None,
                    unigram_counts=None, jit_compile: Optional[bool] = None
                    ) -> runtime.Runtime:
    """Pre-training of `cfg` on the runtime of `devices`."""
    return devices.runtime(PretrainingJob(cfg, special_ids, unigram_counts), jit_compile)
