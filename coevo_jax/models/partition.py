"""How train steps and the sampler hold a decoder's parameters: which of them train, and how they are bound.

`partition_trainable` splits a parameter tree into what a step trains and what stays frozen: everything
under full fine-tuning, the LoRA adapters over a frozen base under LoRA (`ModelConfig.lora_rank`);
`combine_trainable` puts the parts back together. `bind` merges a graphdef with parameters inside a traced
function and, with compute shardings, gathers FSDP-stored weights for compute (ZeRO-3).
"""

from __future__ import annotations

import functools

import jax
from flax import nnx, traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from coevo_jax.models.config import ModelConfig
from coevo_jax.models.decoder import Decoder, abstract_model, cast_floats


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
    gathered = jax.lax.with_sharding_constraint(cast_floats(outer, dtype), outer_shardings)
    if not per_layer:
        return nnx.merge(graphdef, gathered)
    model = nnx.merge(graphdef, {**gathered, "layers": params["layers"]})
    model.layer_shardings = jax.tree.map(_one_layer, compute_shardings["layers"])
    return model


def _one_layer(stacked: NamedSharding) -> NamedSharding:
    """The sharding of one layer's slice of a stacked weight (its leading 'layers' axis dropped)."""
    if stacked.spec and stacked.spec[0] is not None:
        raise ValueError(f"the stacked layers axis must not be sharded for compute, got {stacked.spec}")
    return NamedSharding(stacked.mesh, PartitionSpec(*stacked.spec[1:]))
