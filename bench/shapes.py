"""The model configs the benchmark scripts share (run them as `python bench/<script>.py`)."""

from __future__ import annotations

import anchor
import jax.numpy as jnp

from coevo_jax.models import ModelConfig


def anchor_config(dtype=jnp.float32, vocab_size: int | None = None) -> ModelConfig:
    """Issue 8's anchor model (`anchor.MODEL`) with float32 parameters and `dtype` compute.

    `vocab_size` replaces the anchor's 8192 for scripts that bring their own tokenizer.
    """
    fields = dict(anchor.MODEL) if vocab_size is None else {**anchor.MODEL, "vocab_size": vocab_size}
    return ModelConfig(**fields, dtype=dtype)


def smollm2_config(dtype=jnp.float32, **changes) -> ModelConfig:
    """SmolLM2-135M's architecture (30 layers, width 576, 9 query / 3 kv heads, vocabulary 49,152, tied
    embeddings), read from the bundled GGUF's metadata only: no tensor is decoded.

    `changes` replace fields (e.g. `lora_rank=16`, `remat=True`); parameters are float32, compute `dtype`.
    """
    from coevo_jax.models import gguf
    from coevo_jax.models.bundled import smollm2_gguf_path

    reader = gguf.open_gguf_reader(smollm2_gguf_path())
    architecture = gguf.require_metadata(reader, "general.architecture")
    names = [tensor.name for tensor in reader.tensors]
    hf_config = gguf.hf_config_from_metadata(reader, gguf.ARCHITECTURES[architecture], architecture, names)
    return ModelConfig.from_hf(hf_config, dtype=dtype, **changes)


DECODE_MODELS = ("anchor", "smollm2")  # the shapes the decode profilers take by name


def decode_model_config(name: str) -> ModelConfig:
    """The float32 config of one of `DECODE_MODELS` (the anchor's or SmolLM2's architecture)."""
    if name not in DECODE_MODELS:
        raise ValueError(f"unknown model {name!r}: expected one of {DECODE_MODELS}")
    return anchor_config(jnp.float32) if name == "anchor" else smollm2_config(jnp.float32)
