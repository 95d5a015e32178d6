"""Qwen3.5's text decoder in `ModelConfig` terms: its Hugging Face `config.json` read and written.

Qwen3.5 interleaves gated delta-rule layers (`linear_attention`, `models.linear_attention`) with full
attention by `layer_types`; its full-attention layers gate their output with a second query projection and
turn only the first `rotary_dim` features of a head (`partial_rotary_factor`), and its RMSNorms scale by
1 + the stored weight. A text-only checkpoint (`qwen3_5_text`, `Qwen3_5ForCausalLM`) is read as it is; of
a multimodal one (`qwen3_5`) the `text_config` is taken, and its language model's tensors
(`text_stack_prefix`). Text takes the same position on the three rotary sections (time, height, width),
so the multimodal RoPE is the plain one there. Mixture-of-experts variants (`qwen3_5_moe`) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The multimodal checkpoint's language model, as its tensors are named (`Qwen3_5ForConditionalGeneration`).
MULTIMODAL_PREFIX = "model.language_model."
MOE_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")


def text_config(hf_config: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """The text stack's config: `hf_config` itself (`qwen3_5_text`) or its `text_config` (`qwen3_5`)."""
    model_type = hf_config.get("model_type")
    if model_type in MOE_MODEL_TYPES:
        raise ValueError(f"{source}: model_type={model_type!r}: mixture-of-experts blocks are not supported")
    if model_type == "qwen3_5_text":
        return hf_config
    text = hf_config.get("text_config")
    if not isinstance(text, Mapping) or text.get("model_type", "qwen3_5_text") != "qwen3_5_text":
        raise ValueError(f"{source}: a qwen3_5 checkpoint needs a text_config of model_type 'qwen3_5_text'")
    return text


def text_stack_prefix(hf_config: Mapping[str, Any]) -> str | None:
    """`MULTIMODAL_PREFIX` for a multimodal checkpoint (`qwen3_5`), None for a text-only one."""
    return MULTIMODAL_PREFIX if hf_config.get("model_type") == "qwen3_5" else None


def _rope(text: Mapping[str, Any], head_dim: int, source: str) -> tuple[float, int]:
    """(theta, rotary_dim) from `rope_parameters` (transformers 5.x) or the top-level fields."""
    params = dict(text.get("rope_parameters") or {})
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"{source}: unsupported rope_type={rope_type!r} (supported: default)")
    theta = float(params.get("rope_theta", text.get("rope_theta", 10_000.0)))
    partial = float(params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
    rotary_dim = int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"{source}: partial_rotary_factor={partial} gives an odd or empty rotary part")
    return theta, rotary_dim


def fields_from_hf(hf_config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`ModelConfig` fields of a `qwen3_5_text` config, or of a `qwen3_5` config's text stack."""
    text = text_config(hf_config, source)
    if text.get("attention_bias"):
        raise ValueError(f"{source}: attention_bias=true is not supported (Qwen3.5 has no attention biases)")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{source}: unsupported hidden_act={act!r} (only 'silu')")
    if text.get("num_experts"):
        raise ValueError(f"{source}: num_experts={text['num_experts']}: mixture-of-experts is not supported")
    layers = int(text.get("num_hidden_layers", 32))
    layer_types = list(text.get("layer_types") or [])
    if not layer_types:  # transformers' default: every `full_attention_interval`-th layer full attention
        interval = int(text.get("full_attention_interval", 4))
        layer_types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
        ]
    head_dim = int(text.get("head_dim", 256))
    theta, rotary_dim = _rope(text, head_dim, source)
    tie = hf_config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return dict(
        vocab_size=int(text.get("vocab_size", 248_320)),
        hidden_size=int(text.get("hidden_size", 4096)),
        intermediate_size=int(text.get("intermediate_size", 12_288)),
        num_layers=layers,
        num_heads=int(text.get("num_attention_heads", 16)),
        num_kv_heads=int(text.get("num_key_value_heads", 4)),
        head_dim=head_dim,
        rope_theta=theta,
        rotary_dim=rotary_dim,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(tie),
        max_position_embeddings=int(text.get("max_position_embeddings", 32_768)),
        bos_token_id=text.get("bos_token_id"),
        eos_token_id=hf_config.get("eos_token_id", text.get("eos_token_id")),
        pad_token_id=text.get("pad_token_id"),
        model_type="qwen3_5_text",
        qk_norm=True,
        layer_types=tuple(layer_types),
        zero_centered_norm=True,
        attention_output_gate=True,
        linear_key_heads=int(text.get("linear_num_key_heads", 16)),
        linear_value_heads=int(text.get("linear_num_value_heads", 32)),
        linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
        linear_conv_width=int(text.get("linear_conv_kernel_dim", 4)),
    )


def to_hf(cfg: Any) -> dict[str, Any]:
    """A `qwen3_5_text` `config.json` of the `ModelConfig` `cfg` that transformers loads as
    `Qwen3_5ForCausalLM` (`ModelConfig.to_hf` checks that it reads back as `cfg`)."""
    eos = list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim,
        },
        "attention_bias": False,
        "layer_types": list(cfg.layer_types),
        "linear_num_key_heads": cfg.linear_key_heads,
        "linear_num_value_heads": cfg.linear_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim,
        "linear_value_head_dim": cfg.linear_value_head_dim,
        "linear_conv_kernel_dim": cfg.linear_conv_width,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": str(cfg.param_dtype),
        "use_cache": True,
    }
