"""The gated delta rule: the recurrence of Qwen3.5's linear-attention layers (Gated DeltaNet).

Each value head keeps a state S [K, V]. At token t, with decay g_t <= 0 (log space) and write strength
beta_t in [0, 1],

    S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - S^T k_t))^T;   o_t = S^T q_t,

so the state forgets, then moves its read-out at k_t towards v_t (the delta rule). `recurrent_step` is one
token (decoding); `chunked` the same recurrence over a sequence in chunks of C tokens (the WY form of
Yang et al.): within a chunk the updates are a unit lower-triangular solve and a few products, and a
`lax.scan` carries S from chunk to chunk, so a pass costs T / C sequential steps instead of T. A token
with g = 0 and beta = 0 leaves S as it was (padding).

Queries and keys come L2-normalised, queries scaled by K ** -0.5 (`gated_delta_rule` does both). Everything
is computed in float32.

Shape legend: B batch, T length, H value heads, K key head_dim, V value head_dim, N chunks, C chunk length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

CHUNK = 64  # tokens per chunk of `chunked` (transformers' and the FLA kernels' default)


def l2_normalise(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum x^2 + eps) over the last axis (the FLA kernels' form, which transformers follows)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_delta_rule(q_BxTxHxK, k_BxTxHxK, v_BxTxHxV, g_BxTxH, beta_BxTxH, state_BxHxKxV):
    """(outputs [B, T, H, V], the final state [B, H, K, V]) of the recurrence from `state`, float32; q and k
    are normalised here (see the module docstring). One token takes `recurrent_step`, more `chunked`."""
    f32 = lambda x: x.astype(jnp.float32)
    q_BxTxHxK = l2_normalise(f32(q_BxTxHxK)) * (q_BxTxHxK.shape[-1] ** -0.5)
    k_BxTxHxK = l2_normalise(f32(k_BxTxHxK))
    args = (q_BxTxHxK, k_BxTxHxK, f32(v_BxTxHxV), f32(g_BxTxH), f32(beta_BxTxH), f32(state_BxHxKxV))
    if q_BxTxHxK.shape[1] == 1:
        out_BxHxV, state = recurrent_step(*(a[:, 0] for a in args[:5]), args[5])
        return out_BxHxV[:, None], state
    return chunked(*args)


def recurrent_step(q_BxHxK, k_BxHxK, v_BxHxV, g_BxH, beta_BxH, state_BxHxKxV):
    """(output [B, H, V], new state) of one token."""
    state_BxHxKxV = state_BxHxKxV * jnp.exp(g_BxH)[..., None, None]
    read_BxHxV = jnp.einsum("bhk,bhkv->bhv", k_BxHxK, state_BxHxKxV)
    delta_BxHxV = (v_BxHxV - read_BxHxV) * beta_BxH[..., None]
    state_BxHxKxV = state_BxHxKxV + k_BxHxK[..., :, None] * delta_BxHxV[..., None, :]
    return jnp.einsum("bhk,bhkv->bhv", q_BxHxK, state_BxHxKxV), state_BxHxKxV


def chunked(q_BxTxHxK, k_BxTxHxK, v_BxTxHxV, g_BxTxH, beta_BxTxH, state_BxHxKxV, chunk: int = CHUNK):
    """(outputs [B, T, H, V], final state) of the recurrence over T tokens, chunk by chunk (see the module
    docstring); T is padded to a multiple of the chunk with tokens that leave the state as it is."""
    length = q_BxTxHxK.shape[1]
    size = min(chunk, length)
    pad = -length % size

    def chunks(x):  # [B, T, H(, F)] -> [N, B, H, C(, F)], padded with zeros
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(x.shape[0], -1, size, *x.shape[2:])  # [B, N, C, H(, F)]
        return jnp.moveaxis(x, (1, 3), (0, 2))

    q, k, v = (chunks(x) for x in (q_BxTxHxK, k_BxTxHxK, v_BxTxHxV))
    g_NxBxHxC, beta_NxBxHxC = chunks(g_BxTxH), chunks(beta_BxTxH)
    cum_NxBxHxC = jnp.cumsum(g_NxBxHxC, axis=-1)  # log decay from the chunk's start to each token
    lower_CxC = jnp.tril(jnp.ones((size, size), bool))
    gap = cum_NxBxHxC[..., :, None] - cum_NxBxHxC[..., None, :]  # i, j: decay from token j to token i
    decay_NxBxHxCxC = jnp.where(lower_CxC, jnp.exp(jnp.where(lower_CxC, gap, 0.0)), 0.0)
    k_beta = k * beta_NxBxHxC[..., None]
    # The chunk's updates as a unit lower-triangular system (I + strict_lower(A)) X = [v beta, k beta e^cum].
    a_NxBxHxCxC = jnp.einsum("...ik,...jk->...ij", k_beta, k) * decay_NxBxHxCxC
    rhs = jnp.concatenate([v * beta_NxBxHxC[..., None], k_beta * jnp.exp(cum_NxBxHxC)[..., None]], axis=-1)
    solved = jax.lax.linalg.triangular_solve(a_NxBxHxCxC, rhs, left_side=True, lower=True, unit_diagonal=True)
    values_NxBxHxCxV, decayed_keys_NxBxHxCxK = jnp.split(solved, [v.shape[-1]], axis=-1)
    inner_NxBxHxCxC = jnp.einsum("...ik,...jk->...ij", q, k) * decay_NxBxHxCxC
    q_decayed = q * jnp.exp(cum_NxBxHxC)[..., None]
    k_to_end = k * jnp.exp(cum_NxBxHxC[..., -1:] - cum_NxBxHxC)[..., None]
    chunk_decay_NxBxH = jnp.exp(cum_NxBxHxC[..., -1])

    def step(state_BxHxKxV, xs):
        values, decayed_keys, q_dec, k_end, inner, chunk_decay = xs
        new_BxHxCxV = values - jnp.einsum("bhck,bhkv->bhcv", decayed_keys, state_BxHxKxV)
        out_BxHxCxV = jnp.einsum("bhck,bhkv->bhcv", q_dec, state_BxHxKxV) + inner @ new_BxHxCxV
        state_BxHxKxV = state_BxHxKxV * chunk_decay[..., None, None] + jnp.einsum(
            "bhck,bhcv->bhkv", k_end, new_BxHxCxV
        )
        return state_BxHxKxV, out_BxHxCxV

    xs = (values_NxBxHxCxV, decayed_keys_NxBxHxCxK, q_decayed, k_to_end, inner_NxBxHxCxC, chunk_decay_NxBxH)
    state_BxHxKxV, out_NxBxHxCxV = jax.lax.scan(step, state_BxHxKxV, xs)
    out_BxNxCxHxV = jnp.moveaxis(out_NxBxHxCxV, (0, 2), (1, 3))
    out_BxTxHxV = out_BxNxCxHxV.reshape(out_BxNxCxHxV.shape[0], -1, *out_BxNxCxHxV.shape[3:])
    return out_BxTxHxV[:, :length], state_BxHxKxV
