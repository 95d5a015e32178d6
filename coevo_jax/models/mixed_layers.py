"""The decoder's layers when they are of several kinds (`ModelConfig.layer_types`): one stack each.

Each kind of block (`ModelConfig.layer_kinds`: Gemma 4's sliding or full attention, each with or without keys
and values of its own; Qwen3.5's linear or full attention) is one stacked module under `Decoder.layers[kind]`, its blocks built from `kind_config(kind)`,
so every stack has one shape and one block's code. A full-sequence pass walks the layers in runs of one
kind, each run a `lax.scan` over its slice of the kind's stack; a layer whose keys and values later layers
share runs alone and hands them on. Cached passes run the layers one by one over a cache of per-layer
buffers (`init_cache`: each layer's own head size and key/value heads; a sharing layer's are empty, it
reads the slots of the layer it shares; a linear-attention layer's are empty too, it keeps its state in
`KVCache.states` instead).

Shape legend: B batch, T length, S cache slots, K key/value heads, E head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from coevo_jax.models.blocks import Block
from coevo_jax.models.config import SHARED_KV, ModelConfig
from coevo_jax.models.kv_cache import KVCache
from coevo_jax.models.layers import stack_layers
from coevo_jax.models.linear_attention import init_state
from coevo_jax.models.lora import add_adapters


def build_stacks(cfg: ModelConfig, rngs: nnx.Rngs) -> nnx.Dict:
    """One stacked module of blocks per kind of layer; their weights drawn in layer order, then the
    adapters (as the one-stack decoder draws them)."""
    blocks = [Block(cfg.kind_config(cfg.layer_kind(i)), rngs=rngs) for i in range(cfg.num_layers)]
    by_kind = {
        kind: [b for i, b in enumerate(blocks) if cfg.layer_kind(i) == kind] for kind in cfg.layer_kinds
    }
    if cfg.lora_rank:
        for kind, kind_blocks in by_kind.items():
            add_adapters(kind_blocks, cfg.kind_config(kind), rngs)
    return nnx.Dict({kind: stack_layers(kind_blocks) for kind, kind_blocks in by_kind.items()})


def _producers(cfg: ModelConfig) -> frozenset[int]:
    """The layers whose keys and values a later layer shares."""
    return frozenset(cfg.kv_source(i) for i in range(cfg.num_layers) if cfg.kv_source(i) != i)


def runs(cfg: ModelConfig) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """(kind, first and end index in the kind's stack, the layers) of each run of consecutive layers of one
    kind; a layer whose keys and values are shared is a run of its own."""
    out: list[tuple[str, int, int, tuple[int, ...]]] = []
    producers = _producers(cfg)
    for layer in range(cfg.num_layers):
        kind, index = cfg.layer_site(layer)[0][1], cfg.layer_site(layer)[1]
        last = out[-1] if out else None
        if last and last[0] == kind and layer not in producers and last[3][-1] not in producers:
            out[-1] = (kind, last[1], index + 1, (*last[3], layer))
        else:
            out.append((kind, index, index + 1, (layer,)))
    return out


def layer_type(kind: str) -> str:
    return kind.removesuffix(SHARED_KV)


def full_pass(decoder, x_BxTxD, positions_BxT, mask_BxT, dropout_key=None):
    """Hidden states [B, T, D] after every layer (before the final norm) of a full causal pass."""
    cfg: ModelConfig = decoder.config
    producers = _producers(cfg)
    shared: dict[str, tuple] = {}  # layer type -> the (keys, values) its sharing layers attend
    for kind, start, end, layers in runs(cfg):
        graphdef, stacked = nnx.split(decoder.layers[kind])
        params = jax.tree.map(lambda w, s=start, e=end: w[s:e], nnx.to_pure_dict(stacked))
        shared_kv = shared.get(layer_type(kind)) if kind.endswith(SHARED_KV) else None

        def step(x_BxTxD, layer_and_params, graphdef=graphdef, kind=kind, shared_kv=shared_kv):
            layer, layer_params = layer_and_params
            block = nnx.merge(graphdef, decoder.layer_for_compute(layer_params, kind))
            layer_key = None if dropout_key is None else jax.random.fold_in(dropout_key, layer)
            x_BxTxD, _, kv = block(
                x_BxTxD, positions_BxT, mask_BxT, None, None, layer_key, shared_kv, return_kv=True
            )
            return x_BxTxD, kv

        if cfg.remat:
            step = jax.checkpoint(step, prevent_cse=False)
        if layers[0] in producers:
            x_BxTxD, shared[layer_type(kind)] = step(
                x_BxTxD, (jnp.int32(layers[0]), jax.tree.map(lambda w: w[0], params))
            )
            continue

        def scan_step(x_BxTxD, xs, step=step):
            return step(x_BxTxD, xs)[0], None

        unroll = len(layers) if cfg.unroll_layers else 1
        x_BxTxD, _ = jax.lax.scan(scan_step, x_BxTxD, (jnp.asarray(layers, jnp.int32), params), unroll=unroll)
    return x_BxTxD


def layer_params(decoder, layer: int) -> dict:
    """Layer `layer`'s weights, sliced out of its kind's stack and made ready for compute."""
    (_, kind), index = decoder.config.layer_site(layer)
    stacked = nnx.to_pure_dict(nnx.state(decoder.layers[kind]))
    return decoder.layer_for_compute(jax.tree.map(lambda w: w[index], stacked), kind)


def cached_pass(
    decoder, x_BxTxD, positions_BxT, mask, cache: KVCache, slots_BxT, chunk_mask_BxT, layer_weights=None
):
    """Hidden states after every layer (before the final norm) of a chunk appended to a per-layer cache,
    and the cache's (keys, values, states) tuples with the chunk written. `mask` is what attention layers
    attend (`Attention.__call__`), `chunk_mask_BxT` the chunk's tokens (what linear-attention layers take)."""
    cfg: ModelConfig = decoder.config
    keys, values = list(cache.keys), list(cache.values)
    states = [()] * cfg.num_layers if cache.states is None else list(cache.states)
    chunk_kv: dict[int, tuple] = {}
    for layer in range(cfg.num_layers):
        kind = cfg.layer_site(layer)[0][1]
        params = layer_params(decoder, layer) if layer_weights is None else layer_weights[layer]
        block = nnx.merge(nnx.graphdef(decoder.layers[kind]), params)
        if kind == "linear_attention":
            x_BxTxD, states[layer] = block(x_BxTxD, positions_BxT, chunk_mask_BxT, states[layer], slots_BxT)
            continue
        source = cfg.kv_source(layer)
        layer_cache = (keys[source][None], values[source][None], 0)  # a stack of one: a view
        if source != layer:
            x_BxTxD, _ = block(x_BxTxD, positions_BxT, mask, layer_cache, slots_BxT, None, chunk_kv[source])
            continue
        x_BxTxD, (k_1xBxKxExS, v_1xBxKxSxE), chunk_kv[layer] = block(
            x_BxTxD, positions_BxT, mask, layer_cache, slots_BxT, return_kv=True
        )
        keys[layer], values[layer] = k_1xBxKxExS[0], v_1xBxKxSxE[0]
    return x_BxTxD, (tuple(keys), tuple(values), tuple(states))


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype) -> KVCache:
    """An empty per-layer cache: layer l's keys [B, K_l, E_l, S] and values [B, K_l, S, E_l], a layer that
    shares another's keys and values holding none (S = 0), a linear-attention layer none either (K = 0)
    and its empty state in `states` (the others' entries there empty)."""
    keys, values, states = [], [], []
    for layer in range(cfg.num_layers):
        kind_cfg = cfg.kind_config(cfg.layer_kind(layer))
        if kind_cfg.block_kind == "linear_attention":
            keys.append(jnp.zeros((batch, 0, 1, max_len), dtype))
            values.append(jnp.zeros((batch, 0, max_len, 1), dtype))
            states.append(init_state(kind_cfg, batch, dtype))
            continue
        states.append(())
        slots = max_len if cfg.kv_source(layer) == layer else 0
        heads = (batch, kind_cfg.num_kv_heads)
        keys.append(jnp.zeros((*heads, kind_cfg.head_dim, slots), dtype))
        values.append(jnp.zeros((*heads, slots, kind_cfg.head_dim), dtype))
    linear = "linear_attention" in cfg.layer_types
    return KVCache(
        keys=tuple(keys),
        values=tuple(values),
        lengths_B=jnp.zeros((batch,), jnp.int32),
        states=tuple(states) if linear else None,
    )
