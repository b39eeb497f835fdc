import dataclasses
import json
import os

import pytest

from electra_tf.configs import (ConfigError, FinetuneConfig, ModelConfig, PretrainingConfig,
                                apply_overrides, load_config, parse_overrides, preset_names)


def test_presets_match_the_paper():
    assert set(preset_names()) >= {"tiny", "small", "small_plus", "base", "large"}
    small, base, large = load_config("small"), load_config("base"), load_config("large")
    sizes = lambda c: (c.model.num_hidden_layers, c.model.hidden_size,
                       c.model.intermediate_size, c.model.num_attention_heads,
                       c.model.embedding_size)
    assert sizes(small) == (12, 256, 1024, 4, 128)
    assert sizes(base) == (12, 768, 3072, 12, 768)
    assert sizes(large) == (24, 1024, 4096, 16, 1024)
    # Generators: 1/4, 1/3, 1/4 of the hidden size; heads max(1, hidden // 64).
    assert (small.model.generator_hidden, small.model.generator_heads) == (64, 1)
    assert (base.model.generator_hidden, base.model.generator_intermediate,
            base.model.generator_heads) == (256, 1024, 4)
    assert (large.model.generator_hidden, large.model.generator_heads) == (256, 4)
    assert load_config("small_plus").model.generator_hidden == 256
    # Official max_predictions_per_seq: 19 at 128, 79 at 512, 130 for large's 25%.
    assert small.objective.predictions_per_seq(128) == 19
    assert base.objective.predictions_per_seq(512) == 79
    assert large.objective.predictions_per_seq(512) == 130
    assert (small.optimizer.learning_rate, base.optimizer.learning_rate) == (5e-4, 2e-4)
    assert (small.train.train_batch_size, base.train.train_batch_size,
            large.train.train_batch_size) == (128, 256, 2048)
    assert small.objective.disc_weight == 50.0 and small.optimizer.epsilon == 1e-6
    assert small.optimizer.bias_correction is False and small.optimizer.weight_decay == 0.01


def test_mask_with_replacement_is_for_electra_only():
    assert load_config("tiny", {"objective.mask_with_replacement": "true"}) \
        .objective.mask_with_replacement
    for bad in ({"objective.objective": "electra_15"},
                {"objective.random_token_prob": "0.1"}):
        with pytest.raises(ConfigError, match="mask_with_replacement reproduces the official "
                           "ELECTRA masking: it needs objective=electra and "
                           "random_token_prob=0"):
            load_config("tiny", {"objective.mask_with_replacement": "true", **bad})


def test_overrides_dotted_and_bare():
    cfg = load_config("tiny", "learning_rate=2e-3,train.num_train_steps=10,"
                              "model.tie_embeddings=false,temperature=0.5")
    assert cfg.optimizer.learning_rate == 2e-3
    assert cfg.train.num_train_steps == 10
    assert cfg.model.tie_embeddings is False
    assert cfg.objective.temperature == 0.5
    assert parse_overrides(" a=1 , b.c=x ") == {"a": "1", "b.c": "x"}


@pytest.mark.parametrize("override, needle", [
    ("foo=1", "unknown config key 'foo'; valid keys: model.vocab_size"),
    ("model.foo=1", "valid keys of model: vocab_size"),
    ("nosection.x=1", "unknown config section"),
    ("hidden_size=abc", "expected a int"),
    ("tie_embeddings=maybe", "expected true or false"),
    ("max_seq_length=1024", "exceeds the model's max_position_embeddings=128"),
    ("novalue", "is not key=value"),
    ("generator_hidden_size=0.5,tie_all_weights=true", "tie_all_weights needs"),
])
def test_bad_overrides_are_one_line(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", override)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unknown_key_in_json_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": {"hidden_sise": 64}}))
    with pytest.raises(ConfigError, match="hidden_sise"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="presets: base, large, small"):
        load_config("no_such_preset")


def test_frozen():
    cfg = PretrainingConfig()
    with pytest.raises(dataclasses.FrozenInstanceError,
                       match="^cannot assign to field 'hidden_size'$"):
        cfg.model.hidden_size = 3
    with pytest.raises(dataclasses.FrozenInstanceError,
                       match="^cannot assign to field 'model'$"):
        cfg.model = None
    assert apply_overrides(cfg, {"hidden_size": 512}).model.hidden_size == 512
    assert cfg.model.hidden_size == 256


