"""Token shift: each token's input embedding plus learned per-channel mixes of the previous N tokens' ones.

    x'_p = x_p + sum_{j=1..N} w_j * x_{p-j}        (p: the token's position; x_{p-j} = 0 before the start)

A small model trained from scratch must often answer "which room is the apple in?" from a sentence such as
"The apple is in the kitchen.": the room token has to know the noun four tokens before it, which plain
attention learns only as a two-layer circuit, late and unreliably (a sudden drop of the loss after a long
plateau, or none within the budget). With the last N tokens mixed into every input, one attention layer can
match it directly. This is RWKV's token shift / a depthwise causal convolution of width N + 1 over the
embeddings, as in the "canon layers" of Allen-Zhu's Physics of Language Models 4.1. The weights start at
zero, so a new model begins as the plain decoder; pretrained checkpoints have N = 0 and are unaffected.

Previous tokens are found by RoPE position, not by array index, so rows padded on either side, chunks with
padding between them and the KV cache (whose slot s holds position s, with the token ids kept beside the
keys) all agree with one full pass.

Shape legend: B batch, T length, S cache slots, D hidden, N shift width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def index_of_position(positions_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """int32 [B, T]: entry [b, p] is the column of row b's real token at position p (T where none)."""
    batch, length = positions_BxT.shape
    columns_BxT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    targets_BxT = jnp.where(mask_BxT > 0, positions_BxT, length)  # padding: out of range, dropped
    rows_Bx1 = jnp.arange(batch)[:, None]
    empty = jnp.full((batch, length), length, jnp.int32)
    return empty.at[rows_Bx1, targets_BxT].set(columns_BxT, mode="drop")


def shift_full(x_BxTxD, positions_BxT, mask_BxT, weights_NxD) -> jax.Array:
    """Token shift over a whole sequence (training, scoring): previous tokens are those of the same row."""
    width = weights_NxD.shape[0]
    index_BxT = index_of_position(positions_BxT, mask_BxT)
    length = x_BxTxD.shape[1]
    out_BxTxD = x_BxTxD
    for j in range(1, width + 1):
        previous_BxT = positions_BxT - j
        column_BxT = jnp.take_along_axis(index_BxT, jnp.clip(previous_BxT, 0, length - 1), axis=1)
        valid_BxT = (previous_BxT >= 0) & (column_BxT < length) & (mask_BxT > 0)
        gathered_BxTxD = jnp.take_along_axis(x_BxTxD, jnp.minimum(column_BxT, length - 1)[..., None], axis=1)
        out_BxTxD = out_BxTxD + jnp.where(valid_BxT[..., None], gathered_BxTxD * weights_NxD[j - 1], 0)
    return out_BxTxD


def write_ids(ids_BxS, slots_BxT, input_ids_BxT) -> jax.Array:
    """The cache's token ids with a chunk's tokens written into their slots (padding slots are dropped)."""
    rows_Bx1 = jnp.arange(ids_BxS.shape[0])[:, None]
    return ids_BxS.at[rows_Bx1, slots_BxT].set(input_ids_BxT.astype(ids_BxS.dtype), mode="drop")


def shift_cached(x_BxTxD, ids_BxS, positions_BxT, mask_BxT, weights_NxD, embed) -> jax.Array:
    """Token shift for a chunk appended to the cache; `ids_BxS` already holds the chunk's own ids."""
    width, capacity = weights_NxD.shape[0], ids_BxS.shape[1]
    out_BxTxD = x_BxTxD
    for j in range(1, width + 1):
        previous_BxT = positions_BxT - j
        ids_BxT = jnp.take_along_axis(ids_BxS, jnp.clip(previous_BxT, 0, capacity - 1), axis=1)
        valid_BxT = (previous_BxT >= 0) & (mask_BxT > 0)
        out_BxTxD = out_BxTxD + jnp.where(valid_BxT[..., None], embed(ids_BxT) * weights_NxD[j - 1], 0)
    return out_BxTxD
