"""Shared helpers for the model tests: tiny configs, randomised models, padded batches, torch references.

Kept out of conftest.py (owned elsewhere); test modules import what they need. torch is imported lazily,
only by the builders that need a reference model.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from coevo_jax.models import Decoder, Llama3RopeScaling, ModelConfig

VOCAB = 300

# Every optional feature at once (q/k/v + output bias, q/k norm, llama3 RoPE scaling, GQA): the decoder and
# cache tests then cover all code paths with one compiled model.
KITCHEN_SINK = ModelConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=500000.0,
    rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 64),
    attention_bias=True,
    attention_out_bias=True,
    qk_norm=True,
    model_type="qwen3",
    token_shift=3,
)


def random_decoder(cfg: ModelConfig, seed: int = 0) -> Decoder:
    """A decoder whose every parameter (biases and norm scales included) is random and non-trivial.

    Filled from NumPy on an abstract model: XLA-compiling one RNG kernel per parameter shape is slow.
    """
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed))))
    rng = np.random.RandomState(seed)
    for path, variable in nnx.to_flat_state(state):
        shape, dtype = variable.get_value().shape, variable.get_value().dtype
        base = 1.0 if "scale" in path else 0.0  # RMSNorm scales around one, the rest around zero
        variable.set_value(jnp.asarray((base + 0.1 * rng.standard_normal(shape)).astype(np.float32), dtype))
    return nnx.merge(graphdef, state)


def with_config(model: Decoder, cfg: ModelConfig) -> Decoder:
    """The same parameters under a different (compatible) config, e.g. another compute dtype or remat."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, nnx.state(model))


def padded_batch(lengths_and_sides, total_len: int, seed: int = 0):
    """Random ids [B, T] and mask [B, T]: row i has `length` valid tokens padded on `side` ('left'/'right')."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(1, VOCAB, size=(len(lengths_and_sides), total_len)).astype(np.int32)
    mask = np.zeros_like(ids)
    for row, (length, side) in enumerate(lengths_and_sides):
        if side == "left":
            mask[row, total_len - length :] = 1
        else:
            mask[row, :length] = 1
    ids = np.where(mask > 0, ids, 0).astype(np.int32)
    return ids, mask


def torch_reference(family: str, seed: int = 0):
    """A tiny random float32 transformers model of `family` with randomised biases and norm weights."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    if family == "llama2":
        config, cls = LlamaConfig(**common, rope_theta=10000.0), LlamaForCausalLM
    elif family == "llama3":
        scaling = dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )
        config, cls = LlamaConfig(**common, rope_theta=500000.0, rope_scaling=scaling), LlamaForCausalLM
    elif family == "qwen2":
        config, cls = Qwen2Config(**common, rope_theta=1000000.0), Qwen2ForCausalLM
    elif family == "qwen3":
        config = Qwen3Config(**{**common, "num_hidden_layers": 3}, head_dim=32, rope_theta=1000000.0)
        cls = Qwen3ForCausalLM
    elif family == "smollm2":
        config, cls = LlamaConfig(**common, tie_word_embeddings=True), LlamaForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.copy_(1.0 + 0.1 * torch.randn_like(tensor))
            else:
                tensor.normal_(0.0, 0.1)
    return model


def torch_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Reference float32 logits with positions `cumsum(mask) - 1`, as the JAX decoder computes them."""
    import torch

    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def max_abs_on_valid(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Largest |a - b| over positions where mask is 1 (logits of padding are unspecified)."""
    valid = np.asarray(mask, bool)
    return float(np.max(np.abs(np.asarray(a)[valid] - np.asarray(b)[valid])))


def with_random_adapters(model: Decoder, seed: int = 0, **lora) -> Decoder:
    """`model`'s weights plus LoRA adapters (`lora`: ModelConfig LoRA fields) whose A and B are both random,
    so that, unlike fresh adapters (B = 0), they change the model's output."""
    cfg = model.config.replace(**lora)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed))))
    base = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    rng = np.random.RandomState(seed)
    for path, variable in nnx.to_flat_state(state):
        if path in base:
            variable.set_value(base[path].get_value())
        else:
            shape, dtype = variable.get_value().shape, variable.get_value().dtype
            variable.set_value(jnp.asarray(0.1 * rng.standard_normal(shape), dtype))
    return nnx.merge(graphdef, state)
