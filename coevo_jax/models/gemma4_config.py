"""Gemma 4's text decoder in `ModelConfig` terms: its Hugging Face `config.json` read and written.

Gemma 4 is the decoder's Gemma-style options together (`ModelConfig.layer_types` interleaving sliding and
full attention, a second head size and key/value head count on the full layers with their own partial
RoPE, q/k/v norms, attention scale 1, sandwich norms, a learned scalar per layer, scaled embeddings,
soft-capped logits, GELU, keys as values on full layers, KV sharing). A text-only checkpoint
(`gemma4_text`, `Gemma4ForCausalLM`) is read as it is; of a multimodal one (`gemma4`) the `text_config`
is taken, and its language model's tensors (`text_stack_prefix`). What the decoder does not
compute (mixture-of-experts blocks, per-layer input embeddings, bidirectional attention) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The multimodal checkpoint's language model, as its tensors are named (`Gemma4ForConditionalGeneration`).
MULTIMODAL_PREFIX = "model.language_model."
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "silu": "silu"}


def text_config(hf_config: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """The text stack's config: `hf_config` itself (`gemma4_text`) or its `text_config` (`gemma4`)."""
    if hf_config.get("model_type") == "gemma4_text":
        return hf_config
    text = hf_config.get("text_config")
    if not isinstance(text, Mapping) or text.get("model_type", "gemma4_text") != "gemma4_text":
        raise ValueError(f"{source}: a gemma4 checkpoint needs a text_config of model_type 'gemma4_text'")
    return text


def _refuse_unsupported(text: Mapping[str, Any], source: str) -> None:
    refused = {
        "enable_moe_block": "mixture-of-experts blocks",
        "hidden_size_per_layer_input": "per-layer input embeddings",
        "use_bidirectional_attention": "bidirectional attention",
        "attention_bias": "attention biases",
    }
    for key, what in refused.items():
        if text.get(key):
            raise ValueError(f"{source}: {key}={text[key]!r}: {what} are not supported (dense text decoder)")


def _rope(text: Mapping[str, Any], layer_type: str, source: str) -> tuple[float, float]:
    """(theta, partial rotary factor) of one layer type's `rope_parameters`."""
    params = (text.get("rope_parameters") or {}).get(layer_type) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional") or float(params.get("factor", 1.0)) != 1.0:
        raise ValueError(f"{source}: {layer_type} rope {dict(params)} (supported: default, proportional)")
    default_theta = 10_000.0 if layer_type == "sliding_attention" else 1_000_000.0
    partial = float(params.get("partial_rotary_factor", 1.0)) if rope_type == "proportional" else 1.0
    return float(params.get("rope_theta", default_theta)), partial


def _global_heads(text: Mapping[str, Any], layer_types: list[str]) -> tuple[int | None, int | None]:
    """(head size, key/value heads) of the full-attention layers, from `per_layer_config` (what
    transformers writes) or `global_head_dim` / `num_global_key_value_heads` (the published configs)."""
    per_layer = text.get("per_layer_config") or {}
    for index, layer_type in enumerate(layer_types):
        if layer_type == "full_attention" and str(index) in per_layer:
            entry = per_layer[str(index)]
            return entry.get("head_dim"), entry.get("num_key_value_heads")
    kv_heads = text.get("num_global_key_value_heads") if text.get("attention_k_eq_v", False) else None
    return text.get("global_head_dim", 512), kv_heads


def fields_from_hf(hf_config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`ModelConfig` fields of a `gemma4_text` config, or of a `gemma4` config's text stack."""
    text = text_config(hf_config, source)
    _refuse_unsupported(text, source)
    layers = int(text.get("num_hidden_layers", 30))
    layer_types = list(text.get("layer_types") or [])
    if not layer_types:  # transformers' default: five sliding layers, then one full
        layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    layer_types[-1] = "full_attention"  # as transformers forces it
    act = text.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise ValueError(f"{source}: unsupported hidden_activation={act!r}")
    local_theta, local_partial = _rope(text, "sliding_attention", source)
    global_theta, global_partial = _rope(text, "full_attention", source)
    global_head_dim, global_kv_heads = _global_heads(text, layer_types)
    heads = int(text.get("num_attention_heads", 8))
    softcap = text.get("final_logit_softcapping")
    return dict(
        vocab_size=int(text.get("vocab_size", 262_144)),
        hidden_size=int(text.get("hidden_size", 2304)),
        intermediate_size=int(text.get("intermediate_size", 9216)),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads", 4)),
        head_dim=int(text.get("head_dim", 256)),
        rope_theta=local_theta,
        partial_rotary_factor=local_partial,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))),
        max_position_embeddings=int(text.get("max_position_embeddings", 131_072)),
        bos_token_id=text.get("bos_token_id", 2),
        eos_token_id=hf_config.get("eos_token_id", text.get("eos_token_id", 1)),
        pad_token_id=text.get("pad_token_id", 0),
        model_type="gemma4_text",
        qk_norm=True,
        hidden_act=_ACTIVATIONS[act],
        layer_types=tuple(layer_types),
        sliding_window=int(text.get("sliding_window", 512)),
        global_head_dim=None if global_head_dim is None else int(global_head_dim),
        global_kv_heads=None if global_kv_heads is None else int(global_kv_heads),
        global_rope_theta=global_theta,
        global_partial_rotary_factor=global_partial,
        attention_k_eq_v=bool(text.get("attention_k_eq_v", False)),
        num_kv_shared_layers=int(text.get("num_kv_shared_layers", 0)),
        double_wide_mlp=bool(text.get("use_double_wide_mlp", False)),
        query_scale=1.0,
        value_norm=True,
        sandwich_norm=True,
        layer_scalar=True,
        embed_scale=True,
        final_logit_softcap=None if softcap is None else float(softcap),
    )


def text_stack_prefix(hf_config: Mapping[str, Any]) -> str | None:
    """`MULTIMODAL_PREFIX` for a multimodal checkpoint (`gemma4`), None for a text-only one."""
    return MULTIMODAL_PREFIX if hf_config.get("model_type") == "gemma4" else None


def to_hf(cfg: Any) -> dict[str, Any]:
    """A `gemma4_text` `config.json` of the `ModelConfig` `cfg` that transformers loads as `Gemma4ForCausalLM`
    (`ModelConfig.to_hf` checks that it reads back as `cfg`)."""
    eos = list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id
    full_rope = {"rope_type": "proportional", "rope_theta": cfg.global_rope_theta or cfg.rope_theta}
    full_rope["partial_rotary_factor"] = cfg.global_partial_rotary_factor
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "global_head_dim": cfg.global_head_dim if cfg.global_head_dim is not None else cfg.head_dim,
        "num_global_key_value_heads": cfg.global_kv_heads if cfg.attention_k_eq_v else None,
        "hidden_activation": "gelu_pytorch_tanh" if cfg.hidden_act == "gelu_tanh" else cfg.hidden_act,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "full_attention": full_rope,
        },
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layer_types),
        "final_logit_softcapping": cfg.final_logit_softcap,
        "attention_bias": False,
        "attention_k_eq_v": cfg.attention_k_eq_v,
        "num_kv_shared_layers": cfg.num_kv_shared_layers,
        "use_double_wide_mlp": cfg.double_wide_mlp,
        "hidden_size_per_layer_input": 0,
        "enable_moe_block": False,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": str(cfg.param_dtype),
        "use_cache": True,
    }
