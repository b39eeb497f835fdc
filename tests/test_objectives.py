"""electra_tf.pretraining.objectives: the registry (one class per --objective value) against
the specs (electra_tf/objective_specs.py) and what each class declares; then each variant
on a small model: its loss at initialisation, one XLA-compiled step that changes exactly
the weights it should, no discriminator gradient into the generator, and two_stage's
phases through the real training run."""

import math
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import configs, rng
from electra_tf.compat import xla_cpu_available
from electra_tf.configs import ConfigError, load_config
from electra_tf.model.modeling import HEADS
from electra_tf.objective_specs import LOG_GROUPS, SPECS
from electra_tf.pretraining import objectives, pretrain
from electra_tf.pretraining.trainer import PretrainingJob
from runtimes import tf_pretrainer
from electra_tf.training.loop import format_log_line
from electra_tf.training.options import PretrainingOptions
from electra_tf.training.loop import LoopOutput


def test_every_spec_has_a_class_and_every_class_a_spec():
    assert sorted(objectives.OBJECTIVES) == sorted(SPECS) == sorted(configs.OBJECTIVE_NAMES)
    classes = list(objectives.OBJECTIVES.values())
    assert len(set(classes)) == len(classes) == len(SPECS)
    for name, cls in objectives.OBJECTIVES.items():
        assert cls.name == name and cls.__doc__ and cls.heads == SPECS[name].heads


@pytest.mark.every_leg
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
        return PretrainingJob.log_fields(job, {k: v for k, v in metrics.items() if k not in drop})

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


# ----------------------------------------------------------------------------- each objective on a small model

V = 1000
B, L = 4, 32
LN2, LNV = math.log(2), math.log(V)
TWO_STAGE = {"model.generator_hidden_size": "1.0", "model.tie_embeddings": "false"}
VARIANTS = {
    "electra": {}, "electra_15": {}, "mlm": {}, "replace_mlm": {}, "all_tokens_mlm": {},
    "hp_loss": {"objective.gen_focal_gamma": "piecewise"}, "hp_dist": {}, "adversarial": {},
    "two_stage": TWO_STAGE, "electric": {}}
ELECTRIC_GEN = ("generator_ltr/", "generator_rtl/", "cloze_predictions/")
GROUPS = ("generator/", "generator_predictions/", "electra/", "discriminator_predictions/",
          "mlm_predictions/", "sampling_predictions/", "adversarial_baseline/") + ELECTRIC_GEN
GEN_SIDE = ("generator/", "generator_predictions/", "sampling_predictions/",
            "adversarial_baseline/") + ELECTRIC_GEN
ELECTRA_GROUPS = {"generator/", "generator_predictions/", "electra/",
                  "discriminator_predictions/"}
# Weight groups one step of each objective (and phase) changes.
CHANGED = {
    ("electra", 0): ELECTRA_GROUPS, ("electra_15", 0): ELECTRA_GROUPS,
    ("hp_loss", 0): ELECTRA_GROUPS | {"sampling_predictions/"},
    ("hp_dist", 0): ELECTRA_GROUPS | {"sampling_predictions/"},
    ("adversarial", 0): ELECTRA_GROUPS | {"adversarial_baseline/"},
    ("mlm", 0): {"electra/", "mlm_predictions/"},
    ("replace_mlm", 0): {"generator/", "generator_predictions/", "electra/",
                         "mlm_predictions/"},
    ("all_tokens_mlm", 0): ELECTRA_GROUPS | {"mlm_predictions/"},
    ("two_stage", 0): {"generator/", "generator_predictions/"},
    ("two_stage", 1): {"electra/", "discriminator_predictions/"},
    ("electric", 0): {"electra/", "discriminator_predictions/"} | set(ELECTRIC_GEN),
}


def _cfg(name, **extra):
    over = {"model.vocab_size": V, "model.embedding_size": 32, "model.hidden_size": 64,
            "model.num_hidden_layers": 1, "model.num_attention_heads": 1,
            "model.intermediate_size": 128, "model.generator_hidden_size": 0.5,
            "model.max_position_embeddings": L, "train.max_seq_length": L,
            "train.train_batch_size": B, "train.num_train_steps": 10,
            "optimizer.warmup_steps": 0, "objective.objective": name}
    over.update(VARIANTS[name])
    over.update(extra)
    return load_config("tiny", over)


