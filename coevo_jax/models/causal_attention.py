"""Causal grouped-query attention for full sequences (training and scoring), block-wise with recompute.

The dense path (`kernels.xla.attend`) materialises a [B, K, G, T, T] float32 score tensor and runs softmax
over all of it, half of which the causal mask throws away. Here queries are split into blocks of
`block_size`; block i only scores keys [0, end_i), so the upper triangle is never computed. The forward
keeps only the output and the per-row log-sum-exp; the backward recomputes each block's probabilities
from them (as FlashAttention does), so no T x T tensor is stored between forward and backward.

On the CPU the work is also split over the batch rows (`row_chunks`, a `lax.map`): one row's blocks
fit in the cache, which the score tensors of a whole batch do not; this alone makes the pass several
times faster on a 2-core machine. On accelerators all rows run at once.

Shape legend: B batch, T length, H query heads, K key/value heads, G = H // K, E head_dim, S keys.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.models.layers import MASKED_SCORE, constrain


def _block_bounds(length: int, block_size: int) -> list[tuple[int, int]]:
    """[(start, end)] of the query blocks; the last one may be shorter."""
    return [(start, min(start + block_size, length)) for start in range(0, length, block_size)]


def _block_allowed(start: int, end: int, key_mask_BxT: jax.Array) -> jax.Array:
    """[B, 1, 1, end - start, end]: query t (absolute start + t) may attend key s <= t with mask 1."""
    query_T = np.arange(start, end)[:, None]
    key_S = np.arange(end)[None, :]
    causal_TxS = jnp.asarray(key_S <= query_T)
    return (causal_TxS[None] & (key_mask_BxT[:, None, :end] > 0))[:, None, None]


def _scores(q_BxKxGxTxE, k_BxKxSxE, allowed):
    """Scaled, masked float32 scores [B, K, G, T, S]."""
    head_dim = q_BxKxGxTxE.shape[-1]
    scores = jnp.einsum("bkgte,bkse->bkgts", q_BxKxGxTxE, k_BxKxSxE, preferred_element_type=jnp.float32)
    return jnp.where(allowed, scores * (head_dim**-0.5), MASKED_SCORE)


def _forward_rows(q_BxKxGxTxE, k_BxKxTxE, v_BxKxTxE, key_mask_BxT, block_size):
    """(output [B, K, G, T, E] in v's dtype, log-sum-exp [B, K, G, T] float32)."""
    outs, lses = [], []
    for start, end in _block_bounds(q_BxKxGxTxE.shape[3], block_size):
        scores = _scores(
            q_BxKxGxTxE[:, :, :, start:end], k_BxKxTxE[:, :, :end], _block_allowed(start, end, key_mask_BxT)
        )
        top = jnp.max(scores, axis=-1, keepdims=True)
        weights = jnp.exp(scores - top)
        total = jnp.sum(weights, axis=-1, keepdims=True)
        probs = (weights / total).astype(v_BxKxTxE.dtype)
        outs.append(jnp.einsum("bkgts,bkse->bkgte", probs, v_BxKxTxE[:, :, :end]))
        lses.append((top + jnp.log(total))[..., 0])
    return jnp.concatenate(outs, axis=3), jnp.concatenate(lses, axis=3)


def _backward_rows(q_BxKxGxTxE, k_BxKxTxE, v_BxKxTxE, key_mask_BxT, out, lse, d_out, block_size):
    """Gradients (dq, dk, dv), float32, from the saved output and log-sum-exp."""
    # delta_t = sum_e dO_te * O_te = sum_s P_ts dP_ts: the softmax backward's row term.
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    dk = jnp.zeros(k_BxKxTxE.shape, jnp.float32)
    dv = jnp.zeros(v_BxKxTxE.shape, jnp.float32)
    dqs = []
    for start, end in _block_bounds(q_BxKxGxTxE.shape[3], block_size):
        q_blk = q_BxKxGxTxE[:, :, :, start:end]
        k_pre, v_pre = k_BxKxTxE[:, :, :end], v_BxKxTxE[:, :, :end]
        d_out_blk = d_out[:, :, :, start:end]
        scores = _scores(q_blk, k_pre, _block_allowed(start, end, key_mask_BxT))
        probs = jnp.exp(scores - lse[:, :, :, start:end, None])
        dv = dv.at[:, :, :end].add(
            jnp.einsum(
                "bkgts,bkgte->bkse", probs.astype(d_out.dtype), d_out_blk, preferred_element_type=jnp.float32
            )
        )
        d_probs = jnp.einsum("bkgte,bkse->bkgts", d_out_blk, v_pre, preferred_element_type=jnp.float32)
        # d(loss)/d(unscaled q.k): the softmax backward times the score scale.
        d_scores = probs * (d_probs - delta[:, :, :, start:end]) * (q_blk.shape[-1] ** -0.5)
        dqs.append(
            jnp.einsum(
                "bkgts,bkse->bkgte", d_scores.astype(k_pre.dtype), k_pre, preferred_element_type=jnp.float32
            )
        )
        dk = dk.at[:, :, :end].add(
            jnp.einsum(
                "bkgts,bkgte->bkse", d_scores.astype(q_blk.dtype), q_blk, preferred_element_type=jnp.float32
            )
        )
    return jnp.concatenate(dqs, axis=3), dk, dv


def _split_rows(x: jax.Array, chunks: int) -> jax.Array:
    """[B, ...] -> [chunks, B / chunks, ...], chunk c holding rows c, c + chunks, ... (strided, so each
    chunk keeps rows on every device of a batch-sharded array)."""
    split = x.reshape(x.shape[0] // chunks, chunks, *x.shape[1:]).swapaxes(0, 1)
    return constrain(split, (None, "batch", *([None] * (x.ndim - 1))))


def _merge_rows(x: jax.Array) -> jax.Array:
    """Inverse of `_split_rows`."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _over_rows(fn, chunks: int, *arrays):
    """`fn(*arrays)` computed chunk by chunk over the leading (row) axis; outputs re-assembled."""
    if chunks == 1:
        return fn(*arrays)
    outs = jax.lax.map(lambda parts: fn(*parts), tuple(_split_rows(a, chunks) for a in arrays))
    return jax.tree.map(_merge_rows, outs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention_heads_first(q_BxKxGxTxE, k_BxKxTxE, v_BxKxTxE, key_mask_BxT, block_size, row_chunks):
    out, _ = _over_rows(
        functools.partial(_forward_rows, block_size=block_size),
        row_chunks,
        q_BxKxGxTxE,
        k_BxKxTxE,
        v_BxKxTxE,
        key_mask_BxT,
    )
    return out


def _attention_fwd(q, k, v, key_mask, block_size, row_chunks):
    out, lse = _over_rows(
        functools.partial(_forward_rows, block_size=block_size), row_chunks, q, k, v, key_mask
    )
    return out, (q, k, v, key_mask, out, lse)


def _attention_bwd(block_size, row_chunks, residuals, d_out):
    q, k, v, key_mask, out, lse = residuals
    dq, dk, dv = _over_rows(
        functools.partial(_backward_rows, block_size=block_size),
        row_chunks,
        q,
        k,
        v,
        key_mask,
        out,
        lse,
        d_out,
    )
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attention_heads_first.defvjp(_attention_fwd, _attention_bwd)


def causal_attention(
    q_BxTxHxE: jax.Array,
    k_BxKxTxE: jax.Array,
    v_BxKxTxE: jax.Array,
    key_mask_BxT: jax.Array,
    *,
    block_size: int = 128,
    row_chunks: int = 1,
) -> jax.Array:
    """Causal GQA attention over full sequences: query t sees keys s <= t whose `key_mask` is nonzero.

    Equals `kernels.xla.attend` with `allowed = tril & key_mask` (scores and softmax in float32, output in q's
    dtype). `row_chunks` must divide B; rows are processed in that many sequential chunks.
    """
    batch, length, num_heads, head_dim = q_BxTxHxE.shape
    num_kv_heads = k_BxKxTxE.shape[1]
    if batch % row_chunks:
        raise ValueError(f"row_chunks={row_chunks} does not divide the batch of {batch} rows")
    groups = num_heads // num_kv_heads
    q_BxKxGxTxE = q_BxTxHxE.reshape(batch, length, num_kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)
    out_BxKxGxTxE = _attention_heads_first(
        q_BxKxGxTxE, k_BxKxTxE, v_BxKxTxE, key_mask_BxT, block_size, row_chunks
    )
    out_BxTxHxE = out_BxKxGxTxE.transpose(0, 3, 1, 2, 4).reshape(batch, length, num_heads, head_dim)
    return out_BxTxHxE.astype(q_BxTxHxE.dtype)
