"""Llama, Qwen2 and Qwen3 (SmolLM2 is a Llama) in `ModelConfig` terms: their Hugging Face `config.json`
read and written.

The three differ in a few flags: Qwen2's q/k/v bias without an output bias, Llama's one bias flag (and MLP
bias), Qwen3's per-head q/k RMSNorm; Llama-3 adds its frequency-dependent RoPE rescaling. Both config
layouts are read: transformers 5.x's `rope_parameters` and 4.x's `rope_theta` / `rope_scaling`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama-3.1 style frequency-dependent RoPE rescaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def text_stack_prefix(hf_config: Mapping[str, Any]) -> str | None:
    """None: these checkpoints hold a text model only."""
    del hf_config
    return None


def fields_from_hf(hf_config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`ModelConfig` fields of a `llama`, `qwen2` or `qwen3` config."""
    model_type = hf_config["model_type"]
    act = hf_config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{source}: unsupported hidden_act={act!r} (only 'silu' / SwiGLU)")
    if hf_config.get("use_sliding_window"):
        raise ValueError(f"{source}: sliding-window attention (use_sliding_window=true) is not supported")

    def count(key: str, default: int | None = None) -> int:
        """A size or count: a positive integer; missing (without a default), a string or 0 is an error."""
        value = hf_config.get(key) if hf_config.get(key) is not None else default
        if value is None:
            raise ValueError(f"{source}: missing field {key!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{source}: field {key!r} must be a positive integer, got {value!r}")
        return value

    hidden = count("hidden_size")
    num_heads = count("num_attention_heads")
    theta, scaling = _rope_from_hf(hf_config, source)
    bias = bool(hf_config.get("attention_bias", False))
    fields = dict(
        vocab_size=count("vocab_size"),
        hidden_size=hidden,
        intermediate_size=count("intermediate_size"),
        num_layers=count("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=count("num_key_value_heads", num_heads),
        head_dim=count("head_dim", hidden // num_heads),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v bias and no output bias; Llama/Qwen3 use one flag for both.
        attention_bias=True if model_type == "qwen2" else bias,
        attention_out_bias=False if model_type == "qwen2" else bias,
        mlp_bias=bool(hf_config.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=count("max_position_embeddings", 4096),
        bos_token_id=hf_config.get("bos_token_id"),
        eos_token_id=hf_config.get("eos_token_id"),
        pad_token_id=hf_config.get("pad_token_id"),
        model_type=model_type,
    )
    return fields


def to_hf(cfg: Any) -> dict[str, Any]:
    """A `config.json` of the `ModelConfig` `cfg` that transformers (4.x and 5.x) loads as the matching
    *ForCausalLM (`ModelConfig.to_hf` checks that it reads back as `cfg`)."""
    if cfg.model_type == "qwen2" and (not cfg.attention_bias or cfg.attention_out_bias):
        raise ValueError("qwen2 requires q/k/v bias and no output bias")
    if cfg.model_type != "qwen2" and cfg.attention_bias != cfg.attention_out_bias:
        raise ValueError(f"{cfg.model_type} uses one attention_bias flag for q/k/v and output")
    if cfg.qk_norm != (cfg.model_type == "qwen3"):
        raise ValueError("qk_norm is exactly the qwen3 architecture")
    if cfg.mlp_bias and cfg.model_type != "llama":
        raise ValueError("mlp_bias is only expressible for model_type 'llama'")
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope_parameters.update(rope_type="llama3", **dataclasses.asdict(cfg.rope_scaling))
    eos = list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[cfg.model_type]],
        "model_type": cfg.model_type,
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
        # 5.x reads `rope_parameters`; 4.x reads `rope_theta` + `rope_scaling`.
        "rope_parameters": rope_parameters,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_scaling is None else dict(rope_parameters),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": np.dtype(cfg.param_dtype).name,
        "use_cache": True,
    }
    if cfg.model_type != "qwen2":
        out["attention_bias"] = cfg.attention_bias
    if cfg.model_type == "llama":
        out["mlp_bias"] = cfg.mlp_bias
    return out


def _rope_from_hf(hf_config: Mapping[str, Any], source: str) -> tuple[float, Llama3RopeScaling | None]:
    """Reads (theta, scaling) from either `rope_parameters` (5.x) or `rope_theta`/`rope_scaling` (4.x)."""
    params = dict(hf_config.get("rope_parameters") or {})
    legacy = hf_config.get("rope_scaling") or {}
    params = {**legacy, **params}
    theta = float(params.get("rope_theta", hf_config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in (None, "default"):
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"{source}: unsupported rope_type={rope_type!r} (supported: default, llama3)")
    try:
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as missing:
        raise ValueError(f"{source}: llama3 rope scaling lacks {missing}") from None
    return theta, scaling
