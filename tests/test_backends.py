"""One model for every backend: the networks, heads and objectives written once in `keras.ops`
give the same numbers on TensorFlow and on JAX.

For every objective variant (tests/backend_parity.py's cases) and every fine-tuning head,
this process (TensorFlow) builds the model, records its outputs, loss, metric sums and
gradients and every random draw (`rng.recorded_draws`); a JAX process with TensorFlow made
unimportable builds the same model with the same weights (`backend_parity.set_weights`: drawn
from each variable's path), replays the draws and computes the same: outputs within 1e-5 (fp32), losses and gradients within 1e-4."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import compat, kernels, rng
import backend_parity as cases

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
jax_installed = pytest.mark.skipif(not compat.module_exists("jax"),
                                   reason="the jax extra is not installed")
OUTPUT_TOL = 1e-5   # the same weights: the same outputs (float32)
GRAD_TOL = 1e-4     # the same batch and draws: the same loss and gradients
SEED = [11, 12, 0]


def _tf_case(name):
    if name in cases.OBJECTIVE_CASES:
        _, model, objective = cases.build_pretraining(name)
        phase = cases.OBJECTIVE_CASES[name][2]
    else:
        model, objective, phase = cases.build_finetuning(name), None, 0
    arrays = cases.batch_arrays(qa=name == "qa")
    batch = {k: tf.constant(a) for k, a in arrays.items()}
    seed = tf.constant(SEED, tf.int32)

    def run(training):
        if objective is None:
            out = model(batch, training=training, seed=seed if training else None)
            floats = [v for k, v in out.items() if "index" not in k]
            return tf.add_n([tf.reduce_mean(tf.square(v)) for v in floats]), out
        den = objective.denominators(batch)
        loss, sums = objective.loss(model, batch, seed, den, training, phase)
        outputs = dict(sums)
        if not training:
            outputs["disc_logits"] = model.discriminator(
                batch["input_ids"], batch["input_mask"], batch["segment_ids"])
            outputs["generator_hidden"] = model.generator_hidden(
                batch["input_ids"], batch["input_mask"], batch["segment_ids"])
        return loss, outputs

    case = {"name": name, "batch": arrays, "seed": SEED}
    with rng.recorded_draws() as draws:
        loss, outputs = run(False)
    case["eval_draws"] = draws
    expected = {"eval_loss": float(loss), "eval": {k: v.numpy() for k, v in outputs.items()},
                "paths": sorted(v.path for v in model.weights)}
    with rng.recorded_draws() as draws, tf.GradientTape() as tape:
        loss, outputs = run(True)
    grads = tape.gradient(loss, model.trainable_variables)
    case["train_draws"] = draws
    expected.update(train_loss=float(loss), train={k: v.numpy() for k, v in outputs.items()},
                    grads={v.path: np.zeros(v.shape, np.float32) if g is None else
                           tf.convert_to_tensor(g).numpy()
                           for v, g in zip(model.trainable_variables, grads)})
    return case, expected


def _max_error(ours, theirs):
    """max |a - b| / max(1, max |a|): absolute for small values, relative for large."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape
    if ours.size == 0:
        return 0.0
    return float(np.max(np.abs(ours - theirs)) / max(1.0, float(np.max(np.abs(ours)))))


def _compare(expected, got, name):
    """-> the largest output and gradient errors; asserts them against the tolerances."""
    assert got["paths"] == expected["paths"], name  # the TF1 names on both backends
    worst = {"output": 0.0, "grad": 0.0}
    for mode, tol in (("eval", OUTPUT_TOL), ("train", GRAD_TOL)):
        assert abs(got[f"{mode}_loss"] - expected[f"{mode}_loss"]) <= tol * max(
            1.0, abs(expected[f"{mode}_loss"])), (name, mode)
        assert set(got[mode]) == set(expected[mode]), name
        for key, value in expected[mode].items():
            if "hist" in key:  # bucket counts: a probability on a bucket edge may move one
                assert np.sum(got[mode][key]) == np.sum(value), (name, key)
                assert np.abs(np.cumsum(got[mode][key]) - np.cumsum(value)).max() <= 1
                continue
            if np.asarray(value).dtype.kind in "iub":
                np.testing.assert_array_equal(got[mode][key], value, err_msg=f"{name} {key}")
                continue
            error = _max_error(value, got[mode][key])
            assert error <= tol, (name, mode, key, error)
            worst["output"] = max(worst["output"], error)
    assert set(got["grads"]) == set(expected["grads"]), name
    for path, grad in expected["grads"].items():
        error = _max_error(grad, got["grads"][path])
        assert error <= GRAD_TOL, (name, path, error)
        worst["grad"] = max(worst["grad"], error)
    return worst


@jax_installed
@pytest.mark.subprocess
@pytest.mark.jax
def test_every_objective_and_head_equal_on_tensorflow_and_jax(tmp_path):
    names = list(cases.OBJECTIVE_CASES) + list(cases.HEAD_CASES)
    built = [_tf_case(name) for name in names]
    for case, expected in built:  # the draws were made and recorded
        assert case["train_draws"], case["name"]
    cases_path, out_path = tmp_path / "cases.pkl", tmp_path / "jax.pkl"
    with open(cases_path, "wb") as f:
        pickle.dump([case for case, _ in built], f)
    # XLA:CPU's cheaper compile: a third less time for 20 programs, the same differences.
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_backend_optimization_level=0 "
                        "--xla_llvm_disable_expensive_passes=true"}
    subprocess.run([sys.executable, os.path.join(HERE, "backend_parity.py"), str(cases_path),
                    str(out_path)], check=True, timeout=900, env=env, cwd=ROOT)
    with open(out_path, "rb") as f:
        results = pickle.load(f)
    worst = {}
    for (case, expected), got in zip(built, results):
        assert got["name"] == case["name"]
        worst[case["name"]] = _compare(expected, got, case["name"])
    print("largest differences, TensorFlow vs JAX:", worst)


def test_draws_recorded_and_given_back():
    with rng.recorded_draws() as draws:
        a = rng.uniform([2, 3], [1, 2])
        b = rng.dropout_uniform(tf.constant([2, 5]), [3, 4])
    assert [d.shape for d in draws] == [(2, 3), (2, 5)]
    np.testing.assert_array_equal(draws[0], a.numpy())
    np.testing.assert_array_equal(draws[1], b.numpy())
    given = [np.full((2, 3), 0.25, np.float32), np.zeros((2, 5), np.float32)]
    with rng.given_draws(given):
        assert rng.uniform([2, 3], [9, 9]).numpy().tolist() == [[0.25] * 3] * 2
        assert rng.uniform_int([2, 5], [9, 9], 10).numpy().max() == 0
    with pytest.raises(ValueError, match="given draw 0 has shape \\(2, 3\\), the code asks "
                                         "\\(3, 3\\)"):
        with rng.given_draws(given):
            rng.uniform([3, 3], [1, 2])
    with pytest.raises(ValueError, match="1 given draws were not used"):
        with rng.given_draws(given):
            rng.uniform([2, 3], [1, 2])


def test_kernels_are_the_tensorflow_ones_here():
    assert kernels.BACKEND == "tensorflow"
    from electra_tf.kernels import tensorflow as tf_kernels
    assert kernels.gelu is tf_kernels.gelu and kernels.bits is tf_kernels.bits


# The model with TensorFlow unimportable: tests/test_jax_only.py.
