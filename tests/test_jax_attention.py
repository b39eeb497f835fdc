"""kernels/jax_attention.py, the fused attention kernel, in Pallas' interpreter on the CPU
(one JAX process, TensorFlow unimportable): its dropout mask against `rng.dropout_uniform`
bit for bit; its output and gradients against the model's reference attention for padded
rows of every length, dropout 0 and 0.1, float32 (tight) and bfloat16 (loose), one and
two key blocks; two half-batches with their row offsets against the whole batch; the same
seed twice; and the tiny model's whole training loss and gradients through it against
the reference attention."""

import json
import os
import subprocess
import sys

import pytest

from electra_tf import compat
from conftest import REPO, without_tensorflow

SCRIPT = r"""
import json, os
import numpy as np, jax, jax.numpy as jnp
from electra_tf import rng
from electra_tf.kernels import jax_attention as A

out = {}
B, N, L, D = 4, 2, 16, 8
seed = jnp.array([123, -456, 7], jnp.int32)
keys, row0 = seed[:2], seed[2]

# 1. The kernel's keep mask, element by element, against rng.dropout_uniform >= rate.
words = A.row_words(keys, row0, B)
mask = jnp.stack([jnp.stack([A._keep(words[b, 0], words[b, 1], h, jnp.arange(L), jnp.arange(L),
                                     L, 0.1) for h in range(N)]) for b in range(B)])
want = np.asarray(rng.dropout_uniform([B, N, L, L], seed)) >= np.float32(0.1)
out["mask_mismatches"] = int((np.asarray(mask) != want).sum())
out["mask_kept"] = float(want.mean())

from electra_tf.model.modeling import reference_attention

def reference(q, k, v, bias, rate):  # the model's own attention
    return reference_attention(q, k, v, bias[:, None, None, :], seed, rate, training=True)

lengths = np.array([16, 9, 3, 1])  # padded rows: every kind of row the model sees
bias = jnp.asarray(np.where(np.arange(L)[None] < lengths[:, None], 0.0, -10000.0), jnp.float32)
qkvd = [jax.random.normal(kk, (B, N, L, D), jnp.float32) for kk in jax.random.split(
    jax.random.PRNGKey(0), 4)]

def rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

real_block = A.block_size
for dtype in ("float32", "bfloat16"):
    q, k, v, do = (x.astype(dtype) for x in qkvd)
    for rate in (0.0, 0.1):
        for block in (16, 8):
            A.block_size = lambda length, block=block: block
            f = lambda q, k, v: A.attention(q, k, v, bias, keys, row0, rate, interpret=True)
            g = lambda q, k, v: reference(q, k, v, bias, rate)
            got, back = jax.vjp(jax.jit(f), q, k, v)
            ref, ref_back = jax.vjp(jax.jit(g), q, k, v)
            errors = [rel(got, ref)] + [rel(x, y) for x, y in zip(back(do), ref_back(do))]
            out[f"{dtype}_rate{rate}_block{block}"] = errors
A.block_size = real_block

# 3. Two half-batches, each with its first global row, give the whole batch's numbers.
q, k, v, _ = qkvd
whole = A.attention(q, k, v, bias, keys, row0, 0.1, interpret=True)
halves = [A.attention(q[i:i + 2], k[i:i + 2], v[i:i + 2], bias[i:i + 2], keys, row0 + i,
                      0.1, interpret=True) for i in (0, 2)]
out["halves_equal"] = bool(np.array_equal(np.concatenate(halves), whole))
again = A.attention(q, k, v, bias, keys, row0, 0.1, interpret=True)
out["same_seed_equal"] = bool(np.array_equal(again, whole))
other = A.attention(q, k, v, bias, keys, row0 + 1, 0.1, interpret=True)
out["other_rows_differ"] = bool(not np.array_equal(other, whole))

# 4. The tiny model's training loss and gradients, through the kernel and the reference.
import keras
from electra_tf.configs import load_config
from electra_tf.model.modeling import ElectraPretrainingModel
cfg = load_config("tiny").model
keras.utils.set_random_seed(3)
model = ElectraPretrainingModel(cfg)
ids = np.random.RandomState(0).randint(5, 1000, size=(3, 32)).astype("int32")
mask = (np.arange(32)[None] < np.array([[32], [20], [7]])).astype("int32")
segments = np.zeros_like(ids)
model.discriminator(ids, mask, segments)
trainable = [w.value for w in model.trainable_variables]
step_seed = jnp.array([5, 6, 0], jnp.int32)

def loss(values):
    with keras.StatelessScope(state_mapping=list(zip(model.trainable_variables, values))):
        logits = model.discriminator(ids, mask, segments, training=True, seed=step_seed)
    return jnp.mean(jnp.square(logits.astype(jnp.float32)))

results = {}
for chosen in ("reference", "interpret"):
    os.environ["ELECTRA_TF_ATTENTION"] = chosen
    value, grads = jax.jit(jax.value_and_grad(loss))(trainable)
    results[chosen] = (float(value), [np.asarray(g) for g in grads])
out["model_loss"] = [results["reference"][0], results["interpret"][0]]
# Each array's error against its own scale; the attention keys' biases have no gradient
# (a softmax ignores what is added to a whole row): both sides give rounding noise there.
ref_grads, fused_grads = results["reference"][1], results["interpret"][1]
largest = max(float(np.abs(g).max()) for g in ref_grads)
names = [w.path for w in model.trainable_variables]
out["model_grad_rel"] = max(float(np.abs(a - b).max()) / max(float(np.abs(b).max()),
                                                              1e-6 * largest)
                            for a, b in zip(fused_grads, ref_grads))
out["model_key_bias_grad"] = max(float(np.abs(g).max()) / largest
                                 for g, n in zip(fused_grads + ref_grads, names + names)
                                 if n.endswith("self/key/bias"))
out["model_grads"] = len(ref_grads)
print(json.dumps(out))
"""


@pytest.mark.subprocess
@pytest.mark.jax
@pytest.mark.skipif(not compat.module_exists("jax"), reason="the jax extra is not installed")
def test_the_fused_kernel_equals_the_reference_attention_and_its_dropout():
    done = subprocess.run([sys.executable, *without_tensorflow(["-c", SCRIPT])], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["mask_mismatches"] == 0 and 0.85 < out["mask_kept"] < 0.95
    for key, errors in out.items():
        if key.startswith(("float32_", "bfloat16_")):
            bound = 1e-5 if key.startswith("float32") else 3e-2
            assert max(errors) <= bound, (key, errors)  # output, dq, dk, dv
    assert out["halves_equal"] and out["same_seed_equal"] and out["other_rows_differ"]
    ref, fused = out["model_loss"]
    assert fused == pytest.approx(ref, rel=1e-5) and ref > 0
    assert out["model_grads"] > 10 and out["model_grad_rel"] <= 5e-5  # jit: other sums
    assert out["model_key_bias_grad"] < 1e-7
