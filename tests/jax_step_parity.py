"""The JAX side of tests/test_jax_runtime.py's step comparisons.

`python tests/jax_step_parity.py CASES.pkl OUT.pkl` (KERAS_BACKEND=jax, TensorFlow made
unimportable: the compiled step needs none). For each case: `step` cases build the case's
pre-training model with `backend_parity`'s weights, replay TensorFlow's draws and run one
compiled train step (`jax_step.StepBuilder`); `devices` cases run the same steps with the
generator's own draws on a mesh of one device and on one of every device (the test sets
`--xla_force_host_platform_device_count=2`); `program` cases lower the step for runs of
other lengths (the texts compared) and evaluate the schedule with each run's lengths.
Writes the updated variables, slots and metric sums."""

import os
import pickle
import sys

import numpy as np


def build(name, overrides):
    import backend_parity as cases
    from electra_tf.configs import load_config
    from electra_tf.model.modeling import ElectraPretrainingModel
    from electra_tf.pretraining import objectives
    objective_name, extra, phase = cases.OBJECTIVE_CASES[name]
    cfg = load_config("tiny", {**cases.SMALL, "objective.objective": objective_name, **extra,
                               **overrides})
    counts = np.arange(cases.V, dtype=np.float64) % 17
    objective = objectives.build_objective(cfg, unigram_counts=counts)
    model = ElectraPretrainingModel(cfg.model, heads=objective.heads)
    cases.set_weights(model)
    return cfg, model, objective, phase


def step_builder(cfg, model, objective, devices=None, multipliers=None):
    from electra_tf.training.jax_runtime import step as jax_step

    def loss(batch, seed, context, training, phase, step):
        objective.global_step = step
        return objective.loss(model, batch, seed, context, training, phase)

    trainable, frozen = model.trainable_variables, model.non_trainable_variables
    rule = jax_step.UpdateRule.of(cfg.optimizer, cfg.train.num_train_steps,
                                  jax_step.names_of(trainable), multipliers)
    return jax_step.StepBuilder(trainable, frozen, loss, objective.denominators, rule,
                                clip_norm=cfg.optimizer.clip_norm,
                                grad_accum_steps=cfg.train.grad_accum_steps,
                                mesh=jax_step.make_mesh(devices))


def run_steps(builder, model, batches, base_seed, phase):
    from electra_tf.training.jax_runtime import step as jax_step
    trainable = model.trainable_variables
    state = builder.place_state(jax_step.initial_state(trainable, model.non_trainable_variables,
                                                       False, base_seed))
    step = builder.compile_train(phase)
    sums = []
    for batch in batches:
        state, s = step(state, builder.place_batch(batch))
        sums.append({k: np.asarray(v) for k, v in s.items()})
    paths = [v.path for v in trainable]
    return {"params": dict(zip(paths, map(np.asarray, state["params"]))),
            "m": dict(zip(paths, map(np.asarray, state["m"]))),
            "v": dict(zip(paths, map(np.asarray, state["v"]))),
            "step": int(state["step"]), "sums": sums}


def run_case(case):
    import jax
    from electra_tf import rng
    cfg, model, objective, phase = build(case["name"], case["overrides"])
    if case["kind"] == "step":
        builder = step_builder(cfg, model, objective, multipliers=case.get("multipliers"))
        with rng.given_draws(case["draws"]):  # traced inside: the draws become constants
            return run_steps(builder, model, [case["batch"]], case["base_seed"], phase)
    if case["kind"] == "nonfinite":  # a NaN weight: the step is skipped, nothing moves
        poisoned = model.trainable_variables[0]
        value = np.array(poisoned.numpy())
        value.flat[0] = np.nan
        poisoned.assign(value)
        builder = step_builder(cfg, model, objective)
        out = run_steps(builder, model, case["batches"], case["base_seed"], phase)
        out["before"] = {v.path: np.asarray(v.numpy()) for v in model.trainable_variables}
        return out
    if case["kind"] == "program":  # runs of other lengths: one program, other lengths in
        from electra_tf.training.jax_runtime import step as jax_step
        texts, rates = [], []
        for total, warmup in case["lengths"]:
            cfg, model, objective, phase = build(case["name"], {
                "train.num_train_steps": str(total), "optimizer.warmup_steps": str(warmup)})
            builder = step_builder(cfg, model, objective)
            state = builder.place_state(jax_step.initial_state(
                model.trainable_variables, model.non_trainable_variables, False, [1, 2]))
            batch = builder.place_batch(case["batch"])
            lengths = builder.rule.lengths()
            texts.append(builder.compile_train(phase).jitted.lower(state, batch,
                                                                   lengths).as_text())
            rates.append([float(builder.rule.learning_rate(s, lengths)) for s in
                          case["at"]])
        return {"same_program": len(set(texts)) == 1, "rates": rates,
                "learning_rate": cfg.optimizer.learning_rate}
    out = {}
    for name, devices in (("one", jax.devices()[:1]), ("all", jax.devices())):
        builder = step_builder(cfg, model, objective, devices)
        out[name] = run_steps(builder, model, case["batches"], case["base_seed"], phase)
        out[name]["devices"] = len(devices)
    return out


def main(cases_path, out_path):
    for module in ("tensorflow", "tensorflow_text"):
        sys.modules[module] = None
    os.environ["KERAS_BACKEND"] = "jax"
    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    results = [run_case(case) for case in cases]
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    main(*sys.argv[1:])
