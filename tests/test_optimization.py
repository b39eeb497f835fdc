"""The TensorFlow runtime's optimizer (electra_tf.training.tf_runtime.optimizer, over
`training/update.py`): schedule, AdamW/LAMB against numpy, clipping, the mean of
accumulated micro-batch gradients, XLA and MirroredStrategy (the latter in a subprocess
with 2 logical CPU devices)."""

import json
import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.training import update
from electra_tf.training.tf_runtime import optimizer as opt_lib
from electra_tf.compat import xla_cpu_available
from electra_tf.configs import OptimizerConfig
from gradient_accumulator import GradientAccumulator
import forked_cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NAMES = ("enc/layer_0/output/dense/kernel", "enc/layer_0/output/LayerNorm/gamma",
         "enc/layer_0/output/dense/bias")


def make_variables(seed=0):
    rng = np.random.RandomState(seed)
    values = [rng.randn(3, 4), 1.0 + 0.1 * rng.randn(4), 0.1 * rng.randn(4)]
    return [tf.Variable(v.astype(np.float32), name=n) for v, n in zip(values, NAMES)]


def make_grads(n_steps, seed=1):
    rng = np.random.RandomState(seed)
    return [[rng.randn(3, 4).astype(np.float32), rng.randn(4).astype(np.float32),
             rng.randn(4).astype(np.float32)] for _ in range(n_steps)]


def closed_form_lr(step, base, total, warmup, end=0.0, power=1.0):
    decayed = (base - end) * (1.0 - min(step, total) / total) ** power + end
    return decayed * (min(1.0, step / warmup) if warmup else 1.0)


def numpy_adam_family(params, grads_per_step, lr_fn, decay_flags, *, weight_decay=0.01,
                      b1=0.9, b2=0.999, eps=1e-6, bias_correction=False, lamb=False,
                      multipliers=None):
    """The formulas of the brief, in float64 numpy; step s uses lr_fn(s), t = s + 1."""
    params = [p.astype(np.float64).copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for s, grads in enumerate(grads_per_step):
        lr = lr_fn(s)
        t = s + 1
        for i, g in enumerate(grads):
            g = g.astype(np.float64)
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat, v_hat = ((m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)) if bias_correction
                            else (m[i], v[i]))
            update = m_hat / (np.sqrt(v_hat) + eps)
            if decay_flags[i]:
                update = update + weight_decay * params[i]
            ratio = 1.0
            if lamb and decay_flags[i]:  # excluded variables: no trust ratio
                w_norm, r_norm = np.linalg.norm(params[i]), np.linalg.norm(update)
                ratio = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            mult = 1.0 if multipliers is None else multipliers[i]
            params[i] = params[i] - lr * mult * ratio * update
    return params, m, v


def slot(optimizer, variable, kind):
    """The optimizer's `m` or `v` of `variable`."""
    return optimizer.slot_variables()[f"{opt_lib.variable_name(variable)}/adam_{kind}"]


def run_tf(optimizer, variables, grads_per_step, **apply_kwargs):
    optimizer.build(variables)
    for s, grads in enumerate(grads_per_step):
        optimizer.apply_gradients(zip([tf.constant(g) for g in grads], variables),
                                  tf.constant(s, tf.int64), **apply_kwargs)
    return [v.numpy() for v in variables]


# --------------------------------------------------------------------------- schedule

