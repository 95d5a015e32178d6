"""PEFT LoRA adapter directories: the format's names, layouts and config, for export and import.

A PEFT adapter directory (what `peft.PeftModel.save_pretrained` writes and `PeftModel.from_pretrained`
loads onto a transformers model) holds `adapter_config.json` (rank `r`, `lora_alpha`, `lora_dropout`,
`target_modules`) and `adapter_model.safetensors` with two tensors per adapted projection, e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` [r, in] and `...lora_B.weight` [out, r]:
torch's [out, in] layout of A and B, whose transposes, with the input and output axes unflattened, are our
A [in..., r] and B [r, out...]. Only plain LoRA is expressible: rsLoRA, DoRA, per-layer ranks, biases and
extra trained modules are rejected on import, naming the file and field.

`loading` uses this for `save_adapter` and `load_pretrained(..., adapter=...)`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from flax import nnx

from coevo_jax.checkpoint_formats.hf_params import (
    CheckpointError,
    PlaceFn,
    TensorMapping,
    TensorSource,
    default_place,
    host_fetcher,
    read_tensors_into,
)
from coevo_jax.models.config import ModelConfig
from coevo_jax.models.decoder import Decoder
from coevo_jax.models.lora import SITES, adapter_name

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."  # PEFT's wrapping of the transformers model, as it names saved tensors
# our target -> the transformers module it adapts, inside `model.layers.<i>.`
MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
# PEFT options a plain LoRA adapter leaves empty / false; anything else changes the maths or the layout.
_UNSUPPORTED = (
    "use_rslora",
    "use_dora",
    "fan_in_fan_out",
    "lora_bias",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "layers_to_transform",
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "exclude_modules",
)


def adapter_config(cfg: ModelConfig) -> dict[str, Any]:
    """The `adapter_config.json` of a LoRA decoder's adapters, as PEFT's `LoraConfig` reads it."""
    if not cfg.lora_rank:
        raise ValueError("the model has no LoRA adapters (lora_rank = 0)")
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": cfg.lora_rank,
        "lora_alpha": cfg.lora_alpha,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": sorted(MODULES[t].rsplit(".", 1)[1] for t in cfg.lora_targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def lora_fields(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`ModelConfig` LoRA fields of a PEFT `adapter_config.json` dict; ValueError naming `source` if the
    adapter is not plain LoRA on our target projections."""
    if config.get("peft_type") != "LORA":
        raise ValueError(
            f"{source}: peft_type={config.get('peft_type')!r}, only 'LORA' adapters are supported"
        )
    for key in _UNSUPPORTED:
        if config.get(key):
            raise ValueError(f"{source}: {key}={config[key]!r} is not supported (plain LoRA only)")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{source}: bias={config['bias']!r} is not supported (plain LoRA only)")
    modules = config.get("target_modules")
    if isinstance(modules, str) or not modules:
        raise ValueError(f"{source}: target_modules={modules!r}: expected a list of projection names")
    by_name = {module.rsplit(".", 1)[1]: target for target, module in MODULES.items()}
    unknown = sorted(set(modules) - set(by_name))
    if unknown:
        raise ValueError(f"{source}: target_modules {unknown} are not among {sorted(by_name)}")
    return {
        "lora_rank": int(config["r"]),
        "lora_alpha": float(config["lora_alpha"]),
        "lora_dropout": float(config.get("lora_dropout", 0.0)),
        "lora_targets": tuple(by_name[m] for m in modules),
    }


def adapter_mappings(cfg: ModelConfig) -> list[TensorMapping]:
    """Every adapter matrix of a `Decoder(cfg)` with its PEFT name, PEFT shape and layout conversions (its
    path is the stacked adapter weight's, `layer` its index on the leading axis)."""
    _, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    shapes = {path: v.get_value().shape for path, v in nnx.to_flat_state(abstract.filter(nnx.LoRAParam))}
    rank, out = cfg.lora_rank, []
    for i in range(cfg.num_layers):
        stack, index = cfg.layer_site(i)
        for target in cfg.lora_targets:
            part = SITES[target][0]
            path = (*stack, part, adapter_name(target))
            if (*path, "a") not in shapes:  # the layer has no such projection (keys as values, KV sharing)
                continue
            name = f"{_PREFIX}model.layers.{i}.{MODULES[target]}"
            a_in, b_out = shapes[(*path, "a")][1:-1], shapes[(*path, "b")][2:]
            out.append(
                TensorMapping(
                    f"{name}.lora_A.weight",
                    (*path, "a"),
                    (rank, math.prod(a_in)),
                    to_nnx=lambda w, a_in=a_in: w.T.reshape(*a_in, rank),
                    to_hf=lambda a: a.reshape(-1, rank).T,
                    layer=index,
                )
            )
            out.append(
                TensorMapping(
                    f"{name}.lora_B.weight",
                    (*path, "b"),
                    (math.prod(b_out), rank),
                    to_nnx=lambda w, b_out=b_out: w.T.reshape(rank, *b_out),
                    to_hf=lambda b: b.reshape(rank, -1).T,
                    layer=index,
                )
            )
    return out


def with_adapter(
    base: Decoder, lora: Mapping[str, Any], source: TensorSource, place: PlaceFn | None
) -> Decoder:
    """The LoRA decoder of `base`'s weights (not copied) plus the adapter tensors of `source`.

    `lora` holds the `ModelConfig` LoRA fields (`lora_fields`); each adapter tensor is checked, converted
    to our layout and the parameter dtype, and handed to `place` like a base tensor.
    """
    if base.config.lora_rank:
        raise ValueError("the base model already has LoRA adapters")
    place = default_place if place is None else place
    cfg = base.config.replace(**lora)
    mappings = adapter_mappings(cfg)
    expected = {m.hf_name for m in mappings}
    missing, unexpected = sorted(expected - source.names), sorted(source.names - expected)
    if missing or unexpected:
        name = (missing or unexpected)[0]
        what = "missing tensor" if missing else "unexpected tensor"
        raise CheckpointError(
            f"{source.location(name)}: {what} {name!r} for a rank-{cfg.lora_rank} adapter on "
            f"{list(cfg.lora_targets)} ({len(missing)} missing, {len(unexpected)} unexpected)"
        )
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    variables = dict(nnx.to_flat_state(state))
    for path, variable in nnx.to_flat_state(nnx.state(base, nnx.Param)):
        variables[path].set_value(variable.get_value())
    read_tensors_into(variables, mappings, source, place, cfg.param_dtype)
    return nnx.merge(graphdef, state)


def adapter_tensors(model: Decoder):
    """(PEFT name, PEFT shape, thunk producing the host array) of every adapter matrix of `model`."""
    variables = dict(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
    for mapping in adapter_mappings(model.config):
        variable = variables[mapping.path]
        yield mapping.hf_name, mapping.hf_shape, host_fetcher(variable, mapping)


def adapter_files(path: str) -> tuple[str, str]:
    """(config file, weights file) of an adapter directory; FileNotFoundError naming what is missing."""
    files = (os.path.join(path, ADAPTER_CONFIG), os.path.join(path, ADAPTER_WEIGHTS))
    for file in files:
        if not os.path.exists(file):
            raise FileNotFoundError(f"{file}: missing (not a PEFT LoRA adapter directory?)")
    return files
