"""Flax NNX decoder (Llama/Qwen families) with optional LoRA adapters and its KV cache: the network alone.

Its checkpoint formats (Hugging Face, GGUF, PEFT) are `coevo_jax.checkpoint_formats`, its tokenizers
`coevo_jax.tokenization`; which implementation computes each platform-specific operation is chosen once, where
the decoder is built (`coevo_jax.models.kernels`).
"""

from coevo_jax.models.config import Llama3RopeScaling, ModelConfig
from coevo_jax.models.decoder import Decoder, abstract_model, init_cache
from coevo_jax.models.kv_cache import KVCache
from coevo_jax.models.partition import bind, combine_trainable, partition_trainable

__all__ = [
    "Decoder",
    "KVCache",
    "Llama3RopeScaling",
    "ModelConfig",
    "abstract_model",
    "bind",
    "combine_trainable",
    "init_cache",
    "partition_trainable",
]