@pytest.mark.parametrize("end,power", [(0.0, 1.0), (1e-5, 2.0), (0.0, 0.5)])
def test_schedule_matches_closed_form(end, power):
    base, total, warmup = 5e-4, 1000, 100
    schedule = opt_lib.WarmupPolynomialDecay(base, total, warmup, end, power)
    for step in (0, warmup // 2, warmup, 500, total, total + 50):
        got = float(schedule(tf.constant(step, tf.int64)))
        want = closed_form_lr(step, base, total, warmup, end, power)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-12), step
    assert float(schedule(0)) == 0.0  # warmup multiplies: step 0 has lr 0, as officially
    assert float(schedule(warmup // 2)) == pytest.approx(
        (base - end) * (1 - 0.05) ** power * 0.5 + end * 0.5, rel=1e-5)


def test_schedule_without_warmup_and_in_xla():
    schedule = opt_lib.WarmupPolynomialDecay(1e-3, 200, warmup_steps=0)
    assert float(schedule(0)) == pytest.approx(1e-3)
    assert float(schedule(100)) == pytest.approx(5e-4)
    assert float(schedule(200)) == 0.0
    # autograph off, as the runtime traces (a graph under the TPU build)
    fn = tf.function(schedule, jit_compile=xla_cpu_available(), autograph=False)
    assert float(fn(tf.constant(50, tf.int64))) == pytest.approx(7.5e-4)


# --------------------------------------------------------------------------- AdamW / LAMB

@pytest.mark.parametrize("bias_correction", [False, True])
def test_adamw_matches_numpy(bias_correction):
    schedule = opt_lib.WarmupPolynomialDecay(1e-2, 10, warmup_steps=2)
    variables = make_variables()
    init = [v.numpy() for v in variables]
    grads = make_grads(4)
    optimizer = opt_lib.AdamW(schedule, weight_decay=0.01, bias_correction=bias_correction)
    got = run_tf(optimizer, variables, grads[:1])
    flags = [True, False, False]
    want, _, _ = numpy_adam_family(init, grads[:1], lambda s: closed_form_lr(s, 1e-2, 10, 2),
                                   flags, bias_correction=bias_correction)
    # step 0 has lr 0: params unchanged, but m and v moved
    for g, w, i in zip(got, want, init):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(g, i)
    np.testing.assert_allclose(slot(optimizer, variables[0], "m").numpy(), 0.1 * grads[0][0],
                               rtol=1e-6)
    for s, step_grads in enumerate(grads[1:], start=1):
        optimizer.apply_gradients(zip([tf.constant(g) for g in step_grads], variables), s)
    want, m, v = numpy_adam_family(init, grads, lambda s: closed_form_lr(s, 1e-2, 10, 2), flags,
                                   bias_correction=bias_correction)
    for var, w in zip(variables, want):
        np.testing.assert_allclose(var.numpy(), w, rtol=1e-5, atol=1e-6)
    for var, mm, vv in zip(variables, m, v):
        np.testing.assert_allclose(slot(optimizer, var, "m").numpy(), mm, rtol=1e-5)
        np.testing.assert_allclose(slot(optimizer, var, "v").numpy(), vv, rtol=1e-5)


def zero_gradient_step(optimizer, variables):
    """One first update (m = v = 0) with zero gradients, where the only movement is
    decoupled weight decay: each variable after / before."""
    optimizer.build(variables)
    before = [v.numpy() for v in variables]
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables], 3)
    return [v.numpy() / b for v, b in zip(variables, before)]


def test_weight_decay_is_decoupled_and_skips_layer_norm_and_bias():
    kernel, layer_norm, bias = zero_gradient_step(opt_lib.AdamW(0.1, weight_decay=0.5),
                                                  make_variables())
    np.testing.assert_allclose(kernel, 1 - 0.1 * 0.5, rtol=1e-6)
    np.testing.assert_array_equal(layer_norm, 1.0)
    np.testing.assert_array_equal(bias, 1.0)
    for ratio in zero_gradient_step(opt_lib.AdamW(0.1, weight_decay=0.0), make_variables()):
        np.testing.assert_array_equal(ratio, 1.0)


def test_keras_variables_use_their_path():
    import keras
    layer = keras.layers.Dense(4, name="dense")
    layer.build((None, 3))
    optimizer = opt_lib.AdamW(0.1).build(layer.trainable_variables)
    assert [opt_lib.variable_name(v) for v in layer.trainable_variables] == [
        "dense/kernel", "dense/bias"]
    assert set(optimizer.slot_variables()) == {"dense/kernel/adam_m", "dense/kernel/adam_v",
                                               "dense/bias/adam_m", "dense/bias/adam_v"}
    before = layer.kernel.numpy()
    optimizer.apply_gradients([(tf.ones([3, 4]), layer.kernel), (tf.ones([4]), layer.bias)], 0)
    assert not np.allclose(layer.kernel.numpy(), before)


