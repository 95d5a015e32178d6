"""Read a llama.cpp GGUF checkpoint into a Hugging Face-style config, float32 tensors and a tokenizer.

`read_gguf(path)` is the single entry point: it dequantises every tensor with the `gguf` package,
renames llama.cpp tensor names to Hugging Face names (`blk.3.attn_q.weight` ->
`model.layers.3.self_attn.q_proj.weight`), keeps Hugging Face/torch layouts (`[out, in]` for linear
weights), undoes llama.cpp's rotary row permutation of llama q/k projections, and checks every shape
against the config it derives from the metadata. The result is plain NumPy, so the JAX model loader
and test-only torch references can both consume it.

Supported `general.architecture` values: `llama` (SmolLM2), `qwen2` (q/k/v biases) and `qwen3`
(per-head q/k RMSNorm). Anything else raises a `ValueError` naming the file and the architecture.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import gguf
import numpy as np
from transformers import PreTrainedTokenizerFast

from coevo_jax.tokenization.gguf import (
    load_gguf_tokenizer,
    metadata_value,
    open_gguf_reader,
    require_metadata,
    tokenizer_from_reader,
)

__all__ = ["GGUFCheckpoint", "read_gguf", "load_gguf_tokenizer"]


@dataclasses.dataclass(frozen=True)
class ArchitectureSpec:
    """How one llama.cpp architecture maps onto a Hugging Face model family."""

    model_type: str
    hf_architecture: str
    permuted_qk: bool  # llama.cpp's converter interleaves q/k rows for its rotary kernel
    qkv_bias: bool
    qk_norm: bool


ARCHITECTURES = {
    "llama": ArchitectureSpec("llama", "LlamaForCausalLM", permuted_qk=True, qkv_bias=False, qk_norm=False),
    "qwen2": ArchitectureSpec("qwen2", "Qwen2ForCausalLM", permuted_qk=False, qkv_bias=True, qk_norm=False),
    "qwen3": ArchitectureSpec("qwen3", "Qwen3ForCausalLM", permuted_qk=False, qkv_bias=False, qk_norm=True),
}

GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSOR_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
LAYER_TENSOR_PATTERN = re.compile(r"blk\.(\d+)\.(.+)")


@dataclasses.dataclass(frozen=True)
class GGUFCheckpoint:
    """A GGUF file as Hugging Face sees it: config.json-style dict, float32 tensors, tokenizer."""

    hf_config: dict[str, Any]
    tensors: dict[str, np.ndarray]
    tokenizer: PreTrainedTokenizerFast | None
    path: str


def read_gguf(path: str | os.PathLike[str], *, with_tokenizer: bool = True) -> GGUFCheckpoint:
    """Read, dequantise and validate a GGUF checkpoint (see the module docstring).

    `tokenizer` is None when `with_tokenizer` is false or the file has no `tokenizer.*` metadata.
    Raises FileNotFoundError for a missing file and ValueError naming the file (and tensor) otherwise.
    """
    reader = open_gguf_reader(path)
    path = str(reader.data.filename)
    architecture = require_metadata(reader, "general.architecture")
    spec = ARCHITECTURES.get(architecture)
    if spec is None:
        raise ValueError(
            f"GGUF file {path}: unsupported general.architecture {architecture!r}; "
            f"supported: {sorted(ARCHITECTURES)}"
        )
    tensor_names = [tensor.name for tensor in reader.tensors]
    hf_config = hf_config_from_metadata(reader, spec, architecture, tensor_names)
    tensors = {
        hf_tensor_name(tensor.name, path): dequantize_tensor(tensor, path) for tensor in reader.tensors
    }
    check_tensors(tensors, expected_tensor_shapes(hf_config, spec), path)
    if spec.permuted_qk:
        tensors = unpermute_attention_rows(tensors, hf_config)
    has_tokenizer = metadata_value(reader, "tokenizer.ggml.model") is not None
    tokenizer = tokenizer_from_reader(reader) if with_tokenizer and has_tokenizer else None
    return GGUFCheckpoint(hf_config=hf_config, tensors=tensors, tokenizer=tokenizer, path=path)


def hf_config_from_metadata(
    reader: gguf.GGUFReader, spec: ArchitectureSpec, architecture: str, tensor_names: list[str]
) -> dict[str, Any]:
    """A transformers `config.json`-style dict from `{architecture}.*` and `tokenizer.ggml.*` metadata."""

    def arch_value(key: str, default: Any = None) -> Any:
        return metadata_value(reader, f"{architecture}.{key}", default)

    def required_arch_value(key: str) -> Any:
        return require_metadata(reader, f"{architecture}.{key}")

    def count(key: str, value: Any) -> int:
        """A size or count from the metadata: a positive integer (not a string, not 0)."""
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(
                f"GGUF file {reader.data.filename}: metadata {architecture}.{key} must be a positive "
                f"integer, got {value!r}"
            )
        return int(value)

    hidden_size = count("embedding_length", required_arch_value("embedding_length"))
    num_heads = count("attention.head_count", required_arch_value("attention.head_count"))
    vocab_size = arch_value("vocab_size") or embedding_rows(reader)
    config = {
        "model_type": spec.model_type,
        "architectures": [spec.hf_architecture],
        "vocab_size": count("vocab_size", vocab_size),
        "hidden_size": hidden_size,
        "intermediate_size": count("feed_forward_length", required_arch_value("feed_forward_length")),
        "num_hidden_layers": count("block_count", required_arch_value("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": count(
            "attention.head_count_kv", arch_value("attention.head_count_kv", num_heads)
        ),
        "head_dim": count(
            "attention.key_length", arch_value("attention.key_length", hidden_size // num_heads)
        ),
        "hidden_act": "silu",
        "rope_theta": shortest_float(arch_value("rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling_from_metadata(reader, architecture),
        "rms_norm_eps": shortest_float(arch_value("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": count("context_length", arch_value("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": spec.qkv_bias,
        "attention_dropout": 0.0,
        "bos_token_id": metadata_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata_value(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata_value(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    if spec.model_type == "llama":
        config["mlp_bias"] = False
    else:
        config["use_sliding_window"] = False
    return config


def shortest_float(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def embedding_rows(reader: gguf.GGUFReader) -> int:
    """Vocabulary size read off `token_embd.weight` when the metadata does not state it."""
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            return int(tensor.shape[-1])  # ggml order: [hidden, vocab]
    raise ValueError(f"GGUF file {reader.data.filename} has no tensor 'token_embd.weight'")


def rope_scaling_from_metadata(reader: gguf.GGUFReader, architecture: str) -> dict[str, Any] | None:
    """`rope_scaling` for the config: None, or linear scaling; other schemes are rejected loudly."""
    scaling_type = metadata_value(reader, f"{architecture}.rope.scaling.type", "none")
    if scaling_type == "none":
        return None
    if scaling_type == "linear":
        factor = float(require_metadata(reader, f"{architecture}.rope.scaling.factor"))
        return {"rope_type": "linear", "factor": factor}
    raise ValueError(f"GGUF file {reader.data.filename}: rope scaling {scaling_type!r} is not supported")


def hf_tensor_name(gguf_name: str, path: str) -> str:
    """The Hugging Face name of a llama.cpp tensor (`blk.0.ffn_up.weight` -> `model.layers.0.mlp.up_proj.weight`)."""
    if gguf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[gguf_name]
    match = LAYER_TENSOR_PATTERN.fullmatch(gguf_name)
    if match and match.group(2) in LAYER_TENSOR_NAMES:
        return f"model.layers.{match.group(1)}.{LAYER_TENSOR_NAMES[match.group(2)]}"
    raise ValueError(f"GGUF file {path}: tensor {gguf_name!r} has no known Hugging Face name")


def dequantize_tensor(tensor: gguf.ReaderTensor, path: str) -> np.ndarray:
    """The tensor as an owned float32 array in NumPy order, which is Hugging Face order ([out, in]).

    ggml lists dims fastest-first (`ne = [in, out]`); the reader's NumPy view is already reversed.
    """
    try:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as error:
        raise ValueError(f"GGUF file {path}: cannot dequantise tensor {tensor.name!r}: {error}") from error
    expected_shape = tuple(int(dim) for dim in reversed(tensor.shape))
    if weights.shape != expected_shape:
        raise ValueError(
            f"GGUF file {path}: tensor {tensor.name!r} dequantised to shape {weights.shape}, "
            f"expected {expected_shape} from its ggml dims {list(tensor.shape)}"
        )
    return np.array(weights, dtype=np.float32, copy=True)


def unpermute_rotary_rows(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation, restoring Hugging Face's rotate-half row order.

    For each head, Hugging Face keeps the rotary pairs as (first half, second half) of the head's rows;
    llama.cpp's converter interleaves them (row 2j, 2j+1 = pair j) for its rotary kernel. Rows are
    viewed as [head, pair j, member] and swapped back to [head, member, pair j].
    """
    rows = weights.shape[0]
    half_head_dim = rows // num_heads // 2
    if half_head_dim * 2 * num_heads != rows:
        raise ValueError(f"{rows} rows cannot be split into {num_heads} heads of even size")
    grouped = weights.reshape(num_heads, half_head_dim, 2, *weights.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weights.shape)


