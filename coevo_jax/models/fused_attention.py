"""Causal grouped-query attention for full sequences through cuDNN's fused (flash) kernel, on NVIDIA GPUs.

cuDNN masks padding by a length per row, so it is exact only for rows whose key mask is a prefix (right
padding, as `data.batching` collates every training and scoring batch). The choice is made on the device:
a batch whose rows are all prefixes takes the fused kernel, any other (left padding, holes) the block-wise
`causal_attention`, through one `lax.cond`; a caller that collates right-padded rows only can say so
(`right_padded`, `ModelConfig.right_padded`) and skip the check. Either way query t sees keys s <= t whose
mask is nonzero, so
the result is `causal_attention`'s for every query that has such a key (a row with no key at all is padding
throughout: the fused path lets it attend its first key, the block-wise one all of them uniformly).

Shape legend: B batch, T length, H query heads, K key/value heads, E head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from coevo_jax.models.causal_attention import causal_attention
from coevo_jax.models.config import ATTENTION_CHOICES

_FUSED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def prefix_lengths(key_mask_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(keys per row int32 [B], whether every row's mask is a prefix: ones, then zeros)."""
    valid_BxT = key_mask_BxT != 0
    lengths_B = jnp.sum(valid_BxT, axis=-1, dtype=jnp.int32)
    prefix_BxT = jnp.arange(key_mask_BxT.shape[1])[None, :] < lengths_B[:, None]
    return lengths_B, jnp.all(valid_BxT == prefix_BxT)


def uses_fused(attention: str, dtype, head_dim: int, platform: str) -> bool:
    """Whether full-sequence passes take `fused_causal_attention` (`ModelConfig.attention`, resolved).

    'auto' picks it on a GPU platform when cuDNN's kernel takes the shapes (bf16/fp16 compute, head_dim a
    multiple of 8 up to 128; `kernels.resolve` has already made 'auto' 'blocked' on GPUs without cuDNN's
    flash attention); 'cudnn' always (and fails where cuDNN is missing); 'blocked' never.
    """
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention={attention!r} not in {ATTENTION_CHOICES}")
    if attention != "auto":
        return attention == "cudnn"
    fits = jnp.dtype(dtype) in _FUSED_DTYPES and head_dim % 8 == 0 and head_dim <= 128
    return fits and platform == "gpu"


def fused_causal_attention(
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    key_mask_BxT: jax.Array,
    *,
    implementation: str | None = "cudnn",
    right_padded: bool = False,
    **blocked_options,
) -> jax.Array:
    """`causal_attention(q, k, v, key_mask, **blocked_options)` through cuDNN when every row is a prefix.
    Keys and values come in cuDNN's [B, T, K, E] order (`causal_attention` takes them as [B, K, T, E]).

    `implementation` is `jax.nn.dot_product_attention`'s ('xla' computes the same masks without cuDNN:
    the CPU tests' stand-in). Output [B, T, H, E] in q's dtype. `right_padded`: the caller guarantees every
    row's key mask is a prefix, and cuDNN runs alone: no check, no fallback, and none of the layout copies
    XLA adds around a cond whose branches want their operands in different orders (SmolLM2's unrolled DPO
    step compiled for an H200: 130 -> 108 GB of memory-bound traffic, `bench/gpu_aot.py`). A mask that is
    not a prefix then attends as if it were one (its first `sum(mask)` keys).

    Under autodiff a `lax.cond` carries the residuals of both branches (`jax.lax.cond` merges only those of
    equal shape and dtype), so the block-wise fallback is rematerialised: its residuals are then its
    operands, which the fused branch keeps anyway. Otherwise every layer of every right-padded batch would
    write the block-wise kernel's masks, statistics and grouped queries as zeros for the backward pass (on an
    H200 this cut the copy kernels of SmolLM2's ~150 ms DPO step at 8 pairs from 17.5 to 10.3 ms).
    """
    lengths_B, all_prefixes = prefix_lengths(key_mask_BxT)

    def fused(q, k, v, _, lengths):
        out_BxTxHxE = jax.nn.dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            key_value_seq_lengths=jnp.maximum(lengths, 1),
            implementation=implementation,
        )
        return out_BxTxHxE.astype(q.dtype)

    @jax.checkpoint
    def blocked(q, k, v, key_mask, _):
        return causal_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), key_mask, **blocked_options)

    operands = (q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, key_mask_BxT, lengths_B)
    if right_padded:
        return fused(*operands)
    return jax.lax.cond(all_prefixes, fused, blocked, *operands)