def test_lamb_matches_numpy():
    variables = make_variables(seed=3)
    init = [v.numpy() for v in variables]
    grads = make_grads(3, seed=4)
    got = run_tf(opt_lib.LAMB(2e-2, weight_decay=0.01), variables, grads)
    want, _, _ = numpy_adam_family(init, grads, lambda s: 2e-2, [True, False, False],
                                   bias_correction=True, lamb=True)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_lamb_trust_ratio_edge_cases():
    kernel = tf.Variable(tf.zeros([3, 4]), name="zero/kernel")
    optimizer = opt_lib.LAMB(0.1, weight_decay=0.01).build([kernel])
    g = np.random.RandomState(5).randn(3, 4).astype(np.float32)
    optimizer.apply_gradients([(tf.constant(g), kernel)], 0)
    # ||param|| = 0 -> trust ratio 1: the plain Adam step (first step: m_hat/sqrt(v_hat) = sign)
    np.testing.assert_allclose(kernel.numpy(), -0.1 * g / (np.abs(g) + 1e-6), rtol=1e-5)
    # zero update (zero gradient, no decay) -> ||r|| = 0 -> ratio 1, no NaN
    bias = tf.Variable(tf.zeros([4]), name="zero/kernel2")
    opt2 = opt_lib.LAMB(0.1, weight_decay=0.0).build([bias])
    opt2.apply_gradients([(tf.zeros([4]), bias)], 0)
    assert np.all(np.isfinite(bias.numpy())) and np.all(bias.numpy() == 0)
    assert float(update.trust_ratio(tf.ones([4]), tf.zeros([4]))) == 1.0
    assert float(update.trust_ratio(tf.ones([4]), 2 * tf.ones([4]))) == pytest.approx(0.5)


def test_lr_multipliers():
    variables = make_variables()
    init = [v.numpy() for v in variables]
    grads = make_grads(2)
    mults = {NAMES[0]: 0.5, variables[1].ref(): 0.25}  # by name and by reference
    got = run_tf(opt_lib.AdamW(1e-2), variables, grads, lr_multipliers=mults)
    want, _, _ = numpy_adam_family(init, grads, lambda s: 1e-2, [True, False, False],
                                   multipliers=[0.5, 0.25, 1.0])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="unknown variable name"):
        opt_lib.AdamW(1e-2).build(variables).apply_gradients(
            [(tf.constant(grads[0][0]), variables[0])], 0, lr_multipliers={"nope": 1.0})


def test_should_update_false_changes_nothing():
    variables = make_variables()
    optimizer = opt_lib.AdamW(0.1).build(variables)
    before = [v.numpy() for v in variables]
    optimizer.apply_gradients(zip([tf.constant(g) for g in make_grads(1)[0]], variables), 5,
                              should_update=tf.constant(False))
    for v, b in zip(variables, before):
        np.testing.assert_array_equal(v.numpy(), b)
    assert not np.any(slot(optimizer, variables[0], "m").numpy())


def test_slot_names_and_checkpoint(tmp_path):
    variables = make_variables()
    optimizer = opt_lib.AdamW(0.1).build(variables)
    slots = optimizer.slot_variables()
    assert list(slots) == [f"{n}/{s}" for n in NAMES for s in ("adam_m", "adam_v")]
    for key, var in slots.items():
        assert var.name.startswith(key)  # e.g. 'enc/.../kernel/adam_m:0'
        assert not var.trainable
    optimizer.apply_gradients(zip([tf.constant(g) for g in make_grads(1)[0]], variables), 1)
    saved = {k: v.numpy() for k, v in slots.items()}
    path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / "ckpt"))
    fresh = opt_lib.AdamW(0.1).build(make_variables())
    tf.train.Checkpoint(optimizer=fresh).restore(path).assert_existing_objects_matched()
    for k, v in fresh.slot_variables().items():
        np.testing.assert_array_equal(v.numpy(), saved[k])


def test_build_required_in_tf_function():
    variables = make_variables()
    optimizer = opt_lib.AdamW(0.1)

    @tf.function
    def step():
        optimizer.apply_gradients([(tf.ones([3, 4]), variables[0])], 0)

    with pytest.raises(ValueError, match="build"):
        step()


