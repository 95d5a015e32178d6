"""coevo_jax: co-evolving LLM agents (target + failure agent) trained with DPO in JAX/Flax.

The pure loss functions live in `coevo_jax.losses`; the Flax NNX decoder in `coevo_jax.models`, its checkpoint
import/export in `coevo_jax.checkpoint_formats` and its tokenizers in `coevo_jax.tokenization`; trajectory data
and preference pairs in `coevo_jax.data`.
"""

__version__ = "0.1.0"
