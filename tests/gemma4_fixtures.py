"""Tiny random Gemma 4 text models for the tests: transformers' `Gemma4ForCausalLM` of a few shapes.

Every parameter and layer scalar is random (norm weights around one), so each option of the shape moves the
logits. torch and transformers are imported lazily.
"""

from __future__ import annotations

import numpy as np

# Shapes: sliding windows shorter than the 12-token test batch, two head sizes, keys as values on the full
# layers, KV sharing (with the double-wide MLP), untied embeddings, soft-capped logits.
SHAPES = {
    "window3_untied": dict(
        num_hidden_layers=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=3,
        tie_word_embeddings=False,
    ),
    "k_eq_v_softcap": dict(
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=5,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        final_logit_softcapping=3.0,
    ),
    "kv_shared": dict(
        num_hidden_layers=5,
        layer_types=[
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        ],
        sliding_window=4,
        num_kv_shared_layers=3,
        use_double_wide_mlp=True,
        final_logit_softcapping=30.0,
    ),
}


def gemma4_reference(shape: str, seed: int = 0, vocab_size: int = 300):
    """A float32 `Gemma4ForCausalLM` of `SHAPES[shape]`: hidden 64, 4 query heads, local heads 2 x 16,
    global heads of 32."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        hidden_size_per_layer_input=0,
        max_position_embeddings=256,
        attn_implementation="eager",
        **SHAPES[shape],
    )
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.copy_(1.0 + 0.1 * torch.randn_like(tensor))
            else:
                tensor.normal_(0.0, 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(1.0 + 0.2 * torch.randn_like(buffer))
    return model


def gemma4_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Reference float32 logits at positions `cumsum(mask) - 1`. `output_hidden_states` keeps transformers
    5.24 off its KV-sharing shortcut, which fails without per-layer inputs."""
    import torch

    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
            output_hidden_states=True,
        )
    return out.logits.float().numpy()
