"""The TensorFlow backend's primitives (see `electra_tf.kernels`): what the CPU lead and the
numbers of every TensorFlow run rest on. GELU's fused gradient, LayerNorm means as matvecs,
rows-only inference, TF's Philox draws and TF's fused cross-entropy ops."""

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record  # no public API: whether a tape records
# No public API: the key/counter derivation TF's own stateless ops use for Philox.
from tensorflow.python.ops import random_ops_util

from electra_tf import compat

# --------------------------------------------------------------------------- GELU


def gelu(x):
    """Exact (erf) GELU, as the released ELECTRA code: `tf.nn.gelu`'s numbers, with a
    gradient of one XLA kernel (not nine passes over [B, L, 4H]) where `fused_backward()`."""
    return _gelu_fused_grad(x) if fused_backward() else tf.nn.gelu(x, approximate=False)


def fused_backward() -> bool:  # while a tape records, where compat.xla_kernels_apply()
    return record.could_possibly_record() and compat.xla_kernels_apply()


@tf.custom_gradient
def _gelu_fused_grad(x):
    erfc = tf.math.erfc(-x * tf.cast(0.7071067811865476, x.dtype))  # as tf.nn.gelu
    return 0.5 * x * erfc, lambda dy: _gelu_grad_kernel(x, erfc, dy)


@tf.function(jit_compile=True, autograph=False)
def _gelu_grad_kernel(x, erfc, dy):
    """dy * d/dx [x Phi(x)] = dy * (Phi(x) + x phi(x)), Phi(x) = erfc(-x / sqrt 2) / 2."""
    pdf = tf.exp(-0.5 * tf.square(x)) * tf.cast(0.3989422804014327, x.dtype)
    return dy * (0.5 * erfc + x * pdf)


# --------------------------------------------------------------------------- LayerNorm means

_MATVEC_MEANS = False


def use_matvec_means(enabled: bool) -> bool:
    """CPU only: compute LayerNorm means as [rows, H] x [H, 1] float32 dots, which XLA:CPU
    runs as vectorised kernels (its reductions cost ~4% of an ELECTRA-Small train step).
    Not for GPU or TPU, whose float32 matmuls may run in TF32 / bfloat16 passes and would
    round the statistics. Set before tracing; returns the previous setting."""
    global _MATVEC_MEANS
    previous, _MATVEC_MEANS = _MATVEC_MEANS, bool(enabled)
    return previous


def mean_last(x):
    """Mean over the last (static) axis, keepdims, in float32."""
    if not _MATVEC_MEANS:
        return tf.reduce_mean(x, axis=-1, keepdims=True)
    size = x.shape[-1]
    ones = tf.fill([size, 1], 1.0 / size)
    if x.shape.rank == 2:
        return tf.matmul(x, ones)
    mean = tf.matmul(tf.reshape(x, [-1, size]), ones)
    return tf.reshape(mean, tf.concat([tf.shape(x)[:-1], [1]], 0))


def rows_only() -> bool:
    """Whether an encoder runs on [B * L, H] rows: inference outside XLA. Dense layers on
    3-D inputs with an unknown batch add ~15 shape ops each (half the graph to trace and
    optimise), and 2-D lets Grappler fuse MatMul + BiasAdd. Not under a tape: the fused
    gradient (oneDNN) differs from run to run in the last bits. XLA keeps [B, L, H], whose
    reductions it orders differently from the rows' (pre-training's numbers)."""
    return not compat.in_xla_trace() and not record.could_possibly_record()


# --------------------------------------------------------------------------- gathers, products


def dynamic_shape(x):
    """x's shape at run time, a 1-D int32 tensor (a draw's shape)."""
    return tf.shape(x)


def matmul_nt(a, b):
    """a @ b^T over the last two axes."""
    return tf.matmul(a, b, transpose_b=True)


def take_rows(table, ids):
    """table [N, ...] at int ids [...] -> [..., ...]."""
    return tf.gather(table, ids)


def gather_slots(values, positions):
    """values [B, L, ...] at positions [B, P] -> [B, P, ...]."""
    return tf.gather(values, tf.cast(positions, tf.int32), axis=1, batch_dims=1)


