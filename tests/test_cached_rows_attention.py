"""Prefill attention read row chunk by row chunk from the stacked KV cache, against a float64 reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax.models.layers import attend_cached_rows

LAYERS, BATCH, KV_HEADS, GROUPS, DIM, LENGTH, SLOTS = 3, 4, 2, 2, 8, 5, 11


def _reference(q, keys, values, layer, allowed):
    """float64 attention of q [B, T, H, E] over layer `layer`'s keys [B, K, E, S] and values [B, K, S, E]."""
    out = np.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            scores = q[b, :, h] @ keys[layer, b, h // GROUPS] / np.sqrt(DIM)
            scores = np.where(allowed[b], scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[b, :, h] = (probs / probs.sum(-1, keepdims=True)) @ values[layer, b, h // GROUPS]
    return out


def _inputs(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((BATCH, LENGTH, KV_HEADS * GROUPS, DIM))
    keys = rng.standard_normal((LAYERS, BATCH, KV_HEADS, DIM, SLOTS))
    values = rng.standard_normal((LAYERS, BATCH, KV_HEADS, SLOTS, DIM))
    allowed = rng.random((BATCH, LENGTH, SLOTS)) < 0.6
    allowed[..., 0] = True  # every query sees at least one slot
    return q, keys, values, allowed


@pytest.mark.parametrize("row_chunks", [1, 2, 4])
@pytest.mark.parametrize("cache_dtype", [jnp.float32, jnp.bfloat16])
def test_each_row_chunk_attends_its_own_rows_of_the_chosen_layer(row_chunks, cache_dtype):
    q, keys, values, allowed = _inputs(fresh_seed())
    keys_c, values_c = jnp.asarray(keys, cache_dtype), jnp.asarray(values, cache_dtype)
    # the reference sees the cache as stored (bf16-rounded) and computes in float64
    stored_keys, stored_values = np.asarray(keys_c, np.float64), np.asarray(values_c, np.float64)
    run = jax.jit(attend_cached_rows, static_argnums=5)
    for layer in range(LAYERS):
        got = run(
            jnp.asarray(q, jnp.float32), keys_c, values_c, jnp.int32(layer), jnp.asarray(allowed), row_chunks
        )
        assert got.dtype == jnp.float32
        expected = _reference(q, stored_keys, stored_values, layer, allowed)
        np.testing.assert_allclose(np.asarray(got), expected, atol=2e-5, rtol=2e-5)


def test_row_chunks_must_divide_the_batch():
    q, keys, values, allowed = _inputs(0)
    with pytest.raises(ValueError, match="row_chunks=3"):
        attend_cached_rows(jnp.asarray(q), jnp.asarray(keys), jnp.asarray(values), 0, jnp.asarray(allowed), 3)
