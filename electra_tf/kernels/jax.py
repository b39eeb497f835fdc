"""The JAX backend's primitives (see `electra_tf.kernels`). No TensorFlow: a GPU machine with
only JAX, or a JAX TPU VM, imports the model through this module."""

import jax
import jax.numpy as jnp


def gelu(x):
    """Exact (erf) GELU."""
    return jax.nn.gelu(x, approximate=False)


def use_matvec_means(enabled: bool) -> bool:
    """A TensorFlow-on-CPU specialisation (`kernels/tensorflow.py`); JAX keeps reductions."""
    return False


def mean_last(x):
    """Mean over the last axis, keepdims, in x's dtype (LayerNorm passes float32)."""
    return jnp.mean(x, axis=-1, keepdims=True)


def rows_only() -> bool:
    """Encoders keep [B, L, H] under JAX (every call is compiled)."""
    return False


def dynamic_shape(x):
    """x's shape: static ints under jit."""
    return tuple(x.shape)


def matmul_nt(a, b):
    """a @ b^T over the last two axes."""
    return jnp.matmul(a, jnp.swapaxes(b, -1, -2))


def take_rows(table, ids):
    """table [N, ...] at int ids [...] -> [..., ...]."""
    return jnp.take(table, ids, axis=0)


def gather_slots(values, positions):
    """values [B, L, ...] at positions [B, P] -> [B, P, ...]."""
    return jax.vmap(lambda v, p: v[p])(values, jnp.asarray(positions, jnp.int32))


def pick(values, ids):
    """values [..., V] at ids [...] -> [...]: a gather forward; its gradient a select
    against the ids (elementwise, fused with what consumes it) where `take_along_axis`'s is
    a scatter into a zeroed [..., V] buffer (on the CPU that buffer alone, for the MLM
    loss's [B, P, V], took ~30 ms of `tiny`'s 450 ms step: bench/cpu_step_profile.py)."""
    return _pick(values, jnp.asarray(ids, jnp.int32))


@jax.custom_vjp
def _pick(values, ids):
    return jnp.take_along_axis(values, ids[..., None], axis=-1)[..., 0]


def _pick_fwd(values, ids):
    # A [V, 0] array carries V (static) into the backward for nothing.
    return _pick(values, ids), (ids, jnp.zeros((values.shape[-1], 0), jnp.int8))


def _pick_bwd(residuals, g):
    ids, width = residuals
    shape = ids.shape + (width.shape[0],)
    hit = jax.lax.broadcasted_iota(jnp.int32, shape, ids.ndim) == ids[..., None]
    return jnp.where(hit, g[..., None], jnp.zeros((), g.dtype)), None


_pick.defvjp(_pick_fwd, _pick_bwd)


def argmax(x):
    """int32 argmax over the last axis."""
    return jnp.argmax(x, axis=-1).astype(jnp.int32)


def softmax_xent(labels, logits):
    """-log softmax(logits)[labels], float32: logsumexp(logits) - logits[labels], whose
    gradient (softmax - one-hot) is elementwise."""
    return jax.nn.logsumexp(logits, axis=-1) - pick(logits, labels)


@jax.custom_vjp
def add_bias(x, bias):
    """x [..., N] + bias [N]; the bias's gradient a matrix-vector product (ones over the
    rows) instead of a reduction over them: on the CPU XLA's reduction of the generator's
    [B * P, V] logits gradient took ~60 ms of `tiny`'s step, the product a few."""
    return x + bias


def _add_bias_fwd(x, bias):
    return x + bias, None


def _add_bias_bwd(_, g):
    rows = g.reshape(-1, g.shape[-1])
    return g, (jnp.ones((1, rows.shape[0]), g.dtype) @ rows)[0]


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


def sigmoid_xent(labels, logits):
    """Binary cross-entropy of float `labels` against `logits`: max(x, 0) - x z +
    log(1 + exp(-|x|)), the stable form."""
    return jnp.maximum(logits, 0.0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))


def cross_replica_sum(x):
    """Identity (no gradient): a JAX step is one `jit` over the global batch, whose sums are
    already global, whatever the sharding."""
    return jax.lax.stop_gradient(jnp.asarray(x))


def add_n(xs):
    """The sum of a list of arrays, left to right."""
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total


def single_op(fn, dtype: str):
    """`fn` itself: `jax.jit` traces a call in microseconds (TensorFlow's graph ops cost
    more, see the TensorFlow module)."""
    return fn


# --------------------------------------------------------------------------- draws


def unseeded_uniform(shape):
    """float32 uniform on [0, 1) from Keras' global seed generator (dropout without a seed;
    not inside `jax.jit`, where every draw needs a seed)."""
    import keras
    return keras.random.uniform(tuple(shape), dtype="float32")


def _key(seed2):
    """A threefry key from a [2] int32 seed."""
    data = jax.lax.bitcast_convert_type(jnp.asarray(seed2, jnp.int32), jnp.uint32)
    return jax.random.wrap_key_data(data, impl="threefry2x32")


def bits(shape, seed):
    """uint32 random bits of the static `shape` [rows, ...] for a [3] int32 seed (keys,
    first_row): row b is drawn from the key folded with first_row + b, so a device holding
    rows [r, r + n) of a batch draws what the whole batch's rows r.. would."""
    shape = tuple(int(d) for d in shape)
    key = _key(seed[:2])
    rows = jnp.asarray(seed[2], jnp.int32) + jnp.arange(shape[0], dtype=jnp.int32)
    row_keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(rows)
    return jax.vmap(lambda k: jax.random.bits(k, shape[1:], jnp.uint32))(row_keys)


def fused_attention(q, k, v, input_mask, seed, rate: float, direction=None):
    """Attention without materialised scores (kernels/jax_attention.py, Pallas) where
    ELECTRA_TF_ATTENTION asks for it, else None: the model's own attention. Pallas is
    imported only then."""
    import os
    if os.environ.get("ELECTRA_TF_ATTENTION", "").strip().lower() in ("", "reference"):
        return None
    from electra_tf.kernels import jax_attention
    return jax_attention.fused_attention(q, k, v, input_mask, seed, rate, direction)