def _batch(seed=0):
    ids = np.random.default_rng(seed).integers(200, V, (B, L)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones((B, L), np.int32)
    mask[1, 20:] = 0  # a padded row
    ids[1, 20:] = 0
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask),
            "segment_ids": tf.zeros((B, L), tf.int32)}


def _group(path):
    for g in GROUPS:
        if path.startswith(g):
            return g
    raise AssertionError(path)


def _snapshot(trainer):
    return {v.path: v.numpy().copy() for v in trainer.variables}


@pytest.fixture(scope="module")
def batch():
    return _batch()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_loss_terms_at_initialisation(name, batch):
    trainer = tf_pretrainer(_cfg(name), tf.distribute.get_strategy(), jit_compile=False)
    dens = trainer.job.objective.denominators(batch)
    for phase in range(len(trainer.job.objective.phases())):
        terms, sums = trainer.job.objective.loss_terms(trainer.model, batch, tf.constant([1, 2, 0]),
                                                   dens, False, phase)
        terms = {k: float(v) for k, v in terms.items()}
        gen = "generator" in terms and name != "adversarial"
        # A fresh vocabulary head is near uniform: MLM cross-entropy ~ ln V (hp_loss's
        # generator term over 12 masking seeds: 0.989-1.004 ln V; a wrong normaliser is off
        # by a factor).
        if gen:
            assert terms.pop("generator") == pytest.approx(LNV, rel=0.02)
        if name in ("mlm", "replace_mlm"):
            assert terms.pop("mlm") == pytest.approx(LNV, rel=0.02)
        if name == "all_tokens_mlm":
            # Copy probability ~1/2: -log(1/2 + 1/2V) for a kept token, -log(1/(2V)) for a
            # replaced one.
            labels = float(sums["sampled_correct"])  # slots whose sample is the original
            slots, real = float(sums["mlm_weight"]), float(dens["disc"])
            replaced = slots - labels
            want = ((real - replaced) * -math.log(0.5 + 0.5 / V) +
                    replaced * -math.log(0.5 / V)) / real
            assert terms.pop("mlm") == pytest.approx(want, rel=0.05)
        if name == "hp_loss":  # estimate and discriminator both ~1/2
            assert 0 <= terms.pop("sampling") < 0.05 * 5
        if name == "hp_dist":  # p_G / p_S ~ 1, L_D ~ ln 2, -log p_S ~ ln V
            assert terms.pop("sampling") == pytest.approx(LN2 * LNV, rel=0.1)
        if name == "adversarial":
            assert terms.pop("baseline") == pytest.approx(LN2, rel=0.05)
            assert abs(terms.pop("generator")) < 0.2 * LNV  # advantage ~ 0
        if name == "electric":
            # E ~ 0 and q ~ 1/V: the noise logit is ~ log(k / V), k = 0.15 / 0.85; every
            # slot is labelled noise, every other real token data.
            logit = math.log(0.15 / 0.85 / V)
            slots, real = float(sums["mlm_weight"]), float(dens["disc"])
            want = (slots * math.log1p(math.exp(-logit)) +
                    (real - slots) * math.log1p(math.exp(logit))) / real
            assert float(sums["disc_label_pos"]) == slots
            assert terms.pop("discriminator") == pytest.approx(50 * want, rel=0.03)
        if "discriminator" in terms:  # BCE ~ ln 2 (electra_15: over ~16 slots only)
            assert terms.pop("discriminator") == pytest.approx(
                50 * LN2, rel=0.15 if name == "electra_15" else 0.06)
        assert not terms, terms


