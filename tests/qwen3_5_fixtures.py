"""Tiny random Qwen3.5 text models for the tests: transformers' `Qwen3_5ForCausalLM` of a few shapes.

Every parameter is random (the zero-centred norms around zero, the gated norm around one, the delta rule's
decay rates spread over [0.1, 2]), so each option of the shape moves the logits. Faster decays (transformers
draws rates up to 16) leave a few tokens' delta-rule outputs near zero, which the gated norm scales up, so
that float32 rounding alone moves those logits by 1e-4 in transformers and here alike. torch and
transformers are imported lazily.
"""

from __future__ import annotations

import numpy as np

# Shapes: linear and full layers mixed in both orders, key heads serving groups of value heads, tied and
# untied embeddings, convolutions of width 4 and 2, a quarter and half of a head turning.
SHAPES = {
    "grouped_tied": dict(
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25},
    ),
    "full_first_untied": dict(
        num_hidden_layers=3,
        layer_types=["full_attention", "linear_attention", "linear_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=2,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
    ),
}


def qwen3_5_reference(shape: str, seed: int = 0, vocab_size: int = 300):
    """A float32 `Qwen3_5ForCausalLM` of `SHAPES[shape]`: hidden 48, 4 query heads and 2 key/value heads of
    16 on the full layers."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=48,
        intermediate_size=80,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        attn_implementation="eager",
        **SHAPES[shape],
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                tensor.copy_(1.0 + 0.1 * torch.randn_like(tensor))
            elif name.endswith("A_log"):
                tensor.copy_(torch.empty_like(tensor).uniform_(0.1, 2.0).log())
            elif name.endswith("conv1d.weight"):
                tensor.normal_(0.0, 0.5)
            else:
                tensor.normal_(0.0, 0.1)
    return model


def qwen3_5_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Reference float32 logits at positions `cumsum(mask) - 1`."""
    import torch

    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()
