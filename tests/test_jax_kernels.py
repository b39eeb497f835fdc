"""The JAX backend's loss primitives (electra_tf/kernels/jax.py) against their reference
forms: the forms that keep the MLM loss's gradient elementwise on every device."""

import numpy as np
import pytest


@pytest.mark.jax
def test_the_jax_loss_primitives_equal_their_reference_forms():
    """`pick` (a gather whose gradient is a select), `softmax_xent` (logsumexp minus the
    label's logit) and `add_bias` (the bias's gradient a matrix-vector product), jitted:
    values and gradients against take_along_axis, -log_softmax[label] and `x + b`."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from electra_tf.kernels import jax as KJ
    r = np.random.RandomState(3)
    logits = jnp.asarray(r.randn(4, 6, 97).astype(np.float32) * 4)
    labels = jnp.asarray(r.randint(0, 97, (4, 6)).astype(np.int32))
    weights = jnp.asarray(r.randn(4, 6).astype(np.float32))
    bias = jnp.asarray(r.randn(97).astype(np.float32))

    def gathered(v):
        return jnp.take_along_axis(v, labels[..., None], axis=-1)[..., 0]

    np.testing.assert_array_equal(jax.jit(KJ.pick)(logits, labels), gathered(logits))
    grad = jax.jit(jax.grad(lambda v: (KJ.pick(v, labels) * weights).sum()))(logits)
    np.testing.assert_array_equal(grad, jax.grad(lambda v: (gathered(v) * weights).sum())(logits))

    def reference_xent(v):
        return -gathered(jax.nn.log_softmax(v, axis=-1))

    np.testing.assert_allclose(jax.jit(KJ.softmax_xent)(labels, logits),
                               reference_xent(logits), rtol=1e-6, atol=1e-5)
    mine = jax.jit(jax.grad(lambda v: (KJ.softmax_xent(labels, v) * weights).sum()))(logits)
    want = jax.grad(lambda v: (reference_xent(v) * weights).sum())(logits)
    np.testing.assert_allclose(mine, want, rtol=1e-5, atol=1e-6)

    def loss(add):
        return lambda x, b: jnp.sum(jnp.sin(add(x, b)) * 3.0)

    mine = jax.jit(jax.grad(loss(KJ.add_bias), (0, 1)))(logits, bias)
    want = jax.grad(loss(lambda x, b: x + b), (0, 1))(logits, bias)
    np.testing.assert_array_equal(mine[0], want[0])
    np.testing.assert_allclose(mine[1], want[1], rtol=1e-5, atol=1e-5)
    assert mine[1].shape == (97,)
