"""Sliding-window causal attention for full sequences (Gemma 4's sliding layers), block by block.

Query t attends key s when s <= t, t - s < window and the key's mask is set. Queries are cut into blocks of
`block_size`; a block scores only the keys its window can reach (`window - 1` before its first query to its
last), so a pass costs O(T * (window + block)) instead of O(T^2). Indices stand for positions: a row's
valid tokens are contiguous (left or right padding), so index and position differences agree.

Shape legend: B batch, T length, H query heads, K key/value heads, G = H // K, E head_dim, S keys of a block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.models.layers import MASKED_SCORE


def sliding_causal_attention(
    q_BxTxHxE: jax.Array,
    k_BxKxTxE: jax.Array,
    v_BxKxTxE: jax.Array,
    key_mask_BxT: jax.Array,
    window: int,
    *,
    block_size: int = 128,
) -> jax.Array:
    """Output [B, T, H, E] in q's dtype; scores scaled by E ** -0.5 and softmax in float32, as
    `causal_attention` (which this equals when `window` >= T)."""
    batch, length, heads, head_dim = q_BxTxHxE.shape
    kv_heads = k_BxKxTxE.shape[1]
    q_BxKxGxTxE = q_BxTxHxE.reshape(batch, length, kv_heads, heads // kv_heads, head_dim).transpose(
        0, 2, 3, 1, 4
    )
    outs = []
    for start in range(0, length, block_size):
        end = min(start + block_size, length)
        first = max(0, start - window + 1)
        query_T = np.arange(start, end)[:, None]
        key_S = np.arange(first, end)[None, :]
        allowed_TxS = jnp.asarray((key_S <= query_T) & (query_T - key_S < window))
        allowed = allowed_TxS[None, None, None] & (key_mask_BxT[:, None, None, None, first:end] > 0)
        scores = jnp.einsum(
            "bkgte,bkse->bkgts",
            q_BxKxGxTxE[:, :, :, start:end],
            k_BxKxTxE[:, :, first:end],
            preferred_element_type=jnp.float32,
        )
        scores = jnp.where(allowed, scores * (head_dim**-0.5), MASKED_SCORE)
        probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxTxE.dtype)
        outs.append(jnp.einsum("bkgts,bkse->bkgte", probs, v_BxKxTxE[:, :, first:end]))
    out_BxKxGxTxE = jnp.concatenate(outs, axis=3)
    out_BxTxHxE = out_BxKxGxTxE.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, head_dim)
    return out_BxTxHxE.astype(q_BxTxHxE.dtype)


def window_allowed(allowed_BxTxS: jax.Array, positions_BxT: jax.Array, window: int) -> jax.Array:
    """A cached chunk's allowed slots [B, T, S] narrowed to each query's window (slot s holds position s)."""
    slot_S = jnp.arange(allowed_BxTxS.shape[-1])
    return allowed_BxTxS & (slot_S[None, None, :] > positions_BxT[:, :, None] - window)
