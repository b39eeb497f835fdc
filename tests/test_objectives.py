"""electra_tf.pretraining.objectives: the registry (one class per --objective value) and
what each class declares; the losses themselves are tested in test_pretraining_objectives."""

import pytest

from electra_tf.configs import OBJECTIVE_NAMES, load_config
from electra_tf.pretraining import objectives


def test_every_objective_name_has_its_own_class():
    assert sorted(objectives.OBJECTIVES) == sorted(OBJECTIVE_NAMES)
    classes = list(objectives.OBJECTIVES.values())
    assert len(set(classes)) == len(classes) == 10
    for name, cls in objectives.OBJECTIVES.items():
        assert cls.name == name and cls.__doc__


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
    if name == "two_stage":
        assert built.phases() == [0, 20]


def test_register_refuses_a_second_class_for_a_name():
    with pytest.raises(ValueError, match="objective 'electra' registered twice"):
        objectives.register("electra")(type("Again", (objectives.Electra,), {}))
    assert objectives.OBJECTIVES["electra"] is objectives.Electra
