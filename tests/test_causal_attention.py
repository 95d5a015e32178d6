"""Block-wise causal attention (custom VJP) against a float64 NumPy reference: outputs and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax.models.causal_attention import causal_attention
from coevo_jax.models.kernels.xla import attend


def _reference(q, k, v, key_mask):
    """float64 softmax attention: query t sees keys s <= t with key_mask[s] = 1 (GQA: head h uses h // G)."""
    batch, length, heads, dim = q.shape
    groups = heads // k.shape[1]
    out = np.zeros_like(q)
    allowed = np.tril(np.ones((length, length), bool))[None] & (key_mask[:, None, :] > 0)
    for b in range(batch):
        for h in range(heads):
            scores = q[b, :, h] @ k[b, h // groups].T / np.sqrt(dim)
            scores = np.where(allowed[b], scores, -np.inf)
            seen = allowed[b].any(-1)  # a left-padded query sees no key: its output is left at 0
            probs = np.exp(scores[seen] - scores[seen].max(-1, keepdims=True))
            out[b, seen, h] = (probs / probs.sum(-1, keepdims=True)) @ v[b, h // groups]
    return out


def _inputs(seed, batch=4, length=13, heads=4, kv_heads=2, dim=8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, length, heads, dim))
    k = rng.standard_normal((batch, kv_heads, length, dim))
    v = rng.standard_normal((batch, kv_heads, length, dim))
    key_mask = np.ones((batch, length), np.int32)
    key_mask[1, -4:] = 0  # right padding
    key_mask[2, :3] = 0  # left padding
    return q, k, v, key_mask


def _real_queries(key_mask):
    """Queries whose own key is real: only they carry loss (padded queries' outputs are don't-care)."""
    return key_mask[:, :, None, None].astype(np.float64)


@pytest.mark.parametrize(("block_size", "row_chunks"), [(4, 1), (5, 2), (16, 4), (1, 1)])
def test_outputs_and_gradients_match_float64_reference(block_size, row_chunks):
    seed = fresh_seed()
    q, k, v, key_mask = _inputs(seed)
    weights = np.random.default_rng(seed + 1).standard_normal(q.shape) * _real_queries(key_mask)

    def loss(fn):
        def total(q, k, v):
            return jnp.sum(fn(q, k, v) * weights.astype(np.float32))

        return jax.value_and_grad(total, argnums=(0, 1, 2))

    attention = lambda q, k, v: causal_attention(
        q, k, v, key_mask, block_size=block_size, row_chunks=row_chunks
    )
    f32 = lambda x: x.astype(np.float32)
    out = np.asarray(attention(f32(q), f32(k), f32(v)))
    expected = _reference(q, k, v, key_mask)
    real = _real_queries(key_mask) > 0
    np.testing.assert_allclose(
        np.where(real, out, 0), np.where(real, expected, 0), atol=2e-5, err_msg=f"seed={seed}"
    )

    _, grads = loss(attention)(f32(q), f32(k), f32(v))
    # float64 reference gradients by central differences of the reference along random directions.
    rng = np.random.default_rng(seed + 2)
    total64 = lambda q_, k_, v_: float(np.sum(_reference(q_, k_, v_, key_mask) * weights))
    for index, grad in enumerate(grads):
        direction = rng.standard_normal(grad.shape)
        args = [q, k, v]
        eps = 1e-5
        plus = [a + eps * direction if i == index else a for i, a in enumerate(args)]
        minus = [a - eps * direction if i == index else a for i, a in enumerate(args)]
        numeric = (total64(*plus) - total64(*minus)) / (2 * eps)
        analytic = float(np.sum(np.asarray(grad, np.float64) * direction))
        assert abs(numeric - analytic) <= 1e-4 * max(1.0, abs(numeric)), (index, numeric, analytic, seed)


def test_matches_the_dense_path_in_bfloat16():
    q, k, v, key_mask = _inputs(3)
    bf = lambda x: jnp.asarray(x, jnp.bfloat16)
    length = q.shape[1]
    allowed = jnp.tril(jnp.ones((length, length), bool))[None] & (jnp.asarray(key_mask)[:, None, :] > 0)
    keys_as_cached = bf(k).swapaxes(-1, -2)  # [B, K, E, S]
    dense = attend(bf(q), keys_as_cached, bf(v), allowed).astype(np.float32)
    blocked = causal_attention(bf(q), bf(k), bf(v), key_mask, block_size=4, row_chunks=2).astype(np.float32)
    assert blocked.dtype == np.float32
    real = _real_queries(key_mask) > 0
    np.testing.assert_allclose(np.where(real, blocked, 0), np.where(real, dense, 0), atol=2e-2)


def test_row_chunks_must_divide_the_batch():
    q, k, v, key_mask = _inputs(0)
    with pytest.raises(ValueError, match="row_chunks=3"):
        causal_attention(q, k, v, key_mask, row_chunks=3)
