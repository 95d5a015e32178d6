"""Flax NNX decoder-only transformer for the Llama-2/3, Qwen2/2.5, Qwen3 and SmolLM2 families.

Pre-norm blocks of grouped-query attention (RoPE, optional q/k/v bias and per-head q/k RMSNorm) and a
SwiGLU MLP. Positions come from the attention mask (`cumsum(mask) - 1`), so left- and right-padded rows
both work, and padded keys are never attended. Two entry points share the layers:

* `__call__` / `hidden_states`: full-sequence forward for training and scoring (causal attention
  block-wise, `causal_attention`, or on GPUs cuDNN's fused kernel: `ModelConfig.attention`);
* `forward_cached` / `hidden_states_cached`: append a chunk of tokens to a `KVCache` (prefill,
  incremental prefill of new observations, one-token decoding) with static shapes.

The blocks are one `Block` module whose parameters are the layers' stacked on a leading 'layers' axis
(`Decoder.layers`: `layers.attn.q_kernel` is [L, D, H, E]); both entry points run them under one
`lax.scan`, a layer per step, so a program holds one block's code whatever the depth, FSDP gathers one
layer's weights at a time (inside the step), and `remat` recomputes one layer at a time. With
`unroll_layers` the full-sequence passes unroll that scan (a program then holds every layer's code).

With `ModelConfig.lora_rank` > 0 the target projections carry LoRA adapters (`coevo_jax.models.lora`);
the full-sequence entry points take a `dropout_key` for the adapters' dropout (train steps only; layer i
draws with `fold_in(dropout_key, i)`).

Jitted code holds the decoder as a static `GraphDef` plus a pure dict of parameters: `abstract_model`
gives the graphdef (and abstract state) without allocating anything, and `bind` merges a graphdef with
parameters inside a traced function (train steps, reference pass, sampler).

Parameters are stored in `param_dtype` and cast to the compute `dtype` on use. Every parameter carries
logical axis names; activations are constrained by logical names (see `layers.constrain`).

Shape legend: L layers, B batch, T length, S cache slots, D hidden_size, F intermediate_size, V vocab_size,
H query heads, K key/value heads, E head_dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx, traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from coevo_jax.models.causal_attention import causal_attention
from coevo_jax.models.config import ModelConfig
from coevo_jax.models.cpu_kernels import small_matmul_applies, small_matmul_nt
from coevo_jax.models.dense import StackedLayer, dense
from coevo_jax.models.fused_attention import fused_causal_attention, uses_fused
from coevo_jax.models.kv_cache import KVCache, place_chunk, write_keys, write_values
from coevo_jax.models.layers import (
    RMSNorm,
    apply_rope,
    attend_cached_rows,
    batch_shards,
    constrain,
    param,
    rope_inverse_frequencies,
    stack_layers,
)
from coevo_jax.models.lora import SITES, add_adapters
from coevo_jax.models.token_shift import shift_cached, shift_full, write_ids

# `jax.nn.dot_product_attention`'s implementation behind `ModelConfig.attention` = 'cudnn' (the tests run
# the same dispatch on the CPU with 'xla').
_FUSED_IMPLEMENTATION = "cudnn"
_INIT_STD = 0.02  # HF `initializer_range`; real weights come from checkpoints
# Cached chunks of at least this many tokens attend row by row on the CPU (`_causal_plan`): 1.6-1.9x
# faster for a 256-token chunk against 1,024-1,280 slots; 32-token chunks 1.1-1.4x (anchor) and 1.0-1.2x
# (SmolLM2) at 512-2,048 slots; no gain at 16 (bench/README.md).
_ROWS_MAPPED_FROM = 32


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> jax.Array:
    return (_INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; optionally reads and writes one layer of a KV cache."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, h, k, e, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_dtype
        self.q_kernel = param(_normal(rngs, (d, h, e), pd), ("embed", "q_heads", "head_dim"))
        self.k_kernel = param(_normal(rngs, (d, k, e), pd), ("embed", "kv_heads", "head_dim"))
        self.v_kernel = param(_normal(rngs, (d, k, e), pd), ("embed", "kv_heads", "head_dim"))
        self.o_kernel = param(_normal(rngs, (h, e, d), pd), ("q_heads", "head_dim", "embed"))
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

    def _project(self, x_BxTxD, kernel, bias, norm, positions_BxT, adapter, dropout_key):
        d, n, e = kernel.shape
        y_BxTxNE = dense(x_BxTxD, kernel[...].reshape(d, n * e))
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
        if layer_cache is None and uses_fused(self.config.attention, self.dtype, q_BxTxHxE.shape[-1]):
            out_BxTxHxE = fused_causal_attention(
                q_BxTxHxE,
                k_BxTxKxE,
                v_BxTxKxE,
                mask,
                implementation=_FUSED_IMPLEMENTATION,
                right_padded=self.config.right_padded,
                **_causal_plan(mask.shape[0]),
            )
        elif layer_cache is None or fresh:
            out_BxTxHxE = causal_attention(
                q_BxTxHxE, k_BxKxTxE, v_BxKxTxE, mask, **_causal_plan(mask.shape[0])
            )
        else:  # the cached slots: a long prefill chunk row by row, anything shorter (decode) at once
            long_chunk = q_BxTxHxE.shape[1] >= _ROWS_MAPPED_FROM
            row_chunks = _causal_plan(mask.shape[0])["row_chunks"] if long_chunk else 1
            out_BxTxHxE = attend_cached_rows(q_BxTxHxE, *new_cache, layer, mask, row_chunks)
        h, e, d = self.o_kernel.shape
        out_BxTxHE = out_BxTxHxE.reshape(*out_BxTxHxE.shape[:-2], h * e)
        out_BxTxD = dense(out_BxTxHE, self.o_kernel[...].reshape(h * e, d))
        if self.o_lora is not None:
            out_BxTxD = out_BxTxD + self.o_lora(out_BxTxHE, dropout_key)
        if self.o_bias is not None:
            out_BxTxD = out_BxTxD + self.o_bias[...].astype(self.dtype)
        return out_BxTxD, new_cache


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
        self.gate_kernel = param(_normal(rngs, (d, f), pd), ("embed", "mlp"))
        self.up_kernel = param(_normal(rngs, (d, f), pd), ("embed", "mlp"))
        self.down_kernel = param(_normal(rngs, (f, d), pd), ("mlp", "embed"))
        bias = cfg.mlp_bias
        self.gate_bias = param(jnp.zeros((f,), pd), ("mlp",)) if bias else None
        self.up_bias = param(jnp.zeros((f,), pd), ("mlp",)) if bias else None
        self.down_bias = param(jnp.zeros((d,), pd), ("embed",)) if bias else None
        self.gate_lora = self.up_lora = self.down_lora = None  # set by `lora.add_adapters`
        self.dtype = cfg.dtype

    def _dense(self, x, kernel, bias, adapter, dropout_key):
        y = dense(x, kernel[...])
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


def _causal_plan(batch: int) -> dict:
    """Block size and row chunking of `causal_attention` for this backend.

    On the CPU, one row per device at a time keeps each block's scores in cache (several times faster);
    accelerators take every row at once and larger blocks.
    """
    if jax.default_backend() != "cpu":
        return {"block_size": 256, "row_chunks": 1}
    shards = batch_shards()
    return {"block_size": 64, "row_chunks": batch // shards if batch % shards == 0 else 1}


class Decoder(nnx.Module):
    """Decoder-only language model; see the module docstring for the entry points."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        d, v, pd = cfg.hidden_size, cfg.vocab_size, cfg.param_dtype
        self.embed = param(_normal(rngs, (v, d), pd), ("vocab", "embed"))
        blocks = [Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)]
        self.final_norm = RMSNorm(d, cfg.rms_norm_eps, dtype=cfg.dtype, param_dtype=pd)
        self.lm_head = (
            None if cfg.tie_word_embeddings else param(_normal(rngs, (d, v), pd), ("embed", "vocab"))
        )
        shift = cfg.token_shift
        self.token_shift = param(jnp.zeros((shift, d), pd), ("norm", "embed")) if shift else None
        if cfg.lora_rank:
            add_adapters(blocks, cfg, rngs)  # after every base weight: a LoRA decoder has the base's weights
        self.layers = stack_layers(blocks)
        self.layer_shardings = None  # set by `bind`: how the scan gathers each layer's weights for compute

    @property
    def unembedding(self) -> jax.Array:
        """Output projection [D, V] in the compute dtype (transposed embedding when tied)."""
        table = self.embed[...].T if self.lm_head is None else self.lm_head[...]
        return table.astype(self.config.dtype)

    def embed_tokens(self, input_ids_BxT: jax.Array) -> jax.Array:
        """Token embeddings [B, T, D] in the compute dtype."""
        x_BxTxD = jnp.take(self.embed[...], input_ids_BxT, axis=0).astype(self.config.dtype)
        return constrain(x_BxTxD, ("batch", "length", "embed"))

    def logits_from_hidden(self, hidden_BxTxD: jax.Array) -> jax.Array:
        """Float32 logits [B, T, V] from final hidden states."""
        rows = hidden_BxTxD.shape[0] * hidden_BxTxD.shape[1]
        table = self.embed if self.lm_head is None else self.lm_head
        if small_matmul_applies(hidden_BxTxD.dtype, table.dtype, rows):  # a decode step's rows: CPU kernels
            if self.lm_head is None:  # the tied table [V, D] as it is stored, each logit a row's dot product
                return small_matmul_nt(hidden_BxTxD, table[...])
            return dense(hidden_BxTxD, self.unembedding)
        logits = jnp.einsum("btd,dv->btv", hidden_BxTxD, self.unembedding, preferred_element_type=jnp.float32)
        return constrain(logits, ("batch", "length", "vocab"))

    def _layers(self, x_BxTxD, positions_BxT, mask, cache: KVCache | None, slots_BxT, dropout_key=None):
        """The blocks, one layer of the stacked weights per step of a `lax.scan`, then the final norm.

        Returns (hidden states [B, T, D], the cache's (keys, values) with the chunk written, or None).
        Each step gathers its own layer's weights (`layer_shardings`), so FSDP holds one layer gathered at a
        time; with `remat` a step keeps only its input for the backward pass and recomputes the rest; with
        `unroll_layers` the scan is unrolled (its results are the same).
        """
        graphdef, stacked = nnx.split(self.layers)
        gather = self._layer_for_compute

        def step(carry, layer_and_params):
            x_BxTxD, kv = carry
            layer, params = layer_and_params
            block = nnx.merge(graphdef, gather(params))
            layer_cache = None if kv is None else (*kv, layer)
            layer_key = None if dropout_key is None else jax.random.fold_in(dropout_key, layer)
            x_BxTxD, kv = block(x_BxTxD, positions_BxT, mask, layer_cache, slots_BxT, layer_key)
            return (x_BxTxD, kv), None

        if self.config.remat:
            step = jax.checkpoint(step, prevent_cse=False)
        kv = None if cache is None else (cache.keys, cache.values)
        layers = jnp.arange(self.config.num_layers, dtype=jnp.int32)
        unroll = self.config.num_layers if self.config.unroll_layers else 1
        (x_BxTxD, kv), _ = jax.lax.scan(
            step, (x_BxTxD, kv), (layers, nnx.to_pure_dict(stacked)), unroll=unroll
        )
        return self.final_norm(x_BxTxD), kv

    def _layers_by_layer(self, x_BxTxD, positions_BxT, mask, cache: KVCache, slots_BxT, layer_weights):
        """`_layers` unrolled over per-layer weights: the decode loop's path, which reads no slice of a stacked
        weight (see `layer_weights`). The cache holds per-layer buffers (`kv_cache.by_layer`), or stays
        stacked when attention reads it in place (`cpu_kernels.prefix_attention`): each layer then writes its
        token into the stacked arrays and the kernel reads them, with no layer's slice copied out."""
        graphdef = nnx.graphdef(self.layers)
        if not isinstance(cache.keys, tuple):
            kv = (cache.keys, cache.values)
            for layer, params in enumerate(layer_weights):
                block = nnx.merge(graphdef, params)
                x_BxTxD, kv = block(x_BxTxD, positions_BxT, mask, (*kv, layer), slots_BxT)
            return self.final_norm(x_BxTxD), kv
        keys, values = [], []
        for layer, params in enumerate(layer_weights):
            block = nnx.merge(graphdef, params)
            layer_cache = (cache.keys[layer][None], cache.values[layer][None], 0)  # a stack of one: a view
            x_BxTxD, (k_1xBxKxExS, v_1xBxKxSxE) = block(x_BxTxD, positions_BxT, mask, layer_cache, slots_BxT)
            keys.append(k_1xBxKxExS[0])
            values.append(v_1xBxKxSxE[0])
        return self.final_norm(x_BxTxD), (tuple(keys), tuple(values))

    def layer_weights(self, rows: int | None = None) -> list[dict]:
        """Each layer's weights for compute: the decode loop takes them once per call, outside its per-token
        loop (a scan over the stacked weights would copy each layer's slice out at every token).

        With `rows` (a decode step's) where the CPU kernel `small_matmul` serves them, each projection's
        kernel stays in the stack as a `StackedLayer`, which the kernel reads in place; everything else, and
        every weight elsewhere, is a static slice of the stacked weights (a copy)."""
        stacked_params = nnx.to_pure_dict(nnx.state(self.layers))
        param_dtype = self.config.param_dtype
        in_place = (
            rows is not None
            and self.layer_shardings is None
            and small_matmul_applies(self.config.dtype, param_dtype, rows)
        )
        kernels = {(part, kernel) for part, kernel, _ in SITES.values()} if in_place else set()

        def take(layer: int):
            def one(path, w):
                names = tuple(str(getattr(key, "key", key)) for key in path)
                return StackedLayer(w, layer) if names in kernels else w[layer]

            return jax.tree_util.tree_map_with_path(one, stacked_params)

        return [self._layer_for_compute(take(layer)) for layer in range(self.config.num_layers)]

    def _layer_for_compute(self, params: dict) -> dict:
        """One layer's weights as its block uses them: cast to the compute dtype and gathered over the FSDP
        axes (`layer_shardings`, set by `bind`), or as stored without them."""
        if self.layer_shardings is None:
            return params
        return jax.lax.with_sharding_constraint(_cast_floats(params, self.config.dtype), self.layer_shardings)

    def hidden_states_from_embeddings(
        self, x_BxTxD: jax.Array, attention_mask_BxT=None, dropout_key=None
    ) -> jax.Array:
        """Final normed hidden states [B, T, D] from input embeddings (full causal attention).

        `dropout_key` switches on the LoRA adapters' dropout (train steps); without it the pass is
        deterministic."""
        batch, length, _ = x_BxTxD.shape
        if attention_mask_BxT is None:
            attention_mask_BxT = jnp.ones((batch, length), jnp.int32)
        mask_BxT = attention_mask_BxT.astype(jnp.int32)
        positions_BxT = jnp.maximum(jnp.cumsum(mask_BxT, axis=1) - 1, 0)
        if self.token_shift is not None:
            weights_NxD = self.token_shift[...].astype(self.config.dtype)
            x_BxTxD = shift_full(x_BxTxD, positions_BxT, mask_BxT, weights_NxD)
        hidden_BxTxD, _ = self._layers(x_BxTxD, positions_BxT, mask_BxT, None, None, dropout_key)
        return hidden_BxTxD

    def hidden_states(self, input_ids_BxT: jax.Array, attention_mask_BxT=None, dropout_key=None) -> jax.Array:
        """Final normed hidden states [B, T, D]; pair with `unembedding` for memory-light losses."""
        return self.hidden_states_from_embeddings(
            self.embed_tokens(input_ids_BxT), attention_mask_BxT, dropout_key
        )

    def __call__(self, input_ids_BxT: jax.Array, attention_mask_BxT=None) -> jax.Array:
        """Float32 logits [B, T, V]. Padding (mask 0) may be on either side; its logits are garbage."""
        return self.logits_from_hidden(self.hidden_states(input_ids_BxT, attention_mask_BxT))

    def hidden_states_cached(
        self,
        input_ids_BxT: jax.Array,
        cache: KVCache,
        attention_mask_BxT=None,
        *,
        fresh: bool = False,
        layer_weights: list[dict] | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Appends a chunk to `cache`; returns its final hidden states [B, T, D] and the new cache.

        `fresh` (static) promises that every row with tokens in the chunk starts from an empty cache
        (length 0): the chunk then attends itself causally, block-wise (`causal_attention`; positions grow
        with the index whatever the padding), instead of scoring every query against every cache slot.
        With `layer_weights` (`layer_weights()`) the cache holds per-layer buffers (`kv_cache.by_layer`)
        and the layers run unrolled over them: the decode loop's path."""
        if attention_mask_BxT is None:
            attention_mask_BxT = jnp.ones(input_ids_BxT.shape, jnp.int32)
        placement = place_chunk(cache.lengths_B, attention_mask_BxT, cache.capacity)
        x_BxTxD, ids_BxS = self.embed_tokens(input_ids_BxT), cache.token_ids_BxS
        if self.token_shift is not None:
            ids_BxS = write_ids(ids_BxS, placement.slots_BxT, input_ids_BxT)
            weights_NxD = self.token_shift[...].astype(self.config.dtype)
            x_BxTxD = shift_cached(
                x_BxTxD, ids_BxS, placement.positions_BxT, attention_mask_BxT, weights_NxD, self.embed_tokens
            )
        mask = attention_mask_BxT.astype(jnp.int32) if fresh else placement.allowed_BxTxS
        if layer_weights is None:
            hidden_BxTxD, (keys, values) = self._layers(
                x_BxTxD, placement.positions_BxT, mask, cache, placement.slots_BxT
            )
        else:
            hidden_BxTxD, (keys, values) = self._layers_by_layer(
                x_BxTxD, placement.positions_BxT, mask, cache, placement.slots_BxT, layer_weights
            )
        new_cache = KVCache(
            keys=keys, values=values, lengths_B=placement.new_lengths_B, token_ids_BxS=ids_BxS
        )
        return hidden_BxTxD, new_cache

    def forward_cached(
        self,
        input_ids_BxT: jax.Array,
        cache: KVCache,
        attention_mask_BxT=None,
        *,
        fresh: bool = False,
        layer_weights: list[dict] | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Appends a chunk of T >= 1 tokens per row to `cache`; returns float32 logits [B, T, V], new cache.

        Tokens with mask 0 are neither stored nor attended (their logits are garbage), so rows may carry
        different amounts of padding in the same chunk. `fresh`, `layer_weights`: as in
        `hidden_states_cached`.
        """
        hidden_BxTxD, new_cache = self.hidden_states_cached(
            input_ids_BxT, cache, attention_mask_BxT, fresh=fresh, layer_weights=layer_weights
        )
        return self.logits_from_hidden(hidden_BxTxD), new_cache


def abstract_model(model_cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, abstract parameter state with logical-axis metadata) without allocating anything."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(model_cfg, rngs=nnx.Rngs(0))))


@functools.lru_cache(maxsize=16)
def _adapter_paths(model_cfg: ModelConfig) -> frozenset[tuple]:
    """Paths of the `nnx.LoRAParam` variables (the adapters) in a decoder's parameter tree."""
    _, state = abstract_model(model_cfg)
    return frozenset(path for path, _ in nnx.to_flat_state(state.filter(nnx.LoRAParam)))


def partition_trainable(params: dict, model_cfg: ModelConfig) -> tuple[dict, dict]:
    """(trainable, frozen) parts of a parameter tree: the pure dict, or a tree of its shardings or shapes.

    Full fine-tuning (`lora_rank` 0) trains every parameter: (params, {}). Under LoRA the adapters are
    trained and the base is frozen: (adapters, base).
    """
    if not model_cfg.lora_rank:
        return params, {}
    adapters = _adapter_paths(model_cfg)
    flat = traverse_util.flatten_dict(params)
    trainable = {path: value for path, value in flat.items() if path in adapters}
    frozen = {path: value for path, value in flat.items() if path not in adapters}
    if len(trainable) != len(adapters):
        raise ValueError(f"expected {len(adapters)} adapter arrays (LoRA), the tree has {len(trainable)}")
    return traverse_util.unflatten_dict(trainable), traverse_util.unflatten_dict(frozen)


def combine_trainable(trainable: dict, frozen: dict) -> dict:
    """The whole parameter tree from its `partition_trainable` parts (cheap: no array is copied)."""
    if not frozen:
        return trainable
    return traverse_util.unflatten_dict(
        {**traverse_util.flatten_dict(frozen), **traverse_util.flatten_dict(trainable)}
    )


def bind(graphdef: nnx.GraphDef, params: dict, compute_shardings=None, *, per_layer: bool = True) -> Decoder:
    """The decoder with these parameters (cheap: used inside traced steps).

    With `compute_shardings` (see `sharding.compute_shardings`) the parameters are cast to the compute
    dtype - as the decoder casts them on use anyway - and all-gathered over the storage-only FSDP axes:
    weights are stored sharded, gathered in the compute dtype for use, and the transpose reduce-scatters
    their gradients back (ZeRO-3). The embedding, final norm and output projection are gathered here; the
    stacked layers, with `per_layer` (the train steps), one at a time inside the scan over them
    (`Decoder.layer_shardings`), else here too: the sampler's decode loop uses the weights once per token,
    and gathering them once per call beats gathering every layer at every token.
    """
    if compute_shardings is None:
        return nnx.merge(graphdef, params)
    dtype = nnx.merge(graphdef, params).config.dtype
    outer = {name: value for name, value in params.items() if name != "layers" or not per_layer}
    outer_shardings = {name: compute_shardings[name] for name in outer}
    gathered = jax.lax.with_sharding_constraint(_cast_floats(outer, dtype), outer_shardings)
    if not per_layer:
        return nnx.merge(graphdef, gathered)
    model = nnx.merge(graphdef, {**gathered, "layers": params["layers"]})
    model.layer_shardings = jax.tree.map(_one_layer, compute_shardings["layers"])
    return model


def _cast_floats(params: dict, dtype) -> dict:
    """`params` with every floating-point array cast to `dtype` (the compute dtype; integers as they are)."""
    return jax.tree.map(lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)


def _one_layer(stacked: NamedSharding) -> NamedSharding:
    """The sharding of one layer's slice of a stacked weight (its leading 'layers' axis dropped)."""
    if stacked.spec and stacked.spec[0] is not None:
        raise ValueError(f"the stacked layers axis must not be sharded for compute, got {stacked.spec}")
    return NamedSharding(stacked.mesh, PartitionSpec(*stacked.spec[1:]))
