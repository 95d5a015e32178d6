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
