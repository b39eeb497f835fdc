"""Attention without materialised scores, on JAX: a Pallas kernel, forward and backward.

`attention(q, k, v, key_bias, seed, rate)` computes what `model/modeling.py`'s attention
computes from the same inputs: softmax(q k^T + bias) in float32, dropout on the
probabilities, times v. It never writes the [B, N, L, L] scores, probabilities or dropout
mask to memory: each program holds one block of queries, walks the keys block by block with
a running maximum and sum (the online softmax), and keeps only the output and each row's
log-sum-exp for the backward pass, which recomputes the probabilities block by block.

Dropout is drawn inside the kernel, and it is `rng.dropout_uniform`'s draw bit for bit:
the element (b, h, i, j) of the [B, N, L, L] probabilities hashes its index in its row,
(h * L + i) * L + j, with two words keyed by the seed and the row's global index
(computed here, outside the kernel, per row). So the mask is the reference's: a resumed
step, a split batch and the TensorFlow runtime's step all see the same one. The backward
pass draws it again instead of storing it.

Inputs: q (already scaled by 1/sqrt(D)), k, v [B, N, L, D] in the compute dtype; matmuls
take them as they are and accumulate in float32 (`preferred_element_type`). key_bias [B, L]
float32 (0 for a real token, -10000 for padding, as the reference adds). Lengths that
the blocks do not divide, and the two-tower generator's one-sided masks, stay with the
reference (`supported`).

`interpret=True` runs the kernels in Pallas' interpreter on any platform (the tests, on
the CPU); the GPU lowers them through Triton, a TPU through Mosaic.
"""

import functools
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

_M1, _M2, _SALT = 0x7FEB352D, 0x846CA68B, 0x9E3779B9  # rng.py's hash (lowbias32) and salt
ENV = "ELECTRA_TF_ATTENTION"
MODES = ("reference", "fused", "interpret")


def mode() -> str:
    """ELECTRA_TF_ATTENTION: `reference` (the default: the keras.ops attention), `fused`
    (this kernel on a GPU or TPU where `supported`, the reference elsewhere) or
    `interpret` (this kernel in Pallas' interpreter on any platform: slow, for tests)."""
    value = os.environ.get(ENV, "reference").strip().lower() or "reference"
    if value not in MODES:
        raise ValueError(f"{ENV}={value}: one of {', '.join(MODES)}")
    return value


def fused_attention(q, k, v, input_mask, seed, rate: float, direction=None):
    """The model's attention through this kernel where `mode()` and the shape allow it,
    else None (the caller computes the reference). q (scaled), k, v [B, N, L, D];
    input_mask [B, L] 1 / 0; seed: the dropout's [3] seed (rng), None without dropout."""
    chosen = mode()
    if chosen == "reference" or not supported(q.shape[2], direction):
        return None
    if chosen == "fused" and jax.devices()[0].platform not in ("gpu", "tpu"):
        return None
    if rate > 0 and seed is None:  # unseeded dropout: the backend's global state
        return None
    key_bias = (1.0 - input_mask.astype(jnp.float32)) * np.float32(-10000.0)
    keys, row0 = (None, 0) if seed is None else (seed[:2], seed[2])
    return attention(q, k, v, key_bias, keys, row0, rate, interpret=chosen == "interpret")


def block_size(length: int) -> Optional[int]:
    """The query and key block: 128 (64 for lengths 64, any length up to 64 whole), or None
    when no block divides the length."""
    if length <= 64:
        return length
    for size in (128, 64):
        if length % size == 0:
            return size
    return None


def supported(length: int, direction) -> bool:
    return direction is None and block_size(length) is not None


def _mix(x):
    x = x ^ (x >> 16)
    x = x * jnp.uint32(_M1)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(_M2)
    return x ^ (x >> 16)


def row_words(keys, row0, batch: int):
    """[B, 2] uint32: the two words `rng.dropout_uniform` keys each row with (rows row0 ..
    row0 + B - 1 of the global batch) from the seed's [2] int32 keys."""
    k0, k1 = keys[0].astype(jnp.uint32), keys[1].astype(jnp.uint32)
    rows = (row0 + jnp.arange(batch, dtype=jnp.int32)).astype(jnp.uint32)
    a = _mix(_mix(rows ^ k0) + k1)
    b = _mix((a ^ k1) + jnp.uint32(_SALT))
    return jnp.stack([a, b], axis=1)


