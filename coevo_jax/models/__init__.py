"""Flax NNX decoder (Llama/Qwen families), its KV cache, and Hugging Face checkpoint import/export."""

from coevo_jax.models.config import Llama3RopeScaling, ModelConfig
from coevo_jax.models.decoder import Decoder, abstract_model, bind
from coevo_jax.models.hf_params import CheckpointError, TensorSource, decoder_from_hf_tensors
from coevo_jax.models.kv_cache import KVCache, init_cache
from coevo_jax.models.loading import load_pretrained, save_pretrained

__all__ = [
    "CheckpointError",
    "Decoder",
    "KVCache",
    "Llama3RopeScaling",
    "ModelConfig",
    "TensorSource",
    "abstract_model",
    "bind",
    "decoder_from_hf_tensors",
    "init_cache",
    "load_pretrained",
    "save_pretrained",
]