# --------------------------------------------------------------------------- clipping

def clipped(grads, clip_norm=1.0):
    """The gradients times `update.clip_scale` of their global norm (finite norms), and the
    norm: clipping as a pass of its own, which the step folds into the update."""
    norm = update.global_norm(grads)
    scale = update.clip_scale(norm, clip_norm)
    return [None if g is None else g * scale for g in grads], norm


def test_global_norm_and_clip_scale():
    grads = [tf.constant([3.0, 0.0]), None, tf.constant([[4.0]])]
    out, norm = clipped(grads, 1.0)
    assert float(norm) == pytest.approx(5.0)
    assert out[1] is None
    np.testing.assert_allclose(out[0].numpy(), [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out[2].numpy(), [[0.8]], rtol=1e-6)
    assert float(update.global_norm(out)) == pytest.approx(1.0)
    same, norm = clipped([tf.constant([0.3, 0.4])], 1.0)  # below: unchanged
    assert float(norm) == pytest.approx(0.5)
    np.testing.assert_allclose(same[0].numpy(), [0.3, 0.4])
    assert float(update.clip_scale(norm, 0.0)) == 1.0  # clip_norm <= 0: no clipping
    # a sparse gradient is densified by the all-reduce before its norm is taken
    sparse = tf.IndexedSlices(tf.constant([[3.0, 4.0], [0.0, 1.0]]), tf.constant([1, 1]),
                              tf.constant([3, 2]))
    dense = opt_lib.all_reduce_gradients([sparse])[0]
    np.testing.assert_array_equal(dense.numpy(), [[0, 0], [3, 5], [0, 0]])
    assert float(update.global_norm([dense])) == pytest.approx(np.sqrt(34.0))
    # matches tf.clip_by_global_norm on finite input
    rng = np.random.RandomState(0)
    dense = [tf.constant(rng.randn(5, 3).astype(np.float32)),
             tf.constant(rng.randn(7).astype(np.float32))]
    ours, n1 = clipped(dense, 1.0)
    theirs, n2 = tf.clip_by_global_norm(dense, 1.0)
    assert float(n1) == pytest.approx(float(n2), rel=1e-6)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


def test_a_non_finite_norm_gives_a_zero_clip_factor():
    norm = update.global_norm([tf.constant([np.inf, 1.0]), tf.constant([2.0])])
    assert not np.isfinite(float(norm))
    assert float(update.clip_scale(norm, 1.0)) == 0.0
    assert float(update.clip_scale(norm, 0.0)) == 0.0  # not finite: 0 even without clipping
    assert np.isnan(float(update.global_norm([tf.constant([np.nan])])))


@pytest.mark.parametrize("family", [opt_lib.AdamW, opt_lib.LAMB])
def test_grad_scale_is_clipping_first(family):
    """apply_gradients(grad_scale=clip_scale's) gives clip-then-update's numbers exactly; a
    non-finite norm with should_update=False changes nothing."""
    grads = [[g * 3.0 for g in step] for step in make_grads(3, seed=5)]  # norms above 1
    steps = []
    for step in grads:
        out, _ = clipped([tf.constant(g) for g in step], 1.0)
        steps.append([g.numpy() for g in out])
    want = run_tf(family(1e-2, weight_decay=0.01), make_variables(), steps)
    variables = make_variables()
    optimizer = family(1e-2, weight_decay=0.01).build(variables)
    for s, step in enumerate(grads):
        norm = update.global_norm([tf.constant(g) for g in step])
        scale = update.clip_scale(norm, 1.0)
        assert 0.0 < float(scale) < 1.0
        optimizer.apply_gradients(zip([tf.constant(g) for g in step], variables),
                                  tf.constant(s, tf.int64), grad_scale=scale,
                                  should_update=tf.math.is_finite(norm))
    for got, w in zip(variables, want):
        np.testing.assert_array_equal(got.numpy(), w)
    bad = [np.full_like(g, np.inf) for g in grads[0]]
    norm = update.global_norm([tf.constant(g) for g in bad])
    scale = update.clip_scale(norm, 1.0)
    assert float(scale) == 0.0 and not np.isfinite(float(norm))
    optimizer.apply_gradients(zip([tf.constant(g) for g in bad], variables),
                              tf.constant(3, tf.int64), grad_scale=scale,
                              should_update=tf.math.is_finite(norm))
    for got, w in zip(variables, want):
        np.testing.assert_array_equal(got.numpy(), w)
    for slot in optimizer.slot_variables().values():
        assert np.all(np.isfinite(slot.numpy()))


# --------------------------------------------------------------------------- accumulation

def _linear_problem(seed=7, batch=8):
    rng = np.random.RandomState(seed)
    x = rng.randn(batch, 3).astype(np.float32)
    y = rng.randn(batch, 4).astype(np.float32)
    return x, y


def _loss(variables, x, y):
    return tf.reduce_mean(tf.square(tf.matmul(x, variables[0]) + variables[2] - y))


def test_gradient_accumulation_equals_mean_gradient():
    x, y = _linear_problem()
    variables = make_variables()
    trained = [variables[0], variables[2]]
    accumulator = GradientAccumulator(4).build(trained)

    def grad_fn(micro):
        with tf.GradientTape() as tape:
            loss = _loss(variables, micro["x"], micro["y"])
        return tape.gradient(loss, trained), loss

    mean_grads, mean_loss = tf.function(accumulator.accumulate_microbatches,
                                        jit_compile=xla_cpu_available())(
        grad_fn, {"x": tf.constant(x), "y": tf.constant(y)})
    with tf.GradientTape() as tape:
        full_loss = _loss(variables, x, y)
    full_grads = tape.gradient(full_loss, trained)
    assert float(mean_loss) == pytest.approx(float(full_loss), rel=1e-6)
    for a, b in zip(mean_grads, full_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)

    # one optimizer step on the accumulated mean == one step on the full-batch gradient
    twins = make_variables()
    twin_trained = [twins[0], twins[2]]
    opt_a = opt_lib.AdamW(1e-2, bias_correction=True).build(trained)
    opt_b = opt_lib.AdamW(1e-2, bias_correction=True).build(twin_trained)
    opt_a.apply_gradients(zip(mean_grads, trained), 0)
    opt_b.apply_gradients(zip(full_grads, twin_trained), 0)
    for a, b in zip(trained, twin_trained):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)

    # across calls: accumulate micro-step by micro-step, apply every 4 (weights moved above)
    with tf.GradientTape() as tape:
        full_loss = _loss(variables, x, y)
    full_grads = tape.gradient(full_loss, trained)
    accumulator.reset()
    for i in range(4):
        assert not bool(accumulator.ready())
        _grads, _ = grad_fn({"x": x[2 * i:2 * i + 2], "y": y[2 * i:2 * i + 2]})
        accumulator.accumulate(_grads)
    assert bool(accumulator.ready())
    for a, b in zip(accumulator.gradients(), full_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)
    accumulator.reset()
    assert not np.any(accumulator.accumulators[0].numpy())