def unpermute_attention_rows(tensors: dict[str, np.ndarray], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """`tensors` with every q/k projection (weight or bias) restored to Hugging Face row order."""
    heads_by_suffix = {
        "self_attn.q_proj.weight": config["num_attention_heads"],
        "self_attn.q_proj.bias": config["num_attention_heads"],
        "self_attn.k_proj.weight": config["num_key_value_heads"],
        "self_attn.k_proj.bias": config["num_key_value_heads"],
    }
    restored = dict(tensors)
    for name, weights in tensors.items():
        heads = next((n for suffix, n in heads_by_suffix.items() if name.endswith(suffix)), None)
        if heads is not None:
            restored[name] = unpermute_rotary_rows(weights, heads)
    return restored


def expected_tensor_shapes(config: dict[str, Any], spec: ArchitectureSpec) -> dict[str, tuple[int, ...]]:
    """Every required Hugging Face tensor name and its shape, derived from the config."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        layer_shapes = {
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
            "self_attn.q_proj.weight": (q_rows, hidden),
            "self_attn.k_proj.weight": (kv_rows, hidden),
            "self_attn.v_proj.weight": (kv_rows, hidden),
            "self_attn.o_proj.weight": (hidden, q_rows),
            "mlp.gate_proj.weight": (inner, hidden),
            "mlp.up_proj.weight": (inner, hidden),
            "mlp.down_proj.weight": (hidden, inner),
        }
        if spec.qkv_bias:
            layer_shapes |= {
                "self_attn.q_proj.bias": (q_rows,),
                "self_attn.k_proj.bias": (kv_rows,),
                "self_attn.v_proj.bias": (kv_rows,),
            }
        if spec.qk_norm:
            layer_shapes |= {
                "self_attn.q_norm.weight": (config["head_dim"],),
                "self_attn.k_norm.weight": (config["head_dim"],),
            }
        shapes |= {prefix + name: shape for name, shape in layer_shapes.items()}
    return shapes


def check_tensors(tensors: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], path: str) -> None:
    """Raise a ValueError naming the file and tensor if one is missing, unexpected or mis-shaped."""
    for name, shape in expected.items():
        if name not in tensors:
            raise ValueError(f"GGUF file {path}: missing tensor {name!r} (expected shape {shape})")
        if tensors[name].shape != shape:
            raise ValueError(
                f"GGUF file {path}: tensor {name!r} has shape {tensors[name].shape}, expected {shape}"
            )
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise ValueError(f"GGUF file {path}: unexpected tensors for this config: {unexpected}")
