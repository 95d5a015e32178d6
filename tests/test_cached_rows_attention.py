"""Prefill attention read row chunk by row chunk from the stacked KV cache, against a float64 reference; with
the CPU kernel off (XLA's path, as on accelerators and for bf16 caches) and on."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax.models import cpu_kernels
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
    limits = rng.integers(1, SLOTS + 1, (BATCH, LENGTH))  # every query sees a prefix of at least one slot
    allowed = np.arange(SLOTS) < limits[..., None]
    return q, keys, values, allowed


@pytest.mark.parametrize("row_chunks", [1, 2, 4])
@pytest.mark.parametrize("cache_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("kernels", ["0", "1"])
def test_each_row_chunk_attends_its_own_rows_of_the_chosen_layer(
    row_chunks, cache_dtype, kernels, monkeypatch
):
    monkeypatch.setenv("COEVO_JAX_CPU_KERNELS", kernels)
    q, keys, values, allowed = _inputs(fresh_seed())
    keys_c, values_c = jnp.asarray(keys, cache_dtype), jnp.asarray(values, cache_dtype)
    # the reference sees the cache as stored (bf16-rounded) and computes in float64
    stored_keys, stored_values = np.asarray(keys_c, np.float64), np.asarray(values_c, np.float64)
    # a fresh callable: jit would otherwise reuse a trace made under the other kernel setting
    run = jax.jit(functools.partial(attend_cached_rows), static_argnums=5)
    lowered = run.lower(
        jnp.asarray(q, jnp.float32), keys_c, values_c, jnp.int32(0), jnp.asarray(allowed), row_chunks
    )
    # the kernel path where it applies (it needs a C++ compiler to build; without one XLA's path runs)
    on_kernel = cpu_kernels.prefix_attention_applies(jnp.float32, cache_dtype, DIM)
    assert on_kernel == (kernels == "1" and cache_dtype == jnp.float32 and cpu_kernels._registered())
    assert (cpu_kernels.TARGET in lowered.as_text()) == on_kernel
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
