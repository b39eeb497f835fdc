"""electra_tf.pretraining.objectives: the registry (one class per --objective value) against
the specs (electra_tf/objective_specs.py) and what each class declares; the losses
themselves are tested in test_pretraining_objectives."""

import subprocess
import sys

import pytest

from electra_tf import configs
from electra_tf.configs import load_config
from electra_tf.model.modeling import HEADS
from electra_tf.objective_specs import LOG_GROUPS, SPECS
from electra_tf.pretraining import objectives


def test_every_spec_has_a_class_and_every_class_a_spec():
    assert sorted(objectives.OBJECTIVES) == sorted(SPECS) == sorted(configs.OBJECTIVE_NAMES)
    classes = list(objectives.OBJECTIVES.values())
    assert len(set(classes)) == len(classes) == 10
    for name, cls in objectives.OBJECTIVES.items():
        assert cls.name == name and cls.__doc__ and cls.heads == SPECS[name].heads


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
