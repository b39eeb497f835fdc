"""The cases of tests/test_backends.py and their JAX side.

`python tests/backend_parity.py CASES.pkl OUT.pkl` runs under KERAS_BACKEND=jax with
TensorFlow made unimportable: for each case it builds the same model from the case's
config with the same weights (drawn from each variable's path), replays its draws
(`rng.given_draws`) and writes the outputs, losses, metric sums and gradients (one
`jax.jit` of `jax.value_and_grad`) that the test compares with TensorFlow's."""

import os
import pickle
import sys
import zlib

import numpy as np

V = 1000
B, L = 4, 32
SMALL = {"model.vocab_size": V, "model.embedding_size": 64, "model.hidden_size": 128,
         "model.num_hidden_layers": 1, "model.num_attention_heads": 2,
         "model.intermediate_size": 256, "model.generator_hidden_size": 0.5,
         "model.max_position_embeddings": L, "train.max_seq_length": L,
         "train.train_batch_size": B, "train.num_train_steps": 10,
         "optimizer.warmup_steps": 0}
TWO_STAGE = {"model.generator_hidden_size": "1.0", "model.tie_embeddings": "false"}

# name -> (objective, overrides, phase): every objective, and the options that change the math.
OBJECTIVE_CASES = {
    "electra": ("electra", {}, 0),
    "electra_15": ("electra_15", {}, 0),
    "hp_loss_focal": ("hp_loss", {"objective.gen_focal_gamma": "piecewise"}, 0),
    "hp_dist": ("hp_dist", {}, 0),
    "adversarial": ("adversarial", {}, 0),
    "two_stage_0": ("two_stage", TWO_STAGE, 0),
    "two_stage_1": ("two_stage", TWO_STAGE, 1),
    "electric": ("electric", {}, 0),
    "mlm_bert_80_10_10": ("mlm", {"objective.mask_token_prob": 0.8,
                                  "objective.random_token_prob": 0.1}, 0),
    "replace_mlm": ("replace_mlm", {}, 0),
    "all_tokens_mlm": ("all_tokens_mlm", {}, 0),
    "electra_gdes": ("electra", {"model.disentangled_embeddings": "true"}, 0),
    "electra_untied_official_masking": ("electra", {"model.tie_embeddings": "false",
                                                    "objective.mask_with_replacement": "true"},
                                        0),
    "electra_uniform_generator": ("electra", {"objective.generator": "uniform"}, 0),
    "electra_unigram_generator": ("electra", {"objective.generator": "unigram"}, 0),
    "electra_temperature_schedule": ("electra", {"objective.temperature_schedule":
                                                 "linear:2.0:0.5",
                                                 "objective.disallow_correct": "true"}, 0),
}
# name -> (head kind, outputs, answerable)
HEAD_CASES = {
    "classification": ("classification", 3, False),
    "regression": ("regression", 1, False),
    "tagging": ("tagging", 5, False),
    "qa": ("qa", 1, True),
}
STEP = 3  # the global step a temperature schedule reads


def objective_config(name):
    from electra_tf.configs import load_config
    objective, extra, _ = OBJECTIVE_CASES[name]
    return load_config("tiny", {**SMALL, "objective.objective": objective, **extra})


def batch_arrays(seed=0, qa=False):
    ids = np.random.default_rng(seed).integers(200, V, (B, L)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones((B, L), np.int32)
    mask[1, 20:] = 0  # a padded row
    ids[1, 20:] = 0
    ids[1, 19] = 102
    segments = np.zeros((B, L), np.int32)
    batch = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
    if qa:
        segments[:, 10:] = 1
        segments[1, 20:] = 0
        batch["start_positions"] = np.array([12, 0, 15, 30], np.int32)
    return batch


def set_weights(model):
    """Every weight drawn from its path (the same on both sides: nothing to carry): normal
    with stddev 0.05, LayerNorm scales around 1. Zero-initialised GDES deltas and biases get
    values too, so every term's gradient reaches them."""
    for v in model.weights:
        draw = np.random.default_rng(zlib.crc32(v.path.encode())).normal(0.0, 0.05, v.shape)
        v.assign((draw + (1.0 if v.path.endswith("gamma") else 0.0)).astype(np.float32))


def build_pretraining(name):
    """(config, model, objective) of an objective case."""
    from electra_tf.model.modeling import ElectraPretrainingModel
    from electra_tf.pretraining import objectives
    cfg = objective_config(name)
    counts = np.arange(V, dtype=np.float64) % 17  # some ids never seen: -1e9 logits
    objective = objectives.build_objective(cfg, unigram_counts=counts)
    objective.global_step = STEP
    model = ElectraPretrainingModel(cfg.model, heads=objective.heads)
    set_weights(model)
    return cfg, model, objective


def build_finetuning(name):
    from electra_tf.finetune.model import FinetuningModel, make_head
    config = objective_config("electra").model
    kind, outputs, answerable = HEAD_CASES[name]
    model = FinetuningModel(config, make_head(kind, config, outputs, answerable=answerable))
    set_weights(model)
    return model


def _jax_case(case):
    import jax
    import keras
    from keras import ops

    from electra_tf import rng
    name = case["name"]
    if name in OBJECTIVE_CASES:
        _, model, objective = build_pretraining(name)
        phase = OBJECTIVE_CASES[name][2]
    else:
        model, objective, phase = build_finetuning(name), None, 0
    paths = sorted(v.path for v in model.weights)
    batch = {k: ops.convert_to_tensor(a) for k, a in case["batch"].items()}
    seed = np.array(case["seed"], np.int32)
    trainable = model.trainable_variables

    def run(values, training):
        with keras.StatelessScope(state_mapping=list(zip(trainable, values))):
            if objective is None:
                out = model(batch, training=training, seed=seed if training else None)
                floats = {k: v for k, v in out.items() if "index" not in k}
                loss = sum(ops.mean(ops.square(v)) for v in floats.values())
                return loss, out
            den = objective.denominators(batch)
            loss, sums = objective.loss(model, batch, seed, den, training, phase)
            outputs = dict(sums)
            if training:
                return loss, outputs
            outputs["disc_logits"] = model.discriminator(
                batch["input_ids"], batch["input_mask"], batch["segment_ids"])
            outputs["generator_hidden"] = model.generator_hidden(
                batch["input_ids"], batch["input_mask"], batch["segment_ids"])
            return loss, outputs

    values = [v.value for v in trainable]
    result = {"name": name, "paths": paths}
    with rng.given_draws(case["eval_draws"]):
        loss, outputs = run(values, False)
    result["eval_loss"] = float(loss)
    result["eval"] = {k: np.asarray(v) for k, v in outputs.items()}
    step = jax.jit(jax.value_and_grad(lambda vals: run(vals, True), has_aux=True))
    with rng.given_draws(case["train_draws"]):
        (loss, outputs), grads = step(values)
    result["train_loss"] = float(loss)
    result["train"] = {k: np.asarray(v) for k, v in outputs.items()}
    result["grads"] = {v.path: np.asarray(g) for v, g in zip(trainable, grads)}
    return result


def main(cases_path, out_path):
    for module in ("tensorflow", "tensorflow_text"):
        sys.modules[module] = None  # the JAX side needs no TensorFlow
    os.environ["KERAS_BACKEND"] = "jax"
    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    results = [_jax_case(case) for case in cases]
    assert "tensorflow" not in sys.modules or sys.modules["tensorflow"] is None
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(*sys.argv[1:])
