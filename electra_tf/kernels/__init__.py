"""Backend specialisations: the few primitives whose best form differs per Keras backend.

The networks, heads and objectives (`model/modeling.py`, `pretraining/losses.py`,
`pretraining/objectives.py`, `finetune/model.py`) are written once in `keras.ops`; what they
call from here is a primitive with one implementation per backend, chosen when this package
is imported from Keras' backend (`KERAS_BACKEND`, default TensorFlow):

| primitive | TensorFlow (`kernels/tensorflow.py`) | JAX (`kernels/jax.py`) |
|---|---|---|
| `gelu` | exact GELU; its gradient one XLA kernel while a tape records | `jax.nn.gelu(approximate=False)` |
| `mean_last` | LayerNorm means, as float32 matvecs on CPU (`use_matvec_means`) | `jnp.mean` |
| `rows_only` | inference outside XLA on [B * L, H] rows (Grappler's fused MatMul) | never |
| `dynamic_shape` | `tf.shape` (a tensor) | the static shape |
| `matmul_nt`, `take_rows`, `gather_slots`, `pick`, `argmax`, `add_n` | `tf.matmul(transpose_b)`, `tf.gather` (batch_dims), `tf.add_n` | `jnp` forms (vmap; `pick` a select and a sum, whose gradient is no scatter) |
| `softmax_xent`, `sigmoid_xent` | TF's fused cross-entropy ops | logsumexp minus the label's logit (`pick`: a select, no gather) / the same stable formula |
| `add_bias` | `x + bias` | `x + bias`, the bias's gradient a matrix-vector product (no reduction over the rows) |
| `cross_replica_sum` | the `tf.distribute` replica context's all-reduce | identity: a `jit` over the global batch |
| `bits` (for `electra_tf.rng`: masking and sampling) | TF's Philox (stateless ops), row-exact counters | `jax.random` (threefry) keyed per row |
| `unseeded_uniform` | TF's global random state | Keras' global seed generator |
| `fused_attention` | None: the model's own attention | a Pallas kernel without materialised scores, dropout drawn inside (`kernels/jax_attention.py`), where `ELECTRA_TF_ATTENTION` asks for it; else None |
| `single_op(fn, dtype)` | an elementwise `keras.ops` function as one graph op (a `tf.function` call: cheap to trace) | `fn` |

Seeds' folds and dropout's draws are integer hashing in `keras.ops` (`electra_tf.rng`):
the same numbers on every backend; on TensorFlow its hash is one `single_op`.

A new backend adds one module with these names; nothing else in the model changes. TensorFlow
is imported only by the TensorFlow module, so under `KERAS_BACKEND=jax` the model, heads and
objectives import on a machine without TensorFlow."""

import keras

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    from electra_tf.kernels import tensorflow as _impl
elif BACKEND == "jax":
    from electra_tf.kernels import jax as _impl
else:
    raise ImportError(f"electra-tf runs on the Keras backends tensorflow and jax, not "
                      f"KERAS_BACKEND={BACKEND!r}")

gelu = _impl.gelu
mean_last = _impl.mean_last
use_matvec_means = _impl.use_matvec_means
rows_only = _impl.rows_only
matmul_nt = _impl.matmul_nt
dynamic_shape = _impl.dynamic_shape
take_rows = _impl.take_rows
gather_slots = _impl.gather_slots
pick = _impl.pick
argmax = _impl.argmax
add_n = _impl.add_n
softmax_xent = _impl.softmax_xent
add_bias = _impl.add_bias
sigmoid_xent = _impl.sigmoid_xent
cross_replica_sum = _impl.cross_replica_sum
bits = _impl.bits
unseeded_uniform = _impl.unseeded_uniform
single_op = _impl.single_op
fused_attention = _impl.fused_attention