@pytest.mark.slow
@pytest.mark.parametrize("name,phase", sorted(CHANGED))
def test_one_compiled_step_changes_only_its_weights(name, phase, batch):
    # Without dropout: which weights a step moves does not depend on it, and its draws are
    # most of what XLA compiles (a quarter of the compile time, docs/testing.md).
    no_dropout = {"model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0}
    trainer = tf_pretrainer(_cfg(name, **no_dropout), tf.distribute.get_strategy(),
                         jit_compile=xla_cpu_available())
    if phase:
        trainer.global_step.assign(trainer.job.objective.phases()[phase])
    before = _snapshot(trainer)
    ds = tf.data.Dataset.from_tensors(batch).repeat()
    sums = trainer.make_train_loop(phase)(iter(ds), tf.constant(1))
    assert float(sums["skipped"]) == 0.0
    assert trainer.trace_count == 1
    after = _snapshot(trainer)
    changed = {path for path in before if not np.array_equal(before[path], after[path])}
    expected = CHANGED[(name, phase)]
    for path in before:
        if _group(path) in expected:
            assert path in changed, f"{name}: {path} did not change"
        else:
            assert path not in changed, f"{name}: {path} changed"


@pytest.mark.parametrize("name", sorted(set(VARIANTS) - {"mlm"}))
def test_no_discriminator_gradient_reaches_the_generator(name, batch):
    trainer = tf_pretrainer(_cfg(name), tf.distribute.get_strategy(), jit_compile=False)
    dens = trainer.job.objective.denominators(batch)
    gen_only = [v for v in trainer.variables if v.path.startswith(GEN_SIDE)]
    phase = len(trainer.job.objective.phases()) - 1
    with tf.GradientTape() as tape:
        terms, _ = trainer.job.objective.loss_terms(trainer.model, batch, tf.constant([4, 5, 0]),
                                                dens, True, phase)
        # The terms computed from the discriminator's (or main MLM model's) output.
        main = terms.get("discriminator", 0.0) + terms.get("mlm", 0.0)
    grads = tape.gradient(main, gen_only)
    leaking = [v.path for v, g in zip(gen_only, grads)
               if g is not None and np.any(tf.convert_to_tensor(g).numpy() != 0)]
    assert gen_only and not leaking


@pytest.mark.e2e
def test_two_stage_run_freezes_the_generator_and_starts_from_it(tmp_path, sample_build):
    """4 steps, switch at 2: phase 0 trains the generator alone; at step 2 the
    discriminator becomes a copy of it; then the generator stays bit-identical."""
    cfg = load_config("tiny", {"train_batch_size": "4", "num_train_steps": "4",
                               "save_checkpoints_steps": "2", "steps_per_loop": "4",
                               "log_every_steps": "4", "warmup_steps": "0",
                               "objective.objective": "two_stage",
                               "generator_hidden_size": "1.0", "tie_embeddings": "false"})
    out = tmp_path / "run"
    # As a graph: the phases' XLA programs are compiled and run in
    # test_one_compiled_step_changes_only_its_weights[two_stage-*]; this run checks what
    # the host loop does at the switch (two programs here would be 2 x 8 s of compile).
    pretrain.run(cfg, PretrainingOptions(model_dir=str(out), train_data=sample_build[0],
                                         strategy="cpu", jit_compile=False))

    def weights(step):
        reader = tf.train.load_checkpoint(str(out / f"ckpt-{step}"))
        return {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(str(out /
                f"ckpt-{step}")) if n.startswith("model/") and "OPTIMIZER" not in n}

    w2, w4 = weights(2), weights(4)
    gen = [n for n in w2 if n.startswith("model/generator/")]
    for n in gen:
        np.testing.assert_array_equal(w2[n], w4[n])  # frozen in phase 1

    def disc_name(n):  # the discriminator's embeddings are tracked as model/embeddings
        d = n.replace("model/generator/", "model/electra/")
        return d if d in w2 else n.replace("model/generator/", "model/")

    # At step 2 the discriminator was still untrained and differs from the generator;
    # by step 4 it started from the generator's weights and moved away from them.
    paired = [(n, disc_name(n)) for n in gen]
    assert len(gen) > 30 and all(d in w2 for _, d in paired)
    assert len({d for _, d in paired}) == len(gen)
    assert any(not np.array_equal(w2[g], w2[d]) for g, d in paired)
    moved = [float(np.abs(w4[d] - w4[g]).max()) for g, d in paired]
    start = [float(np.abs(w2[d] - w2[g]).max()) for g, d in paired]
    # Two AdamW steps of lr 1e-3 move a weight by well under 0.02; two fresh
    # initialisations differ by more.
    assert max(moved) < 0.02 < max(start)


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="expected one of"):
        _cfg("electra", **{"objective.objective": "gan"})
    with pytest.raises(ConfigError, match="needs model.tie_embeddings=False .* use --generator_tying=none"):
        _cfg("two_stage", **{"model.tie_embeddings": "true"})
    with pytest.raises(ConfigError, match="generator_hidden_size=1.0"):
        _cfg("two_stage", **{"model.generator_hidden_size": "0.5"})
    with pytest.raises(ConfigError, match="gen_focal_gamma"):
        _cfg("electra", **{"objective.gen_focal_gamma": "-1"})
    with pytest.raises(ConfigError, match="has none"):
        _cfg("hp_loss", **{"objective.generator": "uniform"})
    cfg = _cfg("two_stage")
    assert cfg.objective.switch_step(cfg.train.num_train_steps) == 5
    assert _cfg("hp_loss").objective.sampling_weight() == 5.0
    assert _cfg("hp_dist").objective.sampling_weight() == 1.0


