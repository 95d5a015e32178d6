"""The policy's architecture, tokenizer and starting parameters for `cfg.model`.

`model.source` is 'scratch' (a `ModelConfig` from the spec's sizes, random parameters, a tokenizer trained
on the experts' text) or a checkpoint: 'smollm2' (the bundled GGUF), a Hugging Face directory or a .gguf
file, loaded tensor by tensor into its shardings. Either way the spec's dtype policy (compute, parameter
storage, rematerialisation) and LoRA settings are applied to the resulting config; the checkpoint's
parameters are then the frozen base of LoRA.
"""

from __future__ import annotations

import os

import jax
from jax.sharding import Mesh

from coevo_jax import sharding
from coevo_jax.checkpoint_formats.bundled import smollm2_gguf_path
from coevo_jax.experiment import processes
from coevo_jax.experiment.config import ModelSpec
from coevo_jax.experiment.tokenizer import scratch_tokenizer
from coevo_jax.models import ModelConfig
from coevo_jax.train.state import load_sharded


def checkpoint_path(source: str) -> str:
    """The file or directory behind `model.source` ('smollm2' is the bundled GGUF)."""
    return smollm2_gguf_path() if source == "smollm2" else os.path.expanduser(source)


def policy_model(
    spec: ModelSpec, workdir: str, experts, mesh: Mesh, rules: sharding.ShardingRules
) -> tuple[ModelConfig, object, dict | None]:
    """(model config with the training dtype policy, tokenizer, checkpoint parameters or None for scratch)."""
    pretrained = None
    if spec.source == "scratch":
        tokenizer = processes.primary_first(  # trained and saved by process 0, read by the others
            "tokenizer", lambda: scratch_tokenizer(workdir, experts, spec.vocab_size)
        )
        model_cfg = ModelConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_layers=spec.num_layers,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            token_shift=spec.token_shift,
        )
    else:
        if spec.token_shift:
            raise ValueError(f"model.token_shift={spec.token_shift}: only a scratch model can have one")
        model_cfg, _, pretrained, tokenizer = load_sharded(checkpoint_path(spec.source), mesh, rules)
        if tokenizer is None:
            raise ValueError(f"{spec.source}: the checkpoint has no tokenizer")
    model_cfg = model_cfg.replace(
        dtype=spec.compute_dtype,
        param_dtype=spec.param_dtype,
        remat=spec.remat,
        unroll_layers=spec.unroll_layers,
        right_padded=spec.right_padded,
        attention=spec.attention,
        lora_rank=spec.lora_rank,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        lora_targets=spec.lora_targets,
    )
    if pretrained is not None:
        pretrained = jax.tree.map(lambda p: p.astype(model_cfg.param_dtype), pretrained)
    return model_cfg, tokenizer, pretrained
