"""The pure loss and metric functions of the objective variants (electra_tf.pretraining.losses)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.pretraining import losses as obj


def _np(x):
    return np.asarray(x, np.float64)


def test_focal_loss_is_cross_entropy_at_gamma_zero_and_weights_by_one_minus_p():
    logits = tf.constant(np.random.default_rng(0).normal(size=(2, 3, 7)) * 3, tf.float32)
    ids = tf.constant([[1, 2, 3], [4, 5, 6]])
    w = tf.constant([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ce_sum, _, ce = obj.mlm_loss_sums(logits, ids, w)
    f0_sum, _, f0 = obj.mlm_loss_sums(logits, ids, w, gamma=0.0)
    np.testing.assert_array_equal(f0.numpy(), ce.numpy())
    assert float(f0_sum) == float(ce_sum)

    p = np.take_along_axis(tf.nn.softmax(logits).numpy(), ids.numpy()[..., None], -1)[..., 0]
    _, _, f2 = obj.mlm_loss_sums(logits, ids, w, gamma=2.0)
    np.testing.assert_allclose(f2.numpy(), -(1 - p) ** 2 * np.log(p) * w.numpy(), rtol=1e-5)
    _, _, fp = obj.mlm_loss_sums(logits, ids, w, gamma="piecewise")
    gamma = np.where(p > 0.2, 3.0, 5.0)
    np.testing.assert_allclose(fp.numpy(), -(1 - p) ** gamma * np.log(p) * w.numpy(),
                               rtol=1e-5)
    assert (p > 0.2).any() and (p <= 0.2).any()  # both branches exercised
    # A confident right answer costs (almost) nothing; the gradient still flows.
    with tf.GradientTape() as tape:
        x = tf.Variable([[[5.0, 0.0, 0.0]]])
        loss, _, _ = obj.mlm_loss_sums(x, tf.constant([[0]]), tf.constant([[1.0]]), gamma=2.0)
    assert float(loss) < 1e-5 and np.all(np.isfinite(tape.gradient(loss, x).numpy()))
    with pytest.raises(ValueError, match="piecewise"):
        obj.focal_factor(tf.constant([-1.0]), "cubic")


def test_hp_dist_loss_is_minimised_at_pg_times_ld_over_z():
    """E_{x ~ p_S}[L_S(x)] = -sum_x p_G L_D log p_S: its minimum over the sampling head's
    logits is p_S = p_G * L_D / Z (HP paper, Eq. 2), found here by gradient descent on a
    toy vocabulary of 6 tokens."""
    p_g = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
    l_d = np.array([0.05, 0.7, 2.0, 0.3, 1.5, 0.9])  # discriminator loss per candidate
    target = p_g * l_d / np.sum(p_g * l_d)
    gen_logits = tf.constant(np.tile(np.log(p_g), (6, 1)), tf.float32)
    s = tf.Variable(tf.zeros([1, 6]))

    @tf.function
    def expected_loss():
        # Every candidate x as the sampled token of its own row, weighted by p_S(x)
        # (the sampling law: a constant).
        p_s = tf.stop_gradient(tf.nn.softmax(s))[0]
        total, _ = obj.hp_dist_head_sums(tf.tile(s, [6, 1]), gen_logits, tf.range(6),
                                         tf.constant(l_d, tf.float32), p_s)
        return total

    # The closed form of the expectation, checked at the start.
    p0 = np.full(6, 1 / 6)
    assert float(expected_loss()) == pytest.approx(-np.sum(p_g * l_d * np.log(p0)), rel=1e-5)
    @tf.function
    def descend():
        for _ in tf.range(400):
            with tf.GradientTape() as tape:
                loss = expected_loss()
            s.assign_sub(1.0 * tape.gradient(loss, s))

    descend()
    np.testing.assert_allclose(tf.nn.softmax(s)[0].numpy(), target, atol=2e-3)
    # ... and the gradient vanishes there.
    s.assign(np.log(target)[None])
    with tf.GradientTape() as tape:
        loss = expected_loss()
    assert np.abs(tape.gradient(loss, s).numpy()).max() < 1e-5


def test_hp_loss_sampling_law_is_pg_times_estimated_loss():
    rng = np.random.default_rng(1)
    gen = rng.normal(size=(1, 2, 5)).astype(np.float32)
    hp = rng.normal(size=(1, 2, 5)).astype(np.float32)
    original = np.array([[3, 0]])
    logits = obj.hp_loss_sampling_logits(tf.constant(gen), tf.constant(hp),
                                         tf.constant(original))
    p_g = np.exp(gen) / np.exp(gen).sum(-1, keepdims=True)
    d_hat = 1 / (1 + np.exp(-hp.astype(np.float64)))  # estimated P(replaced)
    is_orig = np.arange(5)[None, None] == original[..., None]
    l_hat = np.where(is_orig, -np.log(1 - d_hat), -np.log(d_hat))
    want = p_g * l_hat / (p_g * l_hat).sum(-1, keepdims=True)
    np.testing.assert_allclose(tf.nn.softmax(logits).numpy(), want, rtol=1e-5)
    # The head's loss: squared error against the discriminator's probability, whose
    # gradient stays out of the discriminator.
    hp_at, disc_at = tf.Variable([[0.3, -1.0]]), tf.Variable([[2.0, 0.0]])
    with tf.GradientTape(persistent=True) as tape:
        total, per = obj.hp_loss_head_sums(hp_at, disc_at, tf.constant([[1.0, 1.0]]))
    sig = lambda x: 1 / (1 + np.exp(-np.asarray(x)))
    np.testing.assert_allclose(per.numpy(), (sig([[0.3, -1.0]]) - sig([[2.0, 0.0]])) ** 2,
                               rtol=1e-5)
    assert tape.gradient(total, disc_at) is None
    assert tape.gradient(total, hp_at) is not None


def test_copy_mechanism_loss_on_a_hand_made_batch():
    # V = 4. Token 0: input == target (copy possible); token 1: replaced (vocab only);
    # token 2: padding.
    mlm_logits = tf.constant([[[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0], [9.0, 0, 0, 0]]])
    copy_logits = tf.constant([[0.5, -1.0, 4.0]])
    inputs = tf.constant([[2, 3, 0]])
    targets = tf.constant([[2, 1, 0]])
    mask = tf.constant([[1, 1, 0]])
    total, count, per = obj.copy_mlm_loss_sums(mlm_logits, copy_logits, inputs, targets, mask)
    sm = tf.nn.softmax(mlm_logits).numpy()[0]
    d = 1 / (1 + np.exp(-np.array([0.5, -1.0])))
    want = [-np.log(d[0] + (1 - d[0]) * sm[0, 2]), -np.log((1 - d[1]) * sm[1, 1]), 0.0]
    np.testing.assert_allclose(per.numpy()[0], want, rtol=1e-5)
    assert float(count) == 2.0 and float(total) == pytest.approx(sum(want), rel=1e-5)


def test_reinforce_gradient_and_baseline_target():
    """Policy gradient: d/dlogits = -(r - b) * d log p(x'); the baseline's cross-entropy
    is smallest where sigmoid(b) = exp(-reward)."""
    logits = tf.Variable([[[0.2, -0.3, 1.0]]])
    base = tf.Variable([[0.4]])
    reward = tf.constant([[1.3]])
    with tf.GradientTape(persistent=True) as tape:
        policy, baseline = obj.reinforce_sums(logits, tf.constant([[2]]), reward, base,
                                              tf.constant([[1.0]]))
    p = tf.nn.softmax(logits).numpy()[0, 0]
    b = np.log1p(np.exp(-0.4))  # -log sigmoid(0.4)
    want = -(1.3 - b) * (np.eye(3)[2] - p)
    np.testing.assert_allclose(tape.gradient(policy, logits).numpy()[0, 0], want, rtol=1e-5)
    assert float(policy) == pytest.approx(-(1.3 - b) * np.log(p[2]), rel=1e-5)
    q = np.exp(-1.3)
    np.testing.assert_allclose(tape.gradient(baseline, base).numpy(),
                               [[1 / (1 + np.exp(-0.4)) - q]], rtol=1e-5)
    # No gradient through the reward (the discriminator's loss).
    r = tf.Variable([[1.3]])
    with tf.GradientTape() as tape:
        policy, baseline = obj.reinforce_sums(logits, tf.constant([[2]]), r, base,
                                              tf.constant([[1.0]]))
        total = policy + baseline
    assert tape.gradient(total, r) is None


def test_slot_disc_loss_and_masked_accuracy_on_a_hand_made_batch():
    disc_logits = tf.constant([[3.0, -2.0, 1.0, -1.0, 0.5]])
    labels = tf.constant([[0, 0, 1, 1, 0]])
    positions = tf.constant([[2, 3, 0]])
    weights = tf.constant([[1.0, 1.0, 0.0]])
    per = obj.slot_disc_loss(disc_logits, labels, positions, weights).numpy()[0]
    sp = lambda x: np.log1p(np.exp(x))
    np.testing.assert_allclose(per, [sp(-1.0), sp(1.0), 0.0], rtol=1e-6)
    sums = obj.metric_sums(input_mask=tf.ones([1, 5], tf.int32), masked_ids=tf.constant(
        [[7, 8, 0]]), masked_weights=weights, sampled_ids=tf.constant([[7, 9, 0]]),
        disc_logits=disc_logits, disc_labels=labels, masked_positions=positions)
    m = {k: float(v) for k, v in obj.metrics_from_sums(sums).items()}
    # predictions (logit > 0): 1 0 1 0 1 vs labels 0 0 1 1 0 -> 2 of 5 right overall,
    # at the slots (positions 2, 3): right, wrong.
    assert m["disc_accuracy"] == pytest.approx(2 / 5)
    assert m["disc_masked_accuracy"] == pytest.approx(1 / 2)
    assert m["sampled_masked_lm_accuracy"] == pytest.approx(1 / 2)


def test_max_probability_histogram_and_hp_correlation():
    # Slot 0: a peaked distribution (max ~0.97), slot 1 uniform over 4 (0.25), slot 2
    # padding (not counted).
    sampling = tf.constant([[[6.0, 0, 0, 0], [0.0, 0, 0, 0], [9.0, 0, 0, 0]]])
    rng = np.random.default_rng(3)
    est = rng.normal(size=(1, 3)).astype(np.float32)
    act = (2 * est + rng.normal(size=(1, 3))).astype(np.float32)
    w = tf.constant([[1.0, 1.0, 0.0]])
    sums = obj.metric_sums(input_mask=tf.ones([1, 4], tf.int32),
                           masked_ids=tf.constant([[0, 1, 0]]), masked_weights=w,
                           sampled_ids=tf.constant([[0, 2, 0]]), sampling_logits=sampling,
                           hp_estimate=tf.constant(est), hp_actual=tf.constant(act))
    np.testing.assert_array_equal(sums["sampling_max_prob_hist"].numpy(),
                                  [0, 0, 1, 0, 0, 0, 0, 0, 0, 1])
    m = obj.metrics_from_sums(sums)
    assert float(m["sampling_max_prob/0.9-1.0"]) == 0.5
    assert float(m["sampling_max_prob/0.2-0.3"]) == 0.5
    # Two real slots: r = +-1; each group has one point: r = 0 (no variance).
    want = np.corrcoef(est[0, :2], act[0, :2])[0, 1]
    assert float(m["hp_loss_corr"]) == pytest.approx(want, abs=1e-5)
    assert float(m["hp_loss_corr_original"]) == 0.0

    # Many points, accumulated over two batches, equal numpy's Pearson r.
    x = rng.normal(size=(2, 40)).astype(np.float32)
    y = (0.5 * x + rng.normal(size=(2, 40))).astype(np.float32)
    sampled = rng.integers(0, 2, size=(2, 40))
    total = None
    for half in (slice(0, 1), slice(1, 2)):
        total = obj.accumulate_metric_sums(total, obj.metric_sums(
            input_mask=tf.ones([1, 4], tf.int32), masked_ids=tf.zeros([1, 40], tf.int32),
            masked_weights=tf.ones([1, 40]), sampled_ids=tf.constant(sampled[half]),
            hp_estimate=tf.constant(x[half]), hp_actual=tf.constant(y[half])))
    m = obj.metrics_from_sums(total)
    assert float(m["hp_loss_corr"]) == pytest.approx(np.corrcoef(x.ravel(), y.ravel())[0, 1],
                                                      abs=1e-4)
    orig = sampled.ravel() == 0
    assert float(m["hp_loss_corr_original"]) == pytest.approx(
        np.corrcoef(x.ravel()[orig], y.ravel()[orig])[0, 1], abs=1e-4)
    assert float(m["hp_loss_corr_replaced"]) == pytest.approx(
        np.corrcoef(x.ravel()[~orig], y.ravel()[~orig])[0, 1], abs=1e-4)