# --------------------------------------------------------------------------- XLA, factory

@pytest.mark.xla_cpu
@pytest.mark.parametrize("family", [opt_lib.AdamW, opt_lib.LAMB])
def test_graph_updates_are_one_xla_kernel_with_the_eager_numbers(family):
    """In a graph outside XLA each variable's update is one jit-compiled kernel (the graph
    holds no Sqrt of its own): the eager ops' numbers to an FMA's rounding, should_update
    False still changes nothing."""
    grads = make_grads(3, seed=7)
    mults = {NAMES[0]: 0.5}
    eager = run_tf(family(1e-2, weight_decay=0.01), make_variables(), grads,
                   lr_multipliers=mults, grad_scale=tf.constant(0.75))
    variables = make_variables()
    optimizer = family(1e-2, weight_decay=0.01).build(variables)

    @tf.function(autograph=False)
    def apply(step_grads, step, ok):
        optimizer.apply_gradients(zip(step_grads, variables), step, lr_multipliers=mults,
                                  should_update=ok, grad_scale=tf.constant(0.75))
    yes, no = tf.constant(True), tf.constant(False)
    graph = apply.get_concrete_function([tf.constant(g) for g in grads[0]],
                                        tf.constant(0, tf.int64), yes).graph
    assert optimizer._state.kernel is not None
    # The multiplier, the gradient scale and the update all run in the kernels.
    assert not [op for op in graph.get_operations() if op.type in ("Sqrt", "Mul")]
    for s, step_grads in enumerate(grads):
        apply([tf.constant(g) for g in step_grads], tf.constant(s, tf.int64), yes)
    for got, want in zip(variables, eager):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
    before = [v.numpy() for v in variables]
    apply([tf.constant(g) for g in grads[0]], tf.constant(3, tf.int64), no)
    for v, b in zip(variables, before):
        np.testing.assert_array_equal(v.numpy(), b)



