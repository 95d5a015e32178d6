"""Flax NNX decoder-only transformer for the Llama-2/3, Qwen2/2.5, Qwen3, SmolLM2, Gemma 4 and Qwen3.5
families.

Pre-norm blocks (`blocks.Block`: grouped-query attention with RoPE, optional q/k/v bias and per-head q/k
RMSNorm, and a SwiGLU MLP). Positions come from the attention mask (`cumsum(mask) - 1`), so left- and
right-padded rows both work, and padded keys are never attended. Two entry points share the layers:

* `__call__` / `hidden_states`: full-sequence forward for training and scoring (causal attention
  block-wise, `causal_attention`, or on GPUs cuDNN's fused kernel: `ModelConfig.attention`);
* `forward_cached` / `hidden_states_cached`: append a chunk of tokens to a `KVCache` (prefill,
  incremental prefill of new observations, one-token decoding) with static shapes.

The blocks are one `Block` module whose parameters are the layers' stacked on a leading 'layers' axis
(`Decoder.layers`: `layers.attn.q_kernel` is [L, D, H, E]); both entry points run them under one
`lax.scan`, a layer per step, so a program holds one block's code whatever the depth, FSDP gathers one
layer's weights at a time (inside the step), and `remat` recomputes one layer at a time. With
`unroll_layers` the full-sequence passes unroll that scan (a program then holds every layer's code). A model
with several kinds of layer (`ModelConfig.layer_types`: Gemma 4's sliding and full attention, Qwen3.5's
gated delta rule and full attention) has one such stack per kind, `Decoder.layers[kind]`, walked in runs
(`mixed_layers`), and a cache of per-layer buffers (with the linear-attention layers' states).

The config is resolved when the decoder is built (`kernels.resolve`: the platform, the kernel set, the
attention), and `Decoder.config` is the resolved one. With `ModelConfig.lora_rank` > 0 the target
projections carry LoRA adapters (`coevo_jax.models.lora`); the full-sequence entry points take a
`dropout_key` for the adapters' dropout (train steps only; layer i draws with `fold_in(dropout_key, i)`).
With `ModelConfig.token_shift` > 0 each input embedding mixes in earlier tokens' (`token_shift`), and the
decoder's cache (`init_cache`) keeps each slot's token for it.

Jitted code holds the decoder as a static `GraphDef` plus a pure dict of parameters: `abstract_model`
gives the graphdef (and abstract state) without allocating anything, and `partition.bind` merges a graphdef
with parameters inside a traced function (train steps, reference pass, sampler).

Parameters are stored in `param_dtype` and cast to the compute `dtype` on use. Every parameter carries
logical axis names; activations are constrained by logical names (see `layers.constrain`).

Shape legend: L layers, B batch, T length, S cache slots, D hidden_size, V vocab_size, N token shift width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from coevo_jax.models import mixed_layers
from coevo_jax.models.blocks import Block
from coevo_jax.models.config import ModelConfig
from coevo_jax.models.kernels import kernel_set, resolve
from coevo_jax.models.kv_cache import KVCache, empty_cache, place_chunk
from coevo_jax.models.layers import RMSNorm, constrain, normal, param, stack_layers
from coevo_jax.models.lora import SITES, add_adapters
from coevo_jax.models.token_shift import shift_cached, shift_full, write_ids


class Decoder(nnx.Module):
    """Decoder-only language model; see the module docstring for the entry points."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        cfg = resolve(cfg)
        self.config = cfg
        self.kernels = kernel_set(cfg)
        d, v, pd = cfg.hidden_size, cfg.vocab_size, cfg.param_dtype
        self.embed = param(normal(rngs, (v, d), pd), ("vocab", "embed"))
        blocks = [] if cfg.layer_types else [Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)]
        stacks = mixed_layers.build_stacks(cfg, rngs) if cfg.layer_types else None
        self.final_norm = RMSNorm(
            d, cfg.rms_norm_eps, dtype=cfg.dtype, param_dtype=pd, zero_centered=cfg.zero_centered_norm
        )
        self.lm_head = (
            None if cfg.tie_word_embeddings else param(normal(rngs, (d, v), pd), ("embed", "vocab"))
        )
        shift = cfg.token_shift
        self.token_shift = param(jnp.zeros((shift, d), pd), ("norm", "embed")) if shift else None
        if cfg.lora_rank and blocks:
            add_adapters(blocks, cfg, rngs)  # after every base weight: a LoRA decoder has the base's weights
        self.layers = stacks if cfg.layer_types else stack_layers(blocks)
        self.layer_shardings = None  # set by `partition.bind`: how the scan gathers each layer for compute

    @property
    def unembedding(self) -> jax.Array:
        """Output projection [D, V] in the compute dtype (transposed embedding when tied)."""
        table = self.embed[...].T if self.lm_head is None else self.lm_head[...]
        return table.astype(self.config.dtype)

    def embed_tokens(self, input_ids_BxT: jax.Array) -> jax.Array:
        """Token embeddings [B, T, D] in the compute dtype."""
        x_BxTxD = jnp.take(self.embed[...], input_ids_BxT, axis=0)
        if self.config.embed_scale:  # sqrt(D) rounded to the table's dtype, as Gemma's checkpoints expect
            x_BxTxD = x_BxTxD * jnp.asarray(self.config.hidden_size**0.5, x_BxTxD.dtype)
        x_BxTxD = x_BxTxD.astype(self.config.dtype)
        return constrain(x_BxTxD, ("batch", "length", "embed"))

    def logits_from_hidden(self, hidden_BxTxD: jax.Array) -> jax.Array:
        """Float32 logits [B, T, V] from final hidden states."""
        tied = self.lm_head is None
        table = self.embed[...] if tied else self.lm_head[...]
        logits_BxTxV = self.kernels.logits(hidden_BxTxD, table, tied)
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits_BxTxV = cap * jnp.tanh(logits_BxTxV / cap)
        return constrain(logits_BxTxV, ("batch", "length", "vocab"))

    def _layers(
        self,
        x_BxTxD,
        positions_BxT,
        mask,
        cache: KVCache | None,
        slots_BxT,
        dropout_key=None,
        chunk_mask=None,
    ):
        """The blocks, one layer of the stacked weights per step of a `lax.scan`, then the final norm.

        Returns (hidden states [B, T, D], the cache's (keys, values) with the chunk written, or None; with
        several kinds of layer also its `states`). `chunk_mask` is a cached chunk's token mask [B, T].
        Each step gathers its own layer's weights (`layer_shardings`), so FSDP holds one layer gathered at a
        time; with `remat` a step keeps only its input for the backward pass and recomputes the rest; with
        `unroll_layers` the scan is unrolled (its results are the same).
        """
        if self.config.layer_types and cache is None:
            return self.final_norm(
                mixed_layers.full_pass(self, x_BxTxD, positions_BxT, mask, dropout_key)
            ), None
        if self.config.layer_types:
            x_BxTxD, kv = mixed_layers.cached_pass(
                self, x_BxTxD, positions_BxT, mask, cache, slots_BxT, chunk_mask
            )
            return self.final_norm(x_BxTxD), kv
        graphdef, stacked = nnx.split(self.layers)
        gather = self.layer_for_compute

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

    def _layers_by_layer(
        self, x_BxTxD, positions_BxT, mask, cache: KVCache, slots_BxT, layer_weights, chunk_mask=None
    ):
        """`_layers` unrolled over per-layer weights: the decode loop's path, which reads no slice of a stacked
        weight (see `layer_weights`). The cache holds per-layer buffers (`kv_cache.by_layer`), or stays
        stacked when the kernel set reads it in place (`reads_cache_in_place`): each layer then writes its
        token into the stacked arrays and attention reads them, with no layer's slice copied out."""
        if self.config.layer_types:
            x_BxTxD, kv = mixed_layers.cached_pass(
                self, x_BxTxD, positions_BxT, mask, cache, slots_BxT, chunk_mask, layer_weights
            )
            return self.final_norm(x_BxTxD), kv
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

        With `rows` (a decode step's), each projection's kernel is what the kernel set hands out for a
        product of that many rows (`decode_weight`: the CPU set's small-row kernel reads it inside the
        stack); everything else, and every weight gathered per layer, is a static slice of the stacked
        weights (a copy). Several kinds of layer: each layer's slice of its kind's stack."""
        if self.config.layer_types:
            return [mixed_layers.layer_params(self, layer) for layer in range(self.config.num_layers)]
        stacked_params = nnx.to_pure_dict(nnx.state(self.layers))
        in_place = rows is not None and self.layer_shardings is None
        projections = {(part, kernel) for part, kernel, _ in SITES.values()} if in_place else set()
        dtype = self.config.dtype

        def take(layer: int):
            def one(path, w):
                names = tuple(str(getattr(key, "key", key)) for key in path)
                if names in projections:
                    return self.kernels.decode_weight(w, layer, dtype, rows)
                return w[layer]

            return jax.tree_util.tree_map_with_path(one, stacked_params)

        return [self.layer_for_compute(take(layer)) for layer in range(self.config.num_layers)]

    def layer_for_compute(self, params: dict, kind: str | None = None) -> dict:
        """One layer's weights as its block uses them: cast to the compute dtype and gathered over the FSDP
        axes (`layer_shardings`, set by `bind`; of the `kind`'s stack with several kinds), or as stored
        without them."""
        if self.layer_shardings is None:
            return params
        shardings = self.layer_shardings if kind is None else self.layer_shardings[kind]
        return jax.lax.with_sharding_constraint(cast_floats(params, self.config.dtype), shardings)

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
        chunk_mask = attention_mask_BxT.astype(jnp.int32)
        if layer_weights is None:
            hidden_BxTxD, (keys, values, *states) = self._layers(
                x_BxTxD, placement.positions_BxT, mask, cache, placement.slots_BxT, None, chunk_mask
            )
        else:
            hidden_BxTxD, (keys, values, *states) = self._layers_by_layer(
                x_BxTxD, placement.positions_BxT, mask, cache, placement.slots_BxT, layer_weights, chunk_mask
            )
        new_cache = KVCache(
            keys=keys,
            values=values,
            lengths_B=placement.new_lengths_B,
            token_ids_BxS=ids_BxS,
            states=states[0] if states and cache.states is not None else None,
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


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache for a decoder of `cfg`: `max_len` slots per row in `dtype` (default the compute dtype);
    with a token shift it keeps each slot's token, which the shift reads back."""
    dtype = cfg.dtype if dtype is None else dtype
    if cfg.layer_types:
        return mixed_layers.init_cache(cfg, batch, max_len, dtype)
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, cfg.head_dim, max_len)
    return empty_cache(*shape, dtype, token_ids=cfg.token_shift > 0)


def cast_floats(params: dict, dtype) -> dict:
    """`params` with every floating-point array cast to `dtype` (the compute dtype; integers as they are)."""
    return jax.tree.map(lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params)