def test_electric_sets_its_two_tower_generator_and_refuses_conflicts():
    cfg = _cfg("electric")
    assert cfg.model.two_tower_generator and not cfg.model.tie_all_weights
    untied = _cfg("electric", **{"model.tie_embeddings": "false"})
    assert untied.model.two_tower_generator and not untied.model.tie_embeddings
    with pytest.raises(ConfigError, match="needs model.tie_all_weights=False .* use "
                       "--generator_tying=embeddings"):
        _cfg("electric", **{"model.tie_all_weights": "true",
                            "model.generator_hidden_size": "1.0"})
    with pytest.raises(ConfigError, match="two_tower_generator is ELECTRIC's noise model: "
                       "use it with --objective=electric, not electra"):
        _cfg("electra", **{"model.two_tower_generator": "true"})
    with pytest.raises(ConfigError, match="has none"):
        _cfg("electric", **{"objective.generator": "uniform"})


def test_electric_terms_recomposed_from_the_model(batch):
    """The generator term is the cloze cross-entropy over every maskable position; the
    discriminator term the NCE BCE whose logits add log q of the token the discriminator
    saw (the sample at a slot) and log k."""
    trainer = tf_pretrainer(_cfg("electric"), tf.distribute.get_strategy(), jit_compile=False)
    objective, model = trainer.job.objective, trainer.model
    # Train the cloze model away from uniform so that log q varies by token.
    for v in model.generator_predictions.trainable_variables:
        v.assign(tf.random.stateless_normal(v.shape, [3, v.shape.rank], stddev=0.5))
    dens = objective.denominators(batch)
    seed = tf.constant([7, 8, 0])
    terms, sums = objective.loss_terms(model, batch, seed, dens, False)
    ids, mask = batch["input_ids"].numpy(), batch["input_mask"].numpy()
    logits = model.generator_predictions(model.generator_hidden(
        batch["input_ids"], batch["input_mask"], batch["segment_ids"])).numpy()
    log_q = logits - logits.max(-1, keepdims=True)
    log_q -= np.log(np.exp(log_q).sum(-1, keepdims=True))
    maskable = (mask == 1) & ~np.isin(ids, [101, 102, 103])
    nll = -np.take_along_axis(log_q, ids[..., None], -1)[..., 0]
    assert float(dens["cloze"]) == maskable.sum()
    assert float(terms["generator"]) == pytest.approx(nll[maskable].mean(), rel=1e-5)
    # Redo the corruption with the objective's own seeds; the discriminator runs without
    # dropout here, so its energies are a function of the corrupted ids.
    seeds = rng.split(seed, 4)
    masked = objective.mask(batch, seeds[0])
    sampled = objective.sample(tf.gather(logits, masked["masked_positions"], batch_dims=1),
                               masked, seeds[1]).numpy()
    fake, labels = ids.copy(), np.zeros_like(ids)
    for b in range(B):
        for pos, sample, w in zip(masked["masked_positions"].numpy()[b], sampled[b],
                                  masked["masked_weights"].numpy()[b]):
            if w > 0:
                fake[b, pos], labels[b, pos] = sample, 1
    energies = model.discriminator(fake, batch["input_mask"], batch["segment_ids"]).numpy()
    noise = energies + np.take_along_axis(log_q, fake[..., None], -1)[..., 0] + \
        math.log(0.15 / 0.85)
    bce = np.maximum(noise, 0) - noise * labels + np.log1p(np.exp(-np.abs(noise)))
    assert float(terms["discriminator"]) == pytest.approx(
        50 * bce[mask == 1].mean(), rel=1e-5)
    assert float(sums["disc_label_pos"]) == labels.sum() == float(sums["mlm_weight"])


