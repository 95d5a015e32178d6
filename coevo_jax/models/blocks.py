"""The decoder's pre-norm block: grouped-query attention with RoPE, then a SwiGLU MLP.

Attention has three paths, by what it attends: a full sequence (training, scoring) causally, block-wise
(`causal_attention`) or through cuDNN's fused kernel (`fused_attention`, `ModelConfig.attention`); a fresh
chunk written to an empty cache, causally on its own; and a chunk against the slots already cached (a
prefill after earlier turns, a decode step), through the kernel set's `attend_cache` (a sliding window's
slots, which are no prefix, through its `attend_slots`). Every projection goes through `dense` with the
block's kernel set (`kernels.kernel_set`).

With `ModelConfig.lora_rank` > 0 the target projections carry LoRA adapters (`coevo_jax.models.lora`), each
adding its term to its projection's output.

A block is built from one kind of layer's config (`ModelConfig.kind_config`): a sliding layer attends a
window (`window_attention`); a layer sharing keys and values (`ModelConfig.shares_kv`) has no key / value
projections and attends another layer's, handed to it; the Gemma options (value norm, query scale, sandwich
norms, a layer scalar, GELU) are flags of the same block.

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
from coevo_jax.models.layers import RMSNorm, constrain, normal, param, rotate, unit_rms_norm
from coevo_jax.models.linear_attention import LinearAttention
from coevo_jax.models.window_attention import sliding_causal_attention, window_allowed

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
        own_k = not cfg.shares_kv  # a KV-sharing layer attends another layer's keys and values
        own_v = own_k and not cfg.attention_k_eq_v  # keys-as-values: the key projection serves both
        q_width = 2 * e if cfg.attention_output_gate else e  # each head's query, then its output gate
        self.q_kernel = param(normal(rngs, (d, h, q_width), pd), ("embed", "q_heads", "head_dim"))
        self.k_kernel = (
            param(normal(rngs, (d, k, e), pd), ("embed", "kv_heads", "head_dim")) if own_k else None
        )
        self.v_kernel = (
            param(normal(rngs, (d, k, e), pd), ("embed", "kv_heads", "head_dim")) if own_v else None
        )
        self.o_kernel = param(normal(rngs, (h, e, d), pd), ("q_heads", "head_dim", "embed"))
        qkv_bias = cfg.attention_bias
        self.q_bias = param(jnp.zeros((h, q_width), pd), ("q_heads", "head_dim")) if qkv_bias else None
        self.k_bias = param(jnp.zeros((k, e), pd), ("kv_heads", "head_dim")) if qkv_bias and own_k else None
        self.v_bias = param(jnp.zeros((k, e), pd), ("kv_heads", "head_dim")) if qkv_bias and own_v else None
        self.o_bias = param(jnp.zeros((d,), pd), ("embed",)) if cfg.attention_out_bias else None
        norm = lambda: RMSNorm(
            e, cfg.rms_norm_eps, dtype=cfg.dtype, param_dtype=pd, zero_centered=cfg.zero_centered_norm
        )
        self.q_norm = norm() if cfg.qk_norm else None
        self.k_norm = norm() if cfg.qk_norm and own_k else None
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
        return y_BxTxNxE if positions_BxT is None else rotate(y_BxTxNxE, positions_BxT, self.config)

    def _queries(self, x_BxTxD, positions_BxT, dropout_key):
        """(queries [B, T, H, E] normed and turned, the output gate's logits [B, T, H, E] or None)."""
        if not self.config.attention_output_gate:
            q = self._project(
                x_BxTxD, self.q_kernel, self.q_bias, self.q_norm, positions_BxT, self.q_lora, dropout_key
            )
            return q, None
        both = self._project(x_BxTxD, self.q_kernel, self.q_bias, None, None, self.q_lora, dropout_key)
        q_BxTxHxE, gate_BxTxHxE = jnp.split(both, 2, axis=-1)
        if self.q_norm is not None:
            q_BxTxHxE = self.q_norm(q_BxTxHxE)
        return rotate(q_BxTxHxE, positions_BxT, self.config), gate_BxTxHxE

    def _keys_values(self, x_BxTxD, positions_BxT, dropout_key):
        """This layer's keys and values [B, K, T, E] (RoPE on the keys; values normed with `value_norm`)."""
        k_BxTxKxE = self._project(
            x_BxTxD, self.k_kernel, self.k_bias, self.k_norm, positions_BxT, self.k_lora, dropout_key
        )
        if self.v_kernel is None:  # keys-as-values: the key projection before its norm and RoPE
            v_BxTxKxE = self._project(
                x_BxTxD, self.k_kernel, self.k_bias, None, None, self.k_lora, dropout_key
            )
        else:
            v_BxTxKxE = self._project(
                x_BxTxD, self.v_kernel, self.v_bias, None, None, self.v_lora, dropout_key
            )
        if self.config.value_norm:
            v_BxTxKxE = unit_rms_norm(v_BxTxKxE, self.config.rms_norm_eps)
        return k_BxTxKxE.transpose(0, 2, 1, 3), v_BxTxKxE.transpose(0, 2, 1, 3)

    def __call__(
        self, x_BxTxD, positions_BxT, mask, layer_cache=None, slots_BxT=None, dropout_key=None, shared_kv=None
    ):
        """Returns (output [B,T,D], the cache's (keys, values) with this layer's chunk written, or None,
        this chunk's (keys, values) [B, K, T, E] as attended).

        `mask` is the key mask [B, T] of a full causal pass (no cache), or with a cache the
        [B, T, S] matrix of the slots each query may attend; `layer_cache` is (keys, values, layer): the
        whole cache's [L, B, K, E, S] keys and [L, B, K, S, E] values, and this layer's index in them. A
        cache with a [B, T] key mask is a fresh chunk (every row's cache empty): it attends only itself, on
        the causal block path, which never scores the upper triangle nor the empty slots beyond the chunk.
        A KV-sharing layer takes `shared_kv`, the chunk's (keys, values) of the layer it shares, and with a
        cache that layer's slots as `layer_cache`, which it reads and does not write.
        """
        q_BxTxHxE, gate_BxTxHxE = self._queries(x_BxTxD, positions_BxT, dropout_key)
        cfg = self.config
        if cfg.query_scale is not None:  # the attention kernels scale by E ** -0.5: undo it, apply ours
            q_BxTxHxE = q_BxTxHxE * jnp.asarray(cfg.query_scale * q_BxTxHxE.shape[-1] ** 0.5, self.dtype)
        q_BxTxHxE = constrain(q_BxTxHxE, ("batch", "length", "heads", "head_dim"))
        fresh = layer_cache is not None and mask.ndim == 2
        if cfg.sliding_window and layer_cache is not None and not fresh:
            mask = window_allowed(mask, positions_BxT, cfg.sliding_window)
        if cfg.shares_kv:
            k_BxKxTxE, v_BxKxTxE = shared_kv
            new_cache = None if layer_cache is None else layer_cache[:2]
            out_BxTxHxE = self._attend(q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, mask, layer_cache, new_cache, fresh)
            return self._output(out_BxTxHxE, gate_BxTxHxE, dropout_key), None, shared_kv
        k_BxKxTxE, v_BxKxTxE = self._keys_values(x_BxTxD, positions_BxT, dropout_key)
        new_cache = None
        if layer_cache is not None:
            keys_LxBxKxExS, values_LxBxKxSxE, layer = layer_cache
            keys_LxBxKxExS = write_keys(keys_LxBxKxExS, layer, slots_BxT, k_BxKxTxE)
            values_LxBxKxSxE = write_values(values_LxBxKxSxE, layer, slots_BxT, v_BxKxTxE)
            new_cache = (keys_LxBxKxExS, values_LxBxKxSxE)
            if fresh:  # attend the chunk's keys as the cache holds them (its dtype), without reading it back
                cache_dtype = keys_LxBxKxExS.dtype
                k_BxKxTxE = k_BxKxTxE.astype(cache_dtype).astype(self.dtype)
                v_BxKxTxE = v_BxKxTxE.astype(cache_dtype).astype(self.dtype)
        out_BxTxHxE = self._attend(q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, mask, layer_cache, new_cache, fresh)
        return self._output(out_BxTxHxE, gate_BxTxHxE, dropout_key), new_cache, (k_BxKxTxE, v_BxKxTxE)

    def _attend(self, q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, mask, layer_cache, new_cache, fresh):
        """Attention output [B, T, H, E] on the path the call takes (see `__call__`)."""
        plan = self.kernels.causal_plan(mask.shape[0])
        cfg = self.config
        if cfg.sliding_window and (layer_cache is None or fresh):
            out_BxTxHxE = sliding_causal_attention(q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, mask, cfg.sliding_window)
        elif layer_cache is None and uses_fused(cfg.attention, self.dtype, q_BxTxHxE.shape[-1], cfg.platform):
            k_BxTxKxE, v_BxTxKxE = k_BxKxTxE.transpose(0, 2, 1, 3), v_BxKxTxE.transpose(0, 2, 1, 3)
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
        elif cfg.sliding_window:  # a window is no prefix of the slots, which `attend_cache` may assume
            out_BxTxHxE = self.kernels.attend_slots(q_BxTxHxE, *new_cache, layer_cache[2], mask)
        else:  # the cached slots: a long prefill chunk in chunks of rows, anything shorter (decode) at once
            row_chunks = plan["row_chunks"] if q_BxTxHxE.shape[1] >= _ROWS_MAPPED_FROM else 1
            out_BxTxHxE = self.kernels.attend_cache(q_BxTxHxE, *new_cache, layer_cache[2], mask, row_chunks)
        return out_BxTxHxE

    def _output(self, out_BxTxHxE, gate_BxTxHxE, dropout_key):
        """The output projection [B, T, D] of the attention output (times sigmoid of the gate, if any)."""
        if gate_BxTxHxE is not None:
            out_BxTxHxE = out_BxTxHxE * jax.nn.sigmoid(gate_BxTxHxE)
        h, e, d = self.o_kernel.shape
        out_BxTxHE = out_BxTxHxE.reshape(*out_BxTxHxE.shape[:-2], h * e)
        out_BxTxD = dense(out_BxTxHE, self.o_kernel[...].reshape(h * e, d), self.kernels)
        if self.o_lora is not None:
            out_BxTxD = out_BxTxD + self.o_lora(out_BxTxHE, dropout_key)
        if self.o_bias is not None:
            out_BxTxD = out_BxTxD + self.o_bias[...].astype(self.dtype)
        return out_BxTxD


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
        self.activation = jax.nn.silu if cfg.hidden_act == "silu" else _gelu_tanh
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
        hidden_BxTxF = constrain(self.activation(gate_BxTxF) * up_BxTxF, ("batch", "length", "mlp"))
        return self._dense(hidden_BxTxF, self.down_kernel, self.down_bias, self.down_lora, dropout_key)


def _gelu_tanh(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x)); with `sandwich_norm` each branch's
    output is normed too, with `layer_scalar` the block's output scaled by a learned scalar."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        norm = lambda: RMSNorm(
            cfg.hidden_size,
            cfg.rms_norm_eps,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            zero_centered=cfg.zero_centered_norm,
        )
        self.input_norm = norm()
        linear = cfg.block_kind == "linear_attention"
        self.attn = LinearAttention(cfg, rngs=rngs) if linear else Attention(cfg, rngs=rngs)
        self.post_attn_norm = norm()
        self.mlp = MLP(cfg, rngs=rngs)
        self.attn_out_norm = norm() if cfg.sandwich_norm else None
        self.mlp_out_norm = norm() if cfg.sandwich_norm else None
        self.scalar = param(jnp.ones((1,), cfg.param_dtype), ("norm",)) if cfg.layer_scalar else None

    def __call__(
        self,
        x_BxTxD,
        positions_BxT,
        mask,
        layer_cache=None,
        slots_BxT=None,
        dropout_key=None,
        shared_kv=None,
        *,
        return_kv: bool = False,
    ):
        """(output [B, T, D], the cache's (keys, values) after this layer, or None); with `return_kv` also
        the chunk's (keys, values) this layer attended, for the layers that share them (`shared_kv`)."""
        attn_BxTxD, new_cache, kv = self.attn(
            self.input_norm(x_BxTxD), positions_BxT, mask, layer_cache, slots_BxT, dropout_key, shared_kv
        )
        if self.attn_out_norm is not None:
            attn_BxTxD = self.attn_out_norm(attn_BxTxD)
        x_BxTxD = x_BxTxD + attn_BxTxD
        mlp_BxTxD = self.mlp(self.post_attn_norm(x_BxTxD), dropout_key)
        if self.mlp_out_norm is not None:
            mlp_BxTxD = self.mlp_out_norm(mlp_BxTxD)
        x_BxTxD = x_BxTxD + mlp_BxTxD
        if self.scalar is not None:
            x_BxTxD = x_BxTxD * self.scalar[...].astype(x_BxTxD.dtype)
        x_BxTxD = constrain(x_BxTxD, ("batch", "length", "embed"))
        return (x_BxTxD, new_cache, kv) if return_kv else (x_BxTxD, new_cache)