def _keep(a, b, head, query_pos, key_pos, length: int, rate: float):
    """The kept elements of one block: rng.dropout_uniform(...) >= rate, from the row's
    words and each element's index in its row."""
    index = ((head * length + query_pos)[:, None] * length + key_pos[None, :]).astype(jnp.uint32)
    bits = _mix(_mix(index ^ a) + b)
    uniform = (bits >> 8).astype(jnp.float32) * np.float32(1.0 / (1 << 24))
    return uniform >= np.float32(rate)


def _row_dropout(words_ref, rate: float):
    """A program's row words and the kept elements' scale (None: no dropout)."""
    return (words_ref[0, 0], words_ref[0, 1],
            np.float32(1.0 / (1.0 - rate)) if rate > 0 else None)


def _dot(x, y, contract_x=1, contract_y=0):
    return jax.lax.dot_general(x, y, (((contract_x,), (contract_y,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _fwd_kernel(q_ref, k_ref, v_ref, bias_ref, words_ref, o_ref, lse_ref, *, rate, block):
    head, qb = pl.program_id(1), pl.program_id(2)
    q = q_ref[...]
    block_q, depth = q.shape
    length = k_ref.shape[0]
    query_pos = qb * block_q + jnp.arange(block_q, dtype=jnp.int32)
    a, b, scale = _row_dropout(words_ref, rate)

    def body(kb, carry):
        m, l, acc = carry
        start = pl.multiple_of(kb * block, block)
        k = k_ref[pl.ds(start, block), :]
        v = v_ref[pl.ds(start, block), :]
        s = _dot(q, k, 1, 1) + bias_ref[0, pl.ds(start, block)][None, :]
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp(s - m_new[:, None])
        correction = jnp.exp(m - m_new)
        l = l * correction + p.sum(axis=1)
        if scale is not None:
            key_pos = start + jnp.arange(block, dtype=jnp.int32)
            p = jnp.where(_keep(a, b, head, query_pos, key_pos, length, rate), p * scale, 0.0)
        acc = acc * correction[:, None] + _dot(p.astype(v.dtype), v)
        return m_new, l, acc

    init = (jnp.full((block_q,), -jnp.inf, jnp.float32), jnp.zeros((block_q,), jnp.float32),
            jnp.zeros((block_q, depth), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, length // block, body, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def _probs(q, k, bias, lse):
    """Normalised probabilities of a block from its log-sum-exps."""
    return jnp.exp(_dot(q, k, 1, 1) + bias[None, :] - lse[:, None])


def _dkv_kernel(q_ref, k_ref, v_ref, bias_ref, words_ref, do_ref, lse_ref, delta_ref,
                dk_ref, dv_ref, *, rate, block):
    head, kb = pl.program_id(1), pl.program_id(2)
    k, v = k_ref[...], v_ref[...]
    block_k, depth = k.shape
    length = q_ref.shape[0]
    key_pos = kb * block_k + jnp.arange(block_k, dtype=jnp.int32)
    bias = bias_ref[0, pl.ds(kb * block_k, block_k)]
    a, b, scale = _row_dropout(words_ref, rate)

    def body(qb, carry):
        dk, dv = carry
        start = pl.multiple_of(qb * block, block)
        q = q_ref[pl.ds(start, block), :]
        do = do_ref[pl.ds(start, block), :]
        p = _probs(q, k, bias, lse_ref[pl.ds(start, block)])
        dp = _dot(do, v, 1, 1)  # [block_q, block_k]: d(dropped probabilities)
        if scale is not None:
            query_pos = start + jnp.arange(block, dtype=jnp.int32)
            keep = _keep(a, b, head, query_pos, key_pos, length, rate)
            dropped = jnp.where(keep, p * scale, 0.0)
            dp = jnp.where(keep, dp * scale, 0.0)
        else:
            dropped = p
        dv = dv + _dot(dropped.astype(do.dtype), do, 0, 0)
        ds = p * (dp - delta_ref[pl.ds(start, block)][:, None])
        dk = dk + _dot(ds.astype(q.dtype), q, 0, 0)
        return dk, dv

    init = (jnp.zeros((block_k, depth), jnp.float32), jnp.zeros((block_k, depth), jnp.float32))
    dk, dv = jax.lax.fori_loop(0, length // block, body, init)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, bias_ref, words_ref, do_ref, lse_ref, delta_ref, dq_ref,
               *, rate, block):
    head, qb = pl.program_id(1), pl.program_id(2)
    q, do = q_ref[...], do_ref[...]
    block_q, depth = q.shape
    length = k_ref.shape[0]
    query_pos = qb * block_q + jnp.arange(block_q, dtype=jnp.int32)
    lse, delta = lse_ref[...], delta_ref[...]
    a, b, scale = _row_dropout(words_ref, rate)

    def body(kb, dq):
        start = pl.multiple_of(kb * block, block)
        k = k_ref[pl.ds(start, block), :]
        v = v_ref[pl.ds(start, block), :]
        p = _probs(q, k, bias_ref[0, pl.ds(start, block)], lse)
        dp = _dot(do, v, 1, 1)
        if scale is not None:
            key_pos = start + jnp.arange(block, dtype=jnp.int32)
            keep = _keep(a, b, head, query_pos, key_pos, length, rate)
            dp = jnp.where(keep, dp * scale, 0.0)
        ds = p * (dp - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    dq = jax.lax.fori_loop(0, length // block, body, jnp.zeros((block_q, depth), jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _specs(batch, heads, length, depth, block):
    """BlockSpecs over a (batch, head, block) grid: one block of rows, all rows, the bias
    row, the row's words, a block of per-row scalars, all per-row scalars."""
    rows = pl.BlockSpec((None, None, block, depth), lambda b, h, i: (b, h, i, 0))
    whole = pl.BlockSpec((None, None, length, depth), lambda b, h, i: (b, h, 0, 0))
    bias = pl.BlockSpec((1, length), lambda b, h, i: (b, 0))
    words = pl.BlockSpec((1, 2), lambda b, h, i: (b, 0))
    scalars = pl.BlockSpec((None, None, block), lambda b, h, i: (b, h, i))
    all_scalars = pl.BlockSpec((None, None, length), lambda b, h, i: (b, h, 0))
    return rows, whole, bias, words, scalars, all_scalars


def _forward(q, k, v, key_bias, words, rate, interpret):
    batch, heads, length, depth = q.shape
    block = block_size(length)
    rows, whole, bias, word, scalars, _ = _specs(batch, heads, length, depth, block)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, rate=rate, block=block),
        grid=(batch, heads, length // block),
        in_specs=[rows, whole, whole, bias, word],
        out_specs=[rows, scalars],
        out_shape=[jax.ShapeDtypeStruct(q.shape, v.dtype),
                   jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
        interpret=interpret)(q, k, v, key_bias, words)


def _backward(q, k, v, key_bias, words, out, lse, d_out, rate, interpret):
    batch, heads, length, depth = q.shape
    block = block_size(length)
    rows, whole, bias, word, scalars, all_scalars = _specs(batch, heads, length, depth, block)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    grid = (batch, heads, length // block)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, rate=rate, block=block), grid=grid,
        in_specs=[whole, rows, rows, bias, word, whole, all_scalars, all_scalars],
        out_specs=[rows, rows],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret=interpret)(q, k, v, key_bias, words, d_out, lse, delta)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, rate=rate, block=block), grid=grid,
        in_specs=[rows, whole, whole, bias, word, rows, scalars, scalars],
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret)(q, k, v, key_bias, words, d_out, lse, delta)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, key_bias, words, rate, interpret):
    return _forward(q, k, v, key_bias, words, rate, interpret)[0]


def _attention_fwd(q, k, v, key_bias, words, rate, interpret):
    out, lse = _forward(q, k, v, key_bias, words, rate, interpret)
    return out, (q, k, v, key_bias, words, out, lse)


def _attention_bwd(rate, interpret, residuals, d_out):
    q, k, v, key_bias, words, out, lse = residuals
    dq, dk, dv = _backward(q, k, v, key_bias, words, out, lse, d_out, rate, interpret)
    return (dq, dk, dv, jnp.zeros_like(key_bias),
            np.zeros(words.shape, dtype=jax.dtypes.float0))


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, key_bias, keys=None, row0=0, rate: float = 0.0,
              interpret: Optional[bool] = None):
    """softmax(q k^T + key_bias) (float32) with dropout at `rate` drawn from the seed's
    [2] int32 `keys` and first global row `row0` (rng.keys_and_row), times v. -> [B, N,
    L, D] in v's dtype. `interpret` None: the interpreter except on a GPU or TPU."""
    if interpret is None:
        interpret = jax.devices()[0].platform not in ("gpu", "tpu")
    batch = q.shape[0]
    if rate > 0:
        words = row_words(jnp.asarray(keys), jnp.asarray(row0, jnp.int32), batch)
    else:
        words = jnp.zeros((batch, 2), jnp.uint32)
    return _attention(q, k, v, key_bias.astype(jnp.float32), words, float(rate),
                      bool(interpret))