@pytest.mark.slow
def test_gdes_routes_each_loss_to_its_own_embeddings(batch):
    """--generator_tying=gdes: the discriminator's term moves only its deltas (and its
    own LayerNorm), never the generator's tables; the generator's MLM term moves the
    tables and never a delta. At initialisation both networks embed with equal tables,
    and one compiled step updates tables, deltas and both LayerNorms."""
    cfg = _cfg("electra", **{"model.disentangled_embeddings": "true"})
    trainer = tf_pretrainer(cfg, tf.distribute.get_strategy(), jit_compile=False)
    model = trainer.model
    deltas = model.embeddings.deltas
    tables = [model.generator.embeddings.word_embeddings,
              model.generator.embeddings.position_embeddings,
              model.generator.embeddings.token_type_embeddings]
    for folded, table in zip(model.embeddings.tables(), tables):
        np.testing.assert_array_equal(folded.numpy(), table.numpy())
    dens = trainer.job.objective.denominators(batch)
    with tf.GradientTape(persistent=True) as tape:
        terms, _ = trainer.job.objective.loss_terms(model, batch, tf.constant([4, 5, 0]), dens,
                                                True)

    def moved(term, variables):
        grads = tape.gradient(terms[term], variables)
        return [g is not None and bool(np.any(tf.convert_to_tensor(g).numpy() != 0))
                for g in grads]

    assert moved("discriminator", deltas) == [True, True, True]
    assert moved("discriminator", tables) == [False, False, False]
    assert moved("generator", tables) == [True, True, True]
    assert moved("generator", deltas) == [False, False, False]
    assert moved("discriminator", [model.embeddings.layer_norm.gamma]) == [True]
    assert moved("generator", [model.embeddings.layer_norm.gamma]) == [False]
    compiled = tf_pretrainer(cfg, tf.distribute.get_strategy(),
                         jit_compile=xla_cpu_available())
    before = _snapshot(compiled)
    compiled.make_train_loop(0)(iter(tf.data.Dataset.from_tensors(batch).repeat()),
                                tf.constant(1))
    after = _snapshot(compiled)
    for path in before:
        if "embeddings/" in path and "embeddings_project" not in path:
            assert not np.array_equal(before[path], after[path]), path


def test_gdes_flag_and_its_conflicts():
    from electra_tf import configs
    flags = type("Flags", (), {"config": "tiny", "params_override": "", "generator_tying":
                               "gdes", "__getattr__": lambda self, name: None})()  # unset
    m = configs.config_from_flags(flags, configs.PretrainingConfig).model
    assert (m.tie_embeddings, m.tie_all_weights, m.disentangled_embeddings) == (True, False,
                                                                                True)
    over = dict(zip(("model.tie_embeddings", "model.tie_all_weights",
                     "model.disentangled_embeddings"), configs.TYINGS["gdes"]))
    assert _cfg("electra", **over).model.disentangled_embeddings
    with pytest.raises(ConfigError, match="needs tie_embeddings=true, tie_all_weights=false "
                       "and no two_tower_generator"):
        _cfg("electric", **over)
    with pytest.raises(ConfigError, match="needs model.tie_embeddings=False"):
        _cfg("two_stage", **over)


# --- Fast-ELECTRA: a fixed generator and a temperature schedule --------------------------

FIXED = {"objective.generator": "fixed", "objective.generator_checkpoint": "unused"}