@pytest.mark.xla_cpu
def test_train_step_under_jit_compile():
    x, y = _linear_problem()
    results = []
    for jit in (True, False):
        variables = make_variables()
        optimizer = opt_lib.make_optimizer(
            OptimizerConfig(learning_rate=1e-2, warmup_steps=2, bias_correction=True), 10)
        optimizer.build(variables)

        def step(s):
            with tf.GradientTape() as tape:
                loss = _loss(variables, x, y) + 0.1 * tf.reduce_sum(variables[1])
            grads, norm = clipped(tape.gradient(loss, variables), 1.0)
            optimizer.apply_gradients(zip(grads, variables), s,
                                      should_update=tf.math.is_finite(norm))
            return norm

        fn = tf.function(step, jit_compile=True, autograph=False) if jit else step
        for s in range(3):
            fn(tf.constant(s, tf.int64))
        results.append([v.numpy() for v in variables])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert np.abs(results[0][0] - make_variables()[0].numpy()).max() > 1e-3


def test_make_optimizer():
    adamw = opt_lib.make_optimizer(OptimizerConfig(), 1000)
    assert isinstance(adamw, opt_lib.AdamW) and not adamw.hyper.bias_correction
    h = adamw.hyper
    assert (h.weight_decay, h.epsilon, h.beta_1, h.beta_2) == (0.01, 1e-6, 0.9, 0.999)
    assert float(adamw.learning_rate(5000)) == pytest.approx(closed_form_lr(
        5000, 5e-4, 1000, 10000))
    lamb = opt_lib.make_optimizer(OptimizerConfig(optimizer="lamb", learning_rate=1e-3,
                                                  warmup_steps=0), 100)
    assert isinstance(lamb, opt_lib.LAMB) and lamb.hyper.bias_correction
    assert float(lamb.learning_rate(50)) == pytest.approx(5e-4)


def test_the_runs_length_is_an_input_of_the_compiled_step_not_a_constant():
    """The schedule reads its total and warmup steps from a variable: a compiled function
    traced for one run length gives another's rates when the variable holds the other
    length (so runs differing only in --num_train_steps share one XLA program and the
    persistent compilation cache), and the variable is in no checkpoint."""
    optimizer = opt_lib.make_optimizer(OptimizerConfig(warmup_steps=3), 12)
    schedule = optimizer.learning_rate_fn
    np.testing.assert_array_equal(schedule.lengths(), np.array([12, 3], np.float32))
    rate = tf.function(optimizer.learning_rate, jit_compile=xla_cpu_available(),
                       autograph=False)
    steps = [0, 1, 2, 5, 11, 12]
    got = [float(rate(tf.constant(s, tf.int64))) for s in steps]
    assert got == pytest.approx([closed_form_lr(s, 5e-4, 12, 3) for s in steps], rel=1e-6,
                                abs=1e-12)
    schedule.tf_lengths.assign([600.0, 20.0])
    got = [float(rate(tf.constant(s, tf.int64))) for s in steps]
    assert got == pytest.approx([closed_form_lr(s, 5e-4, 600, 20) for s in steps], rel=1e-6,
                                abs=1e-12)
    assert rate.experimental_get_tracing_count() == 1
    keys = [name for name, _ in tf.train.list_variables(
        tf.train.Checkpoint(optimizer=optimizer).write(str(_tmp_dir() / "ckpt")))]
    assert not [k for k in keys if "length" in k.lower()], keys


