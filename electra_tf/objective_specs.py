"""What each pre-training objective is, as data: one `ObjectiveSpec` per --objective
value in `SPECS`, in the order of the CLI help and the README's table. TensorFlow-free
(configs and flags read it first); the loss is the class of the same name in
`pretraining/objectives.py`. docs/objectives.md: who reads each field, how to add one.
"""

import dataclasses
from typing import Any, Dict, Tuple

# What an objective needs of the config, set for it unless the user set otherwise:
# (config key, value, the flag that fixes a conflicting value the user set).
Requirement = Tuple[str, Any, str]

# Groups of the training log line: name -> (the metric whose presence shows the group,
# its text as `str.format` over the metrics).
LOG_GROUPS = {
    "mlm": ("masked_lm_loss", "mlm_loss {masked_lm_loss:.4f} mlm_acc {masked_lm_accuracy:.4f}"),
    "main_lm": ("main_lm_loss",
                "main_lm_loss {main_lm_loss:.4f} main_lm_acc {main_lm_accuracy:.4f}"),
    "disc": ("disc_loss", "disc_loss {disc_loss:.4f} disc_acc {disc_accuracy:.4f} "
             "disc_auc {disc_auc:.4f} replaced {replaced_fraction:.3f}"),
    "hp_corr": ("hp_loss_corr", "hp_corr {hp_loss_corr:.3f}"),
}


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    """One objective. The FLOP fields describe what a step runs (`pretraining/flops.py`
    counts from them): the generator side (its towers, their LM head, the `heads` on its
    hidden states), then the discriminator-sized encoder and its heads."""
    name: str
    description: str  # one line: the --objective help
    # The generator network trains from this objective: it cannot be a uniform, unigram
    # or fixed generator.
    trains_generator: bool = False
    requirements: Tuple[Requirement, ...] = ()
    # Generator-sized encoders a step runs: 0 none (BERT), 2 ELECTRIC's two towers (their
    # LM head reads both).
    generator_towers: int = 1
    generator_positions: str = "slots"  # where the generator's LM head predicts: slots | all
    # Optional model heads (`modeling.HEADS`): "mlm" on the discriminator-sized encoder
    # (at `mlm_positions`), "sampling" (an LM head) and "baseline" (dense(1)) on the
    # generator's hidden states at the slots.
    heads: Tuple[str, ...] = ()
    mlm_positions: str = "slots"  # slots | all
    discriminator_head: bool = True  # the binary head over every position
    # Stages of a run in stages (two_stage): the first trains the generator side alone,
    # the second the discriminator side with the generator forward only, from
    # objective.two_stage_switch_step; the weight copy between them is the class's.
    phases: Tuple[str, ...] = ()
    log_groups: Tuple[str, ...] = ("mlm", "disc")  # `LOG_GROUPS`, in log-line order
    hp_weight: float = 1.0  # lambda_1 of a sampling head when objective.hp_weight < 0
    # objective.mask_with_replacement (the official code's masking) is allowed.
    official_masking: bool = False


# ELECTRA and the ELECTRA paper's comparisons (3.2, 3.5, Appendix F), the sampling heads
# of "Learning to Sample Replacements for ELECTRA" (hp_loss, hp_dist), and ELECTRIC.
SPECS: Dict[str, ObjectiveSpec] = {s.name: s for s in (
    ObjectiveSpec("electra", "generator MLM + the discriminator's BCE over all real tokens",
                  official_masking=True),
    ObjectiveSpec("electra_15", "the discriminator's BCE only over the masked positions"),
    ObjectiveSpec("mlm", "BERT, no generator: an MLM head on the discriminator-sized "
                  "encoder", generator_towers=0, heads=("mlm",), discriminator_head=False,
                  log_groups=("main_lm",)),
    ObjectiveSpec("replace_mlm", "generator samples instead of [MASK], MLM loss there",
                  heads=("mlm",), discriminator_head=False, log_groups=("mlm", "main_lm")),
    ObjectiveSpec("all_tokens_mlm", "as replace_mlm, predicting every token with the copy "
                  "mechanism", heads=("mlm",), mlm_positions="all",
                  log_groups=("mlm", "main_lm")),
    # Initialises the discriminator from the generator (equal sizes) and freezes the
    # generator while the discriminator trains (nothing shared).
    ObjectiveSpec("two_stage", "the generator alone, then the discriminator initialised "
                  "from it with the generator frozen", trains_generator=True,
                  requirements=(
                      ("model.generator_hidden_size", 1.0,
                       "--params_override=model.generator_hidden_size=1.0"),
                      ("model.generator_layers", 1.0,
                       "--params_override=model.generator_layers=1.0"),
                      ("model.tie_embeddings", False, "--generator_tying=none"),
                      ("model.tie_all_weights", False, "--generator_tying=none")),
                  phases=("generator", "discriminator")),
    ObjectiveSpec("adversarial", "the generator maximises the discriminator's loss by "
                  "REINFORCE with a learned baseline (no MLE)", trains_generator=True,
                  heads=("baseline",)),
    ObjectiveSpec("hp_loss", "replacements from a sampling head that predicts the "
                  "discriminator's loss", trains_generator=True, heads=("sampling",),
                  log_groups=("mlm", "disc", "hp_corr"), hp_weight=5.0),
    ObjectiveSpec("hp_dist", "replacements from a sampling head trained towards p_G x the "
                  "discriminator's loss", trains_generator=True, heads=("sampling",),
                  log_groups=("mlm", "disc", "hp_corr")),
    # The noise model is the two-tower cloze generator.
    ObjectiveSpec("electric", "an energy-based cloze model (ELECTRIC) trained by "
                  "noise-contrastive estimation against a two-tower generator",
                  trains_generator=True, requirements=(
                      ("model.two_tower_generator", True,
                       "--params_override=model.two_tower_generator=true"),
                      ("model.tie_all_weights", False, "--generator_tying=embeddings")),
                  generator_towers=2, generator_positions="all"),
)}
