"""Attention over the stacked KV cache (`attend_cache`), row chunk by row chunk, against a float64 reference;
in XLA's kernel set (as on accelerators, and for bf16 caches everywhere) and in the CPU set."""

from __future__ import annotations

import functools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax.models.kernels import CpuKernels, XlaKernels, cpu_ffi

KERNEL_SETS = {"xla": XlaKernels("cpu"), "cpu": CpuKernels()}
NO_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is None

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
@pytest.mark.parametrize("kernels", ["xla", "cpu"])
def test_each_row_chunk_attends_its_own_rows_of_the_chosen_layer(row_chunks, cache_dtype, kernels):
    if kernels == "cpu" and NO_COMPILER:
        pytest.skip("no C++ compiler to build the CPU kernels")
    q, keys, values, allowed = _inputs(fresh_seed())
    keys_c, values_c = jnp.asarray(keys, cache_dtype), jnp.asarray(values, cache_dtype)
    # the reference sees the cache as stored (bf16-rounded) and computes in float64
    stored_keys, stored_values = np.asarray(keys_c, np.float64), np.asarray(values_c, np.float64)
    run = jax.jit(functools.partial(KERNEL_SETS[kernels].attend_cache), static_argnums=5)
    lowered = run.lower(
        jnp.asarray(q, jnp.float32), keys_c, values_c, jnp.int32(0), jnp.asarray(allowed), row_chunks
    )
    # the CPU set's kernel where it serves: a float32 cache
    on_kernel = KERNEL_SETS[kernels].reads_cache_in_place(jnp.float32, cache_dtype, DIM)
    assert on_kernel == (kernels == "cpu" and cache_dtype == jnp.float32)
    assert (cpu_ffi.TARGET in lowered.as_text()) == on_kernel
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
        XlaKernels("cpu").attend_cache(
            jnp.asarray(q), jnp.asarray(keys), jnp.asarray(values), 0, jnp.asarray(allowed), 3
        )