def _tmp_dir():
    import pathlib
    import tempfile
    return pathlib.Path(tempfile.mkdtemp(prefix="schedule_lengths_"))


# --------------------------------------------------------------------------- MirroredStrategy

MIRRORED_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    import numpy as np
    from electra_tf.training import update
    from electra_tf.training.tf_runtime import optimizer as O
    from gradient_accumulator import GradientAccumulator

    rng = np.random.RandomState(0)
    x = rng.randn(8, 3).astype(np.float32)
    y = rng.randn(8, 4).astype(np.float32)
    init = [rng.randn(3, 4).astype(np.float32), rng.randn(4).astype(np.float32)]
    names = ["m/dense/kernel", "m/dense/bias"]

    def loss_fn(vs, xb, yb):
        return tf.reduce_mean(tf.square(tf.matmul(xb, vs[0]) + vs[1] - yb))

    def make(kind):
        vs = [tf.Variable(v, name=n) for v, n in zip(init, names)]
        cls = O.AdamW if kind == "adamw" else O.LAMB
        opt = cls(O.WarmupPolynomialDecay(1e-2, 10, 1), weight_decay=0.1).build(vs)
        acc = GradientAccumulator(2).build(vs)
        return vs, opt, acc

    def replica_step(vs, opt, acc, xb, yb, s):
        def grad_fn(micro):
            with tf.GradientTape() as tape:
                loss = loss_fn(vs, micro[0], micro[1])
            return tape.gradient(loss, vs), loss
        grads, loss = acc.accumulate_microbatches(grad_fn, (xb, yb))
        grads = O.all_reduce_gradients(grads)
        norm = update.global_norm(grads)
        opt.apply_gradients(zip(grads, vs), s, grad_scale=update.clip_scale(norm, 1.0))
        return norm

    out = {}
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    for kind in ("adamw", "lamb"):
        vs, opt, acc = make(kind)
        single = tf.function(lambda s: replica_step(vs, opt, acc, x, y, s))
        for s in range(3):
            single(tf.constant(s, tf.int64))
        with strategy.scope():
            mvs, mopt, macc = make(kind)
        slot_kinds = sorted({type(v).__name__ for v in mopt.slot_variables().values()})
        dist = strategy.experimental_distribute_values_from_function(
            lambda ctx: (x[4 * ctx.replica_id_in_sync_group: 4 * ctx.replica_id_in_sync_group + 4],
                         y[4 * ctx.replica_id_in_sync_group: 4 * ctx.replica_id_in_sync_group + 4]))

        @tf.function
        def mirrored(s):
            return strategy.run(lambda d, s: replica_step(mvs, mopt, macc, d[0], d[1], s),
                                (dist, s))
        for s in range(3):
            mirrored(tf.constant(s, tf.int64))
        out[kind] = {
            "single": [v.numpy().tolist() for v in vs],
            "replica0": [v.values[0].numpy().tolist() for v in mvs],
            "replica1": [v.values[1].numpy().tolist() for v in mvs],
            "m1": mopt.slot_variables()["m/dense/kernel/adam_m"].values[1].numpy().tolist(),
            "m_single": opt.slot_variables()["m/dense/kernel/adam_m"].numpy().tolist(),
            "slot_kinds": slot_kinds,
            "moved": float(np.abs(vs[0].numpy() - init[0]).max()),
        }
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.subprocess
def test_mirrored_strategy_matches_single_device():
    proc = forked_cli.run(["-c", MIRRORED_SCRIPT], timeout=180, cwd=os.path.join(REPO, "tests"))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT"):])
    for kind in ("adamw", "lamb"):
        r = out[kind]
        assert r["slot_kinds"] == ["MirroredVariable"]
        assert r["moved"] > 1e-3
        for single, rep0, rep1 in zip(r["single"], r["replica0"], r["replica1"]):
            np.testing.assert_allclose(rep0, single, rtol=0, atol=1e-6)
            np.testing.assert_array_equal(rep0, rep1)
        np.testing.assert_allclose(r["m1"], r["m_single"], rtol=0, atol=1e-6)