def test_config_file_on_a_remote_filesystem():
    """A --config file is read through TensorFlow's filesystem layer (gs:// works as
    ram:// does here); a missing or bad one is one line naming it."""
    import uuid

    import tensorflow as tf
    root = f"ram://configs_{uuid.uuid4().hex}"
    try:
        tf.io.gfile.makedirs(root)
        with tf.io.gfile.GFile(f"{root}/c.json", "w") as f:
            f.write(json.dumps({"model": {"hidden_size": 64, "num_attention_heads": 2},
                                "train": {"num_train_steps": 7}}))
        cfg = load_config(f"{root}/c.json", "learning_rate=3e-4")
        assert (cfg.model.hidden_size, cfg.model.num_attention_heads) == (64, 2)
        assert cfg.train.num_train_steps == 7 and cfg.optimizer.learning_rate == 3e-4
        with pytest.raises(ConfigError, match=rf"^--config {root}/nope.json: no such file$"):
            load_config(f"{root}/nope.json")
        with tf.io.gfile.GFile(f"{root}/torn.json", "w") as f:
            f.write('{"model": {"hidden_size": 6')
        with pytest.raises(ConfigError) as e:
            load_config(f"{root}/torn.json")
        assert str(e.value).startswith(f"--config {root}/torn.json: ")
        assert "\n" not in str(e.value)
    finally:
        tf.io.gfile.rmtree(root)


def test_two_stage_sets_what_it_requires(caplog):
    """--objective=two_stage alone: equal generator sizes and no sharing, each change
    logged; the tiny preset's half-size, tied generator would otherwise stop the run."""
    import logging
    with caplog.at_level(logging.INFO, logger="absl"):
        cfg = load_config("tiny", {"objective": "two_stage"})
    m = cfg.model
    assert (m.generator_hidden_size, m.generator_layers) == (1.0, 1.0)
    assert (m.tie_embeddings, m.tie_all_weights) == (False, False)
    assert (m.generator_hidden, m.generator_num_layers) == (128, 2)
    logged = [r.getMessage() for r in caplog.records if "two_stage" in r.getMessage()]
    assert logged == ["objective.objective=two_stage: setting model.generator_hidden_size=1.0 "
                      "(was 0.5)",
                      "objective.objective=two_stage: setting model.tie_embeddings=False "
                      "(was True)"]
    # other objectives keep the preset's generator
    assert load_config("tiny", {"objective": "electra"}).model.generator_hidden_size == 0.5


def test_two_stage_names_the_flag_for_a_conflicting_value():
    with pytest.raises(ConfigError, match=r"^objective.objective=two_stage needs "
                       r"model.tie_embeddings=False but it is set to True: use "
                       r"--generator_tying=none$"):
        load_config("tiny", {"objective": "two_stage", "model.tie_embeddings": "true"})
    with pytest.raises(ConfigError, match=r"needs model.generator_hidden_size=1.0 but it is "
                       r"set to 0.25: use --params_override=model.generator_hidden_size=1.0$"):
        load_config("tiny", {"objective": "two_stage", "generator_hidden_size": "0.25"})


def test_finetune_config_composes_the_pretraining_sections(tmp_path):
    """Fine-tuning's optimizer and train knobs are pre-training's, with fine-tuning's
    defaults; keys as pre-training's (dotted, or bare where unique)."""
    import types
    default = FinetuneConfig()
    assert (default.train.train_batch_size, default.train.eval_batch_size,
            default.train.max_seq_length, default.train.steps_per_loop,
            default.train.save_checkpoints_steps, default.train.seed) == (32, 32, 128, 50, 1000, 1)
    assert (default.optimizer.optimizer, default.optimizer.learning_rate,
            default.optimizer.weight_decay, default.optimizer.epsilon,
            default.optimizer.clip_norm) == ("adamw", None, 0.0, 1e-6, 1.0)
    base = ModelConfig(hidden_size=768, num_attention_heads=12)
    resolved = default.resolved(base, types.SimpleNamespace(num_train_epochs=3))
    assert (resolved.optimizer.learning_rate, resolved.layerwise_lr_decay,
            resolved.num_train_epochs) == (1e-4, 0.8, 3.0)
    cfg = load_config(None, "learning_rate=1e-4,train.steps_per_loop=20,epsilon=1e-8,"
                            "num_trials=2", FinetuneConfig)
    assert (cfg.optimizer.learning_rate, cfg.optimizer.epsilon, cfg.train.steps_per_loop,
            cfg.num_trials) == (1e-4, 1e-8, 20, 2)
    path = tmp_path / "ft.json"
    path.write_text(json.dumps({"num_train_epochs": 2, "train": {"seed": 7}}))
    cfg = load_config(str(path), "seed=8", FinetuneConfig)  # the override wins
    assert (cfg.num_train_epochs, cfg.train.seed) == (2.0, 8)
    with pytest.raises(ConfigError, match=r"^unknown config key 'adam_epsilon'; valid keys: "
                                          r"optimizer.optimizer, optimizer.learning_rate"):
        load_config(None, "adam_epsilon=1e-8", FinetuneConfig)


