"""electra_tf.pretraining.objectives: the registry (one class per --objective value) against
the specs (electra_tf/objective_specs.py) and what each class declares; the losses
themselves are tested in test_pretraining_objectives."""

import subprocess
import sys
import types

import pytest

from electra_tf import configs
from electra_tf.configs import load_config
from electra_tf.model.modeling import HEADS
from electra_tf.objective_specs import LOG_GROUPS, SPECS
from electra_tf.pretraining import objectives
from electra_tf.pretraining.trainer import Pretrainer
from electra_tf.training.loop import format_log_line
from electra_tf.training.trainer import LoopOutput


def test_every_spec_has_a_class_and_every_class_a_spec():
    assert sorted(objectives.OBJECTIVES) == sorted(SPECS) == sorted(configs.OBJECTIVE_NAMES)
    classes = list(objectives.OBJECTIVES.values())
    assert len(set(classes)) == len(classes) == len(SPECS)
    for name, cls in objectives.OBJECTIVES.items():
        assert cls.name == name and cls.__doc__ and cls.heads == SPECS[name].heads


@pytest.mark.subprocess
def test_specs_are_tensorflow_free_and_well_formed():
    code = "import sys, electra_tf.objective_specs; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    for spec in SPECS.values():
        assert spec.description and "; " not in spec.description  # the help's separator
        assert set(spec.heads) <= set(HEADS) and set(spec.log_groups) <= set(LOG_GROUPS)
        assert {spec.generator_positions, spec.mlm_positions} <= {"slots", "all"}
        assert spec.generator_towers in (0, 1, 2) and len(spec.phases) in (0, 2)
        for key, value, flag in spec.requirements:  # a real key, a value of its type
            configs.apply_overrides(configs.PretrainingConfig(), {key: value})
            assert flag.startswith("--")


def test_register_refuses_a_name_without_a_spec():
    with pytest.raises(ValueError, match="objective 'gan' has no spec"):
        objectives.register("gan")(type("Gan", (objectives.Electra,), {}))
    assert "gan" not in objectives.OBJECTIVES


def test_log_fields_are_the_specs_groups_the_run_reports():
    metrics = {"masked_lm_loss": 6.12345, "masked_lm_accuracy": 0.1, "main_lm_loss": 2.0,
               "main_lm_accuracy": 0.5, "disc_loss": 0.4, "disc_accuracy": 0.85,
               "disc_auc": 0.55, "replaced_fraction": 0.1394, "hp_loss_corr": -0.3781}

    def fields(name, drop=()):
        job = types.SimpleNamespace(cfg=load_config("tiny", {"objective": name}))
        return Pretrainer.log_fields(job, {k: v for k, v in metrics.items() if k not in drop})

    mlm = "mlm_loss 6.1235 mlm_acc 0.1000"
    disc = "disc_loss 0.4000 disc_acc 0.8500 disc_auc 0.5500 replaced 0.139"
    main = "main_lm_loss 2.0000 main_lm_acc 0.5000"
    assert fields("hp_loss") == [mlm, disc, "hp_corr -0.378"]
    assert fields("electra") == [mlm, disc] and fields("replace_mlm") == [mlm, main]
    assert fields("mlm") == [main]
    assert fields("electra", drop=("masked_lm_loss",)) == [disc]  # a uniform generator
    assert fields("two_stage", drop=("disc_loss",)) == [mlm]  # its first stage
    out = LoopOutput(26.48554, metrics, 1.0, 0)
    assert format_log_line(600, 600, out, 0.0, 61.08, 0.0, 42.5e9, 0.258,
                           fields("electra")) == (
        f"step 600/600 | loss 26.4855 | {mlm} | {disc} | lr 0 | 61.1 seq/s | "
        "42.5 GFLOP/s MFU 25.8% | ETA 0:00:00")
    assert format_log_line(1, 2, out, 1e-4, 1.0, 5.0) == \
        "step 1/2 | loss 26.4855 | lr 0.0001 | 1.0 seq/s | ETA 0:00:05"  # fine-tuning's


@pytest.mark.parametrize("name,heads,phases", [
    ("electra", (), 1), ("electra_15", (), 1), ("hp_loss", ("sampling",), 1),
    ("hp_dist", ("sampling",), 1), ("adversarial", ("baseline",), 1), ("two_stage", (), 2),
    ("mlm", ("mlm",), 1), ("replace_mlm", ("mlm",), 1), ("all_tokens_mlm", ("mlm",), 1),
    ("electric", (), 1)])
def test_build_objective(name, heads, phases):
    cfg = load_config("tiny", {"objective": name, "num_train_steps": "40"})
    built = objectives.build_objective(cfg)
    assert type(built) is objectives.OBJECTIVES[name]
    assert built.heads == heads and len(built.phases()) == phases
    assert len(SPECS[name].phases) == (phases if phases > 1 else 0)
    if name == "two_stage":
        assert built.phases() == [0, 20]


def test_register_refuses_a_second_class_for_a_name():
    with pytest.raises(ValueError, match="objective 'electra' registered twice"):
        objectives.register("electra")(type("Again", (objectives.Electra,), {}))
    assert objectives.OBJECTIVES["electra"] is objectives.Electra