def test_fixed_generator_config():
    cfg = _cfg("electra", **FIXED)  # sets untied embeddings for it (logged)
    assert not cfg.model.tie_embeddings and not cfg.model.tie_all_weights
    with pytest.raises(ConfigError, match="objective.generator=fixed needs "
                       "model.tie_embeddings=False .* use --generator_tying=none"):
        _cfg("electra", **FIXED, **{"model.tie_embeddings": "true"})
    with pytest.raises(ConfigError, match="has none"):
        _cfg("hp_loss", **FIXED)
    with pytest.raises(ConfigError, match="go together"):
        _cfg("electra", **{"objective.generator": "fixed"})
    for bad in ("exponential", "quadratic:2", "linear:0", "linear:2:x", "cosine:2:1:3"):
        with pytest.raises(ConfigError, match="objective.temperature_schedule"):
            _cfg("electra", **{"objective.temperature_schedule": bad})
    assert _cfg("electra", **{"objective.temperature_schedule": "exponential:2"}) \
        .objective.schedule() == ("exponential", 2.0, 1.0)


@pytest.mark.slow
def test_fixed_generator_step_trains_the_discriminator_only(batch):
    """No generator term, no gradient and no optimizer state for the generator; one
    compiled step changes every discriminator weight and no generator weight; the
    scheduled temperature follows the step counter without a retrace."""
    cfg = _cfg("electra", **FIXED, **{"objective.temperature_schedule": "exponential:4"})
    trainer = tf_pretrainer(cfg, tf.distribute.get_strategy(),
                         jit_compile=xla_cpu_available())
    model = trainer.model
    generator = {id(w) for w in model.generator.weights + model.generator_predictions.weights}
    assert generator and not generator & {id(v) for v in trainer.variables}
    slots = list(trainer.optimizer.slot_variables())
    assert slots and not any(k.startswith("generator") for k in slots)
    terms, sums = trainer.job.objective.loss_terms(
        model, batch, tf.constant([1, 2, 0]), trainer.job.objective.denominators(batch), True)
    assert set(terms) == {"discriminator"} and "mlm_loss_sum" in sums
    weights = lambda: {w.path: w.numpy().copy() for w in model.weights}
    before = weights()
    loop = trainer.make_train_loop(0)
    temps = []
    for _ in range(3):
        temps.append(float(trainer.job.objective.temperature()))
        loop(iter(tf.data.Dataset.from_tensors(batch).repeat()), tf.constant(2))
    assert trainer.trace_count == 1 and int(trainer.global_step.numpy()) == 6
    assert temps == pytest.approx([4.0, 4.0 * 0.25 ** 0.2, 4.0 * 0.25 ** 0.4], rel=1e-5)
    after = weights()
    assert any(p.startswith("generator/") for p in before)
    for path in before:
        changed = not np.array_equal(before[path], after[path])
        assert changed == path.startswith(("electra/", "discriminator_predictions/")), path


def _source_generator(tmp_path):
    """A tied-embeddings ELECTRA model (the released layout) with random weights, written
    as a TF1 checkpoint and as one of our model_dirs."""
    from electra_tf import fileio
    from electra_tf.model.modeling import ElectraPretrainingModel
    from electra_tf.training import checkpoints
    cfg = load_config("tiny")
    source = ElectraPretrainingModel(cfg.model)
    for i, w in enumerate(source.weights):
        w.assign(tf.random.stateless_normal(w.shape, [i, 9], stddev=0.05))
    checkpoints.save_tf1_checkpoint(source, str(tmp_path / "tf1" / "model.ckpt"))
    model_dir = tmp_path / "run"
    fileio.makedirs(str(model_dir))
    fileio.write_json_atomic(str(model_dir / "config.json"), cfg.to_json())
    tf.train.Checkpoint(model=source).save(str(model_dir / "ckpt"))
    return source, str(tmp_path / "tf1"), str(model_dir)


