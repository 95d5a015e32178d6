"""Flax NNX decoder (Llama/Qwen families) with optional LoRA adapters, its KV cache, and Hugging Face
checkpoint (and PEFT adapter) import/export."""

from coevo_jax.models.config import Llama3RopeScaling, ModelConfig
from coevo_jax.models.decoder import (
    Decoder,
    abstract_model,
    bind,
    combine_trainable,
    partition_trainable,
)
from coevo_jax.models.hf_params import CheckpointError, TensorSource, decoder_from_hf_tensors
from coevo_jax.models.kv_cache import KVCache, init_cache
from coevo_jax.models.loading import load_pretrained, save_adapter, save_pretrained

__all__ = [
    "CheckpointError",
    "Decoder",
    "KVCache",
    "Llama3RopeScaling",
    "ModelConfig",
    "TensorSource",
    "abstract_model",
    "bind",
    "combine_trainable",
    "decoder_from_hf_tensors",
    "init_cache",
    "load_pretrained",
    "partition_trainable",
    "save_adapter",
    "save_pretrained",
]
