"""The update (`training/update.py`) through each runtime's own optimizer wrapper, against an
independent float64 NumPy reference: the TensorFlow runtime's (`tf_runtime/optimizer.py`:
slot variables, `apply_gradients` with the clip factor and the skip) in the test process,
the JAX runtime's (`jax_runtime/step.UpdateRule.apply` over arrays) in a child process with
KERAS_BACKEND=jax: `python tests/update_cases.py OUT.pkl`.

Each case: AdamW or LAMB, bias correction or not, weight decay with the exclusions, a
layer-wise multiplier, clipping, float16's loss scale (with a short growth interval so it
doubles) and a non-finite step (skipped: nothing moves, the scale halves), over a few steps
of the warm-up + decay schedule. The comparison is by relative error, element by element
(test_update.py): a second moment of 1e-7 must be right to its own digits."""

import os
import pickle
import sys

import numpy as np

NAMES = ("enc/layer_0/output/dense/kernel", "enc/layer_0/output/LayerNorm/gamma",
         "enc/layer_0/output/dense/bias")
TOTAL, WARMUP = 10, 2
GROWTH = 2  # the loss scale's growth interval in these cases (the runs': 2000)

CASES = {
    "adamw_official": dict(optimizer="adamw"),
    "adamw_bias_corrected": dict(optimizer="adamw", bias_correction=True),
    "lamb": dict(optimizer="lamb"),
    "adamw_layerwise_clipped": dict(optimizer="adamw", multipliers={NAMES[0]: 0.25},
                                    clip_norm=0.5),
    "lamb_float16_skip": dict(optimizer="lamb", float16=True, nan_at=2, clip_norm=1.0),
    "adamw_float16_no_clip": dict(optimizer="adamw", float16=True, clip_norm=0.0,
                                  nan_at=3),
}
STEPS = 5


def config(case):
    from electra_tf.configs import OptimizerConfig
    return OptimizerConfig(optimizer=case["optimizer"], learning_rate=1e-2,
                           warmup_steps=WARMUP, weight_decay=0.01,
                           bias_correction=case.get("bias_correction", False),
                           clip_norm=case.get("clip_norm", 1.0))


def inputs(case):
    """Initial parameters and each step's gradients of the loss (float32)."""
    rng = np.random.RandomState(7)
    params = [rng.randn(3, 4), 1.0 + 0.1 * rng.randn(4), 0.1 * rng.randn(4)]
    grads = [[rng.randn(3, 4) * 0.3, rng.randn(4) * 1e-3, rng.randn(4) * 2.0]
             for _ in range(STEPS)]
    if "nan_at" in case:
        grads[case["nan_at"]][1][0] = np.inf
    return ([p.astype(np.float32) for p in params],
            [[g.astype(np.float32) for g in step] for step in grads])


def reference(case):
    """The rules of update.py's docstring in float64 NumPy, written from the formulas."""
    params, grads = inputs(case)
    params = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2, eps, wd, base = 0.9, 0.999, 1e-6, 0.01, 1e-2
    lamb = case["optimizer"] == "lamb"
    corrected = lamb or case.get("bias_correction", False)
    clip = case.get("clip_norm", 1.0)
    scale, good, step = (2.0 ** 15 if case.get("float16") else 1.0), 0, 0
    trace = []
    for raw in grads:
        g = [x.astype(np.float64) for x in raw]  # the gradient of the loss ...
        # ... arrives scaled by the loss scale and is unscaled (float16)
        norm = float(np.sqrt(sum(np.sum(x * x) for x in g)))
        if not np.isfinite(norm):
            if case.get("float16"):
                scale, good = max(scale / 2.0, 1.0), 0
            trace.append((step, scale))
            continue
        factor = min(1.0, clip / norm) if clip > 0 else 1.0
        lr = base * (1.0 - min(step, TOTAL) / TOTAL) * min(1.0, step / WARMUP)
        t = step + 1
        for i, name in enumerate(NAMES):
            gi = g[i] * factor
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            mh, vh = (m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)) if corrected else (m[i], v[i])
            upd = mh / (np.sqrt(vh) + eps)
            excluded = "LayerNorm" in name or "bias" in name
            if not excluded:
                upd = upd + wd * params[i]
            trust = 1.0
            if lamb and not excluded:
                wn, un = np.linalg.norm(params[i]), np.linalg.norm(upd)
                trust = wn / un if wn > 0 and un > 0 else 1.0
            mult = case.get("multipliers", {}).get(name, 1.0)
            params[i] = params[i] - lr * mult * trust * upd
        step += 1
        if case.get("float16"):
            good += 1
            if good >= GROWTH:
                scale, good = scale * 2.0, 0
        trace.append((step, scale))
    return dict(params=params, m=m, v=v, trace=trace)


def run(case):
    """The case through the runtime Keras runs on -> the same keys as `reference`."""
    import keras
    from electra_tf.training import update
    params, grads = inputs(case)
    cfg = config(case)
    float16 = bool(case.get("float16"))
    scale = np.float32(update.initial_loss_scale(float16))
    good = np.int64(0)
    trace = []
    on_jax = keras.backend.backend() == "jax"
    if on_jax:
        import jax.numpy as jnp
        from electra_tf.training.jax_runtime.step import UpdateRule
        rule = UpdateRule.of(cfg, TOTAL, NAMES, case.get("multipliers"))
        p = [jnp.asarray(x) for x in params]
        m = [jnp.zeros_like(x) for x in p]
        v = [jnp.zeros_like(x) for x in p]
        step = 0
    else:
        import tensorflow as tf
        from electra_tf.training.tf_runtime.optimizer import make_optimizer
        optimizer = make_optimizer(cfg, TOTAL)
        variables = [tf.Variable(x, name=n) for x, n in zip(params, NAMES)]
        optimizer.build(variables)
        step_var = tf.Variable(0, dtype=tf.int64)
    for raw in grads:
        # the loss's gradients times the loss scale, as the step's tape gives them
        scaled = [keras.ops.convert_to_tensor(x * scale) for x in raw]
        g, norm, finite, factor = update.prepare(scaled, scale, cfg.clip_norm, float16)
        if on_jax:
            p, m, v = rule.apply(p, g, m, v, step, factor, finite, rule.lengths())
            step += int(finite)
        else:
            optimizer.apply_gradients(zip(g, variables), step_var,
                                      lr_multipliers=case.get("multipliers"),
                                      should_update=finite, grad_scale=factor)
            step_var.assign_add(tf.cast(finite, tf.int64))
        if float16:
            scale, good = update.update_loss_scale(scale, good, finite, GROWTH)
            scale, good = np.float32(scale), np.int64(good)
        trace.append((step if on_jax else int(step_var.numpy()), float(scale)))
    if on_jax:
        return dict(params=[np.asarray(x) for x in p], m=[np.asarray(x) for x in m],
                    v=[np.asarray(x) for x in v], trace=trace)
    slots = optimizer.slot_variables()
    return dict(params=[x.numpy() for x in variables],
                m=[slots[f"{n}/adam_m"].numpy() for n in NAMES],
                v=[slots[f"{n}/adam_v"].numpy() for n in NAMES], trace=trace)


if __name__ == "__main__":
    os.environ["KERAS_BACKEND"] = "jax"
    sys.modules["tensorflow"] = None  # the JAX runtime's update needs no TensorFlow
    with open(sys.argv[1], "wb") as f:
        pickle.dump({name: run(case) for name, case in CASES.items()}, f)