def test_fixed_generator_loads_from_tf1_and_model_dirs(tmp_path):
    source, tf1_dir, model_dir = _source_generator(tmp_path)
    assert "generator/embeddings/word_embeddings" not in tf.train.load_checkpoint(
        tf1_dir).get_variable_to_shape_map()  # tied: the generator reads electra/
    for path in (tf1_dir, model_dir):
        cfg = load_config("tiny", {**FIXED, "objective.generator_checkpoint": path})
        model = tf_pretrainer(cfg, tf.distribute.get_strategy(), jit_compile=False).model
        read = pretrain.load_fixed_generator(model, path)
        assert read.startswith(path)
        np.testing.assert_array_equal(model.generator.embeddings.word_embeddings.numpy(),
                                      source.embeddings.word_embeddings.numpy())
        for a, b in zip(model.generator.blocks[1].weights + model.generator_predictions.weights,
                        source.generator.blocks[1].weights +
                        source.generator_predictions.weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert not np.array_equal(model.electra.blocks[0].query.kernel.numpy(),
                                  source.electra.blocks[0].query.kernel.numpy())
    wrong = load_config("tiny", {**FIXED, "model.generator_hidden_size": "0.25"})
    model = tf_pretrainer(wrong, tf.distribute.get_strategy(), jit_compile=False).model
    for path in (tf1_dir, model_dir):  # one check for every source
        with pytest.raises(pretrain.RunError, match=r"generator/encoder/layer_0/attention/self/"
                           r"query/kernel has shape \[64, 64\], the configured generator's "
                           r"is \[32, 32\] \(set model.generator_hidden_size"):
            pretrain.load_fixed_generator(model, path)


@pytest.mark.e2e
def test_fixed_generator_run_keeps_the_loaded_generator(tmp_path, sample_build):
    source, tf1_dir, _ = _source_generator(tmp_path)
    cfg = load_config("tiny", {**FIXED, "objective.generator_checkpoint": tf1_dir,
                               "objective.temperature_schedule": "exponential:2",
                               "train_batch_size": "4", "num_train_steps": "2",
                               "save_checkpoints_steps": "2", "steps_per_loop": "2",
                               "log_every_steps": "2", "warmup_steps": "0"})
    out = str(tmp_path / "fast")
    # As a graph: the fixed-generator step under XLA is
    # test_fixed_generator_step_trains_the_discriminator_only's; here the loaded generator.
    metrics = pretrain.run(cfg, PretrainingOptions(model_dir=out, train_data=sample_build[0],
                                                   strategy="cpu", jit_compile=False))
    assert "masked_lm_accuracy" in metrics and np.isfinite(metrics["loss"])
    reader = tf.train.load_checkpoint(out)
    stored = {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(out)
              if n.startswith("model/generator/") and "OPTIMIZER" not in n}
    assert stored and not any("OPTIMIZER" in n and "generator" in n
                              for n, _ in tf.train.list_variables(out))
    word = [v for n, v in stored.items() if "word_embeddings" in n]
    np.testing.assert_array_equal(word[0], source.embeddings.word_embeddings.numpy())


# --- the official masking (objective.mask_with_replacement) ------------------------------

def test_official_masking_counts_duplicate_slots(batch):
    """With replacement: the same slots per row as without, duplicates among them; the
    MLM denominator counts slots, the discriminator's labels distinct replaced tokens;
    the ELECTRA loss at initialisation keeps its value."""
    plain, official = (tf_pretrainer(_cfg("electra", **extra), tf.distribute.get_strategy(),
                                  jit_compile=False)
                       for extra in ({}, {"objective.mask_with_replacement": "true"}))
    seed = tf.constant([3, 1])
    for trainer in (plain, official):
        trainer.model.set_weights(plain.model.get_weights())
    a, b = plain.job.objective.mask(batch, seed), official.job.objective.mask(batch, seed)
    np.testing.assert_array_equal(a["masked_weights"].numpy(), b["masked_weights"].numpy())
    w, pos = b["masked_weights"].numpy() > 0, b["masked_positions"].numpy()
    distinct = sum(len(set(p[m])) for p, m in zip(pos, w))
    assert distinct <= w.sum()
    dens = official.job.objective.denominators(batch)
    assert float(dens["mlm"]) == w.sum()
    terms, sums = official.job.objective.loss_terms(official.model, batch, tf.constant([3, 1, 0]),
                                                dens, False)
    assert set(terms) == {"generator", "discriminator"}
    # At initialisation: MLM ~ ln V per slot, the discriminator ~ ln 2 per token (over 12
    # masking seeds: 0.994-1.008 ln V and 0.943-0.954 x 50 ln 2, the fresh head's logits not
    # quite 0; a wrong normaliser is off by a factor).
    assert float(terms["generator"]) == pytest.approx(LNV, rel=0.05)
    assert float(terms["discriminator"]) == pytest.approx(0.95 * 50 * LN2, rel=0.03)
