"""The decoder's pre-norm block: grouped-query attention with RoPE, then a SwiGLU MLP.

Attention has three paths, by what it attends: a full sequence (training, scoring) causally, block-wise
(`causal_attention`) or through cuDNN's fused kernel (`fused_attention`, `ModelConfig.attention`); a fresh
chunk written to an empty cache, causally on its own; and a chunk against the slots already cached (a
prefill after earlier turns, a decode step), through the kernel set's `attend_cache`. Every projection goes
through `dense` with the block's kernel set (`kernels.kernel_set`).

With `ModelConfig.lora_rank` > 0 the target projections carry LoRA adapters (`coevo_jax.models.lora`), each
adding its term to its projection's output.

Shape legend: B batch, T length, S cache slots, L layers, D hidden_size, F intermediate_size, H query heads,
K key/value heads, E head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from coevo_jax.models.causal_attention import causal_attention
from coevo_jax.models.config import ModelConfig
from coevo_jax.models.dense import dense
from coevo_jax.models.fused_attention import fused_causal_attention, uses_fused
from coevo_jax.models.kernels import kernel_set
from coevo_jax.models.kv_cache import write_keys, write_values
from coevo_jax.models.layers import RMSNorm, apply_rope, constrain, normal, param, rope_inverse_frequencies

# `jax.nn.dot_product_attention`'s implementation behind `ModelConfig.attention` = 'cudnn' (the tests run
# the same dispatch on the CPU with 'xla').
_FUSED_IMPLEMENTATION = "cudnn"
# Cached chunks of at least this many tokens attend in chunks of rows (`XlaKernels.causal_plan`): on the CPU
# 1.6-1.9x faster for a 256-token chunk against 1,024-1,280 slots; 32-token chunks 1.1-1.4x (anchor) and
# 1.0-1.2x (SmolLM2) at 512-2,048 slots; no gain at 16 (bench/README.md).
_ROWS_MAPPED_FROM = 32


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; optionally reads and writes one layer of a KV cache."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, h, k, e, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_dtype
        self.q_kernel = param(normal(rngs, (d, h, e), pd), ("embed", "q_heads", "head_dim"))
        self.k_kernel = param(normal(rngs, (d, k, e), pd), ("embed", "kv_heads", "head_dim"))
        self.v_kernel = param(normal(rngs, (d, k, e), pd), ("embed", "kv_heads", "head_dim"))
        self.o_kernel = param(normal(rngs, (h, e, d), pd), ("q_heads", "head_dim", "embed"))
        qkv_bias = cfg.attention_bias
        self.q_bias = param(jnp.zeros((h, e), pd), ("q_heads", "head_dim")) if qkv_bias else None
        self.k_bias = param(jnp.zeros((k, e), pd), ("kv_heads", "head_dim")) if qkv_bias else None
        self.v_bias = param(jnp.zeros((k, e), pd), ("kv_heads", "head_dim")) if qkv_bias else None
        self.o_bias = param(jnp.zeros((d,), pd), ("embed",)) if cfg.attention_out_bias else None
        norm = lambda: RMSNorm(e, cfg.rms_norm_eps, dtype=cfg.dtype, param_dtype=pd)
        self.q_norm = norm() if cfg.qk_norm else None
        self.k_norm = norm() if cfg.qk_norm else None
        self.q_lora = self.k_lora = self.v_lora = self.o_lora = None  # set by `lora.add_adapters`
        self.config = cfg  # static (hashable); RoPE frequencies are derived from it at trace time
        self.dtype = cfg.dtype
        self.kernels = kernel_set(cfg)

    def _project(self, x_BxTxD, kernel, bias, norm, positions_BxT, adapter, dropout_key):
        d, n, e = kernel.shape
        y_BxTxNE = dense(x_BxTxD, kernel[...].reshape(d, n * e), self.kernels)
        if adapter is not None:
            y_BxTxNE = y_BxTxNE + adapter(x_BxTxD, dropout_key)
        y_BxTxNxE = y_BxTxNE.reshape(*x_BxTxD.shape[:-1], n, e)
        if bias is not None:
            y_BxTxNxE = y_BxTxNxE + bias[...].astype(self.dtype)
        if norm is not None:
            y_BxTxNxE = norm(y_BxTxNxE)
        return (
            y_BxTxNxE
            if positions_BxT is None
            else apply_rope(y_BxTxNxE, positions_BxT, rope_inverse_frequencies(self.config))
        )

    def __call__(self, x_BxTxD, positions_BxT, mask, layer_cache=None, slots_BxT=None, dropout_key=None):
        """Returns (output [B,T,D], the cache's (keys, values) with this layer's chunk written, or None).

        `mask` is the key mask [B, T] of a full causal pass (no cache), or with a cache the
        [B, T, S] matrix of the slots each query may attend; `layer_cache` is (keys, values, layer): the
        whole cache's [L, B, K, E, S] keys and [L, B, K, S, E] values, and this layer's index in them. A
        cache with a [B, T] key mask is a fresh chunk (every row's cache empty): it attends only itself, on
        the causal block path, which never scores the upper triangle nor the empty slots beyond the chunk.
        """
        q_BxTxHxE = self._project(
            x_BxTxD, self.q_kernel, self.q_bias, self.q_norm, positions_BxT, self.q_lora, dropout_key
        )
        k_BxTxKxE = self._project(
            x_BxTxD, self.k_kernel, self.k_bias, self.k_norm, positions_BxT, self.k_lora, dropout_key
        )
        v_BxTxKxE = self._project(x_BxTxD, self.v_kernel, self.v_bias, None, None, self.v_lora, dropout_key)
        q_BxTxHxE = constrain(q_BxTxHxE, ("batch", "length", "heads", "head_dim"))
        k_BxKxTxE, v_BxKxTxE = k_BxTxKxE.transpose(0, 2, 1, 3), v_BxTxKxE.transpose(0, 2, 1, 3)
        new_cache = None
        fresh = layer_cache is not None and mask.ndim == 2
        if layer_cache is not None:
            keys_LxBxKxExS, values_LxBxKxSxE, layer = layer_cache
            keys_LxBxKxExS = write_keys(keys_LxBxKxExS, layer, slots_BxT, k_BxKxTxE)
            values_LxBxKxSxE = write_values(values_LxBxKxSxE, layer, slots_BxT, v_BxKxTxE)
            new_cache = (keys_LxBxKxExS, values_LxBxKxSxE)
            if fresh:  # attend the chunk's keys as the cache holds them (its dtype), without reading it back
                cache_dtype = keys_LxBxKxExS.dtype
                k_BxKxTxE = k_BxKxTxE.astype(cache_dtype).astype(self.dtype)
                v_BxKxTxE = v_BxKxTxE.astype(cache_dtype).astype(self.dtype)
        plan = self.kernels.causal_plan(mask.shape[0])
        cfg = self.config
        if layer_cache is None and uses_fused(cfg.attention, self.dtype, q_BxTxHxE.shape[-1], cfg.platform):
            out_BxTxHxE = fused_causal_attention(
                q_BxTxHxE,
                k_BxTxKxE,
                v_BxTxKxE,
                mask,
                implementation=_FUSED_IMPLEMENTATION,
                right_padded=cfg.right_padded,
                **plan,
            )
        elif layer_cache is None or fresh:
            out_BxTxHxE = causal_attention(q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, mask, **plan)
        else:  # the cached slots: a long prefill chunk in chunks of rows, anything shorter (decode) at once
            row_chunks = plan["row_chunks"] if q_BxTxHxE.shape[1] >= _ROWS_MAPPED_FROM else 1
            out_BxTxHxE = self.kernels.attend_cache(q_BxTxHxE, *new_cache, layer, mask, row_chunks)
        h, e, d = self.o_kernel.shape
        out_BxTxHE = out_BxTxHxE.reshape(*out_BxTxHxE.shape[:-2], h * e)
        out_BxTxD = dense(out_BxTxHE, self.o_kernel[...].reshape(h * e, d), self.kernels)
        if self.o_lora is not None:
            out_BxTxD = out_BxTxD + self.o_lora(out_BxTxHE, dropout_key)
        if self.o_bias is not None:
            out_BxTxD = out_BxTxD + self.o_bias[...].astype(self.dtype)
        return out_BxTxD, new_cache


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
        self.gate_kernel = param(normal(rngs, (d, f), pd), ("embed", "mlp"))
        self.up_kernel = param(normal(rngs, (d, f), pd), ("embed", "mlp"))
        self.down_kernel = param(normal(rngs, (f, d), pd), ("mlp", "embed"))
        bias = cfg.mlp_bias
        self.gate_bias = param(jnp.zeros((f,), pd), ("mlp",)) if bias else None
        self.up_bias = param(jnp.zeros((f,), pd), ("mlp",)) if bias else None
        self.down_bias = param(jnp.zeros((d,), pd), ("embed",)) if bias else None
        self.gate_lora = self.up_lora = self.down_lora = None  # set by `lora.add_adapters`
        self.dtype = cfg.dtype
        self.kernels = kernel_set(cfg)

    def _dense(self, x, kernel, bias, adapter, dropout_key):
        y = dense(x, kernel[...], self.kernels)
        if adapter is not None:
            y = y + adapter(x, dropout_key)
        return y if bias is None else y + bias[...].astype(self.dtype)

    def __call__(self, x_BxTxD, dropout_key=None):
        gate_BxTxF = self._dense(x_BxTxD, self.gate_kernel, self.gate_bias, self.gate_lora, dropout_key)
        up_BxTxF = self._dense(x_BxTxD, self.up_kernel, self.up_bias, self.up_lora, dropout_key)
        hidden_BxTxF = constrain(jax.nn.silu(gate_BxTxF) * up_BxTxF, ("batch", "length", "mlp"))
        return self._dense(hidden_BxTxF, self.down_kernel, self.down_bias, self.down_lora, dropout_key)


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        norm = lambda: RMSNorm(
            cfg.hidden_size, cfg.rms_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype
        )
        self.input_norm = norm()
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = norm()
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x_BxTxD, positions_BxT, mask, layer_cache=None, slots_BxT=None, dropout_key=None):
        attn_BxTxD, new_cache = self.attn(
            self.input_norm(x_BxTxD), positions_BxT, mask, layer_cache, slots_BxT, dropout_key
        )
        x_BxTxD = x_BxTxD + attn_BxTxD
        x_BxTxD = x_BxTxD + self.mlp(self.post_attn_norm(x_BxTxD), dropout_key)
        return constrain(x_BxTxD, ("batch", "length", "embed")), new_cache