def pick(values, ids):
    """values [..., V] at ids [...] -> [...]."""
    return tf.gather(values, tf.cast(ids, tf.int32), axis=-1, batch_dims=len(ids.shape))


def argmax(x):
    """int32 argmax over the last axis."""
    return tf.argmax(x, axis=-1, output_type=tf.int32)


def softmax_xent(labels, logits):
    """-log softmax(logits)[labels], float32."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def add_bias(x, bias):
    """x [..., N] + bias [N] (the JAX module gives the bias's gradient another form)."""
    return x + bias


def sigmoid_xent(labels, logits):
    """Binary cross-entropy of float `labels` against `logits`, float32."""
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)


def cross_replica_sum(x):
    """SUM of `x` (no gradient) over the current context's replicas: a global denominator."""
    x = tf.stop_gradient(tf.convert_to_tensor(x))
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)


def add_n(xs):
    """The sum of a list of tensors (TF's AddN)."""
    return tf.add_n(xs)


# --------------------------------------------------------------------------- one op


def single_op(fn, dtype: str):
    """`fn`, an elementwise function of one `dtype` tensor written in `keras.ops`, as one
    function-call op in a graph: traced once for every shape, then each call adds one op
    where inlining its ~15 would cost ~0.6 ms each to build (the hash of `electra_tf.rng`:
    a step's trace calls it ~100 times, 0.6-0.8 s of a 4.7 s trace). Grappler and XLA inline
    the call, so the executed program is the same; eagerly it runs the traced function."""
    traced = tf.function(fn, input_signature=[tf.TensorSpec(None, tf.as_dtype(dtype))],
                         autograph=False)

    def call(x):
        x = tf.convert_to_tensor(x, dtype)
        y = traced(x)
        if not tf.executing_eagerly():
            y.set_shape(x.shape)  # elementwise: the input's shape, which the signature drops
        return y

    return call


# --------------------------------------------------------------------------- Philox draws

_PHILOX = 1  # the `alg` enum of the V2 stateless random ops


def philox_key_counter(seed2):
    """(key [1], counter [2]) uint64 of Philox for a [2] int seed: TF's scrambling, as its
    stateless ops do with alg="philox". Eager and in graphs one op, where TF's Python form
    is ~40 (each a trace and graph-optimisation cost: a step calls this ~60 times). Not
    under XLA (jit_compile, TPU), whose kernel for that op scrambles negative seeds
    otherwise (and picks another generator on a TPU): there the Python form."""
    if compat.in_xla_trace():
        key, counter, _ = random_ops_util.get_key_counter_alg(seed2, "philox")
        return key, counter
    return tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed2)


def bits(shape, seed) -> tf.Tensor:
    """uint32 random bits of `shape` ([rows, ...], a list of ints or a 1-D int tensor) for
    a [3] int32 seed (keys, first_row): Philox counters skipped `first_row` rows in."""
    static = isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape)
    if static:
        rows, per_row = shape[0], int(np.prod(shape[1:]))
        padded = -(-per_row // 4) * 4  # whole Philox blocks (4 words) per row
        out_shape = [rows, padded]
    else:
        shape = tf.cast(tf.convert_to_tensor(shape), tf.int32)
        rows, per_row = shape[0], tf.reduce_prod(shape[1:])
        padded = (per_row + 3) // 4 * 4
        out_shape = tf.stack([rows, padded])
    key, counter = philox_key_counter(seed[:2])
    skip = tf.cast(seed[2], tf.uint64) * tf.cast(padded // 4, tf.uint64)
    counter = counter + tf.stack([skip, tf.constant(0, tf.uint64)])
    out = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=out_shape, key=key, counter=counter, alg=_PHILOX, dtype=tf.uint32)
    return tf.reshape(out[:, :per_row], shape)


def unseeded_uniform(shape) -> tf.Tensor:
    """float32 uniform on [0, 1) from TF's global random state (dropout without a seed)."""
    return tf.random.uniform(shape, dtype=tf.float32)


def fused_attention(q, k, v, input_mask, seed, rate: float, direction=None):
    """None: the model's own attention (the fused kernel is JAX's, kernels/jax_attention.py)."""
    return None