@pytest.mark.parametrize("override, message", [
    ("train_batch_size=0", "--train_batch_size=0 must be at least 1"),  # a flag: named so
    ("steps_per_loop=0", "train.steps_per_loop=0 must be at least 1"),  # no flag: its key
    ("layerwise_lr_decay=1.5", "--layerwise_lr_decay=1.5 must be in (0, 1]"),
    ("learning_rate=-1", "--learning_rate=-1.0 must be > 0"),
    ("num_train_epochs=0", "--num_train_epochs=0.0 must be > 0"),
    ("precision=fp8", "--precision='fp8': expected one of auto, float32, bfloat16, float16"),
    ("optimizer=sgd", "optimizer.optimizer='sgd': expected one of adamw, lamb"),
])
def test_each_knob_checks_itself_once_for_both_jobs(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, override, FinetuneConfig)
    assert str(e.value) == message
    if override.split("=")[0] in ("train_batch_size", "steps_per_loop", "learning_rate",
                                  "precision", "optimizer"):  # the same check in pre-training
        with pytest.raises(ConfigError, match=r"=-?\S+( must be|: expected one of)"):
            load_config("tiny", override)


def test_the_cli_flags_come_from_the_knobs():
    """Each job's flags are its knobs' (same names, help and enum values as before they
    were declared with the knobs); set flags win over --params_override, unset ones keep
    the config's value."""
    from absl import flags
    from electra_tf.configs import config_from_flags, define_flags
    from electra_tf.objective_specs import SPECS
    from electra_tf.training.options import RunOptions
    expected = {
        PretrainingConfig: {"num_train_steps", "train_batch_size", "max_seq_length",
                            "save_checkpoints_steps", "steps_per_loop", "grad_accum_steps",
                            "learning_rate", "precision", "seed", "on_nan", "on_bad_shard",
                            "objective", "generator", "generator_checkpoint",
                            "temperature_schedule", "gen_focal_gamma"},
        FinetuneConfig: {"learning_rate", "layerwise_lr_decay", "official_lr_bug",
                         "num_train_epochs", "train_batch_size", "eval_batch_size",
                         "max_seq_length", "warmup_proportion", "num_trials", "seed",
                         "precision", "save_checkpoints_steps", "on_nan"},
        RunOptions: {"backend", "strategy", "tpu", "tpu_zone", "gcp_project", "jit_compile",
                     "profile_steps", "peak_flops"}}
    defined = {}
    for cls, names in expected.items():
        defined[cls] = flags.FlagValues()
        define_flags(cls, defined[cls])
        assert set(defined[cls]) == names, cls
    pre, fine, run = defined[PretrainingConfig], defined[FinetuneConfig], defined[RunOptions]
    assert pre["train_batch_size"].help == "Global batch; overrides the config."
    assert fine["train_batch_size"].help == "Global batch (default 32)."
    assert pre["objective"].parser.enum_values == list(SPECS)
    assert fine["precision"].parser.enum_values == ["auto", "float32", "bfloat16", "float16"]
    assert all(f.default is None for f in list(pre._flags().values()) +
               list(fine._flags().values()))
    assert (run["strategy"].default, run["jit_compile"].default) == ("auto", None)
    flags.DEFINE_string("params_override", "", "", flag_values=fine)
    flags.DEFINE_string("finetune_config", None, "", flag_values=fine)
    fine(["prog", "--learning_rate=1e-4", "--train_batch_size=8", "--official_lr_bug",
          "--params_override=epsilon=1e-8,train_batch_size=4,steps_per_loop=5"])
    cfg = config_from_flags(fine, FinetuneConfig)
    assert (cfg.optimizer.learning_rate, cfg.train.train_batch_size, cfg.official_lr_bug,
            cfg.optimizer.epsilon, cfg.train.steps_per_loop,
            cfg.train.eval_batch_size) == (1e-4, 8, True, 1e-8, 5, 32)


def test_the_finetuning_demo_recipe_is_a_finetune_config_not_a_model_preset():
    from electra_tf.finetune.cli import DEMO_CONFIG
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), DEMO_CONFIG)
    cfg = load_config(path, None, FinetuneConfig)
    assert (cfg.num_train_epochs, cfg.train.max_seq_length, cfg.train.train_batch_size) == \
        (1.0, 64, 32)
    assert preset_names() == ["base", "large", "small", "small_plus", "tiny"]
