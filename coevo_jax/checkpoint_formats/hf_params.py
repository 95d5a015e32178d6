"""Mapping between Hugging Face tensor names/layouts and the decoder's NNX parameters.

`tensor_mappings(cfg)` lists, for every HF tensor, its name (e.g. `model.layers.0.self_attn.q_proj.weight`),
its path in `nnx.state(Decoder)` - with the layer's index on the leading axis of the stacked layer weights
(`("layers", "attn", "q_kernel")`, layer 0) - and the two pure layout conversions (torch `[out, in]` <->
our `[in, heads, head_dim]` etc.). `decoder_from_hf_tensors` builds a model from any `TensorSource`
(safetensors files, a GGUF file's dequantised tensors, ...) one parameter at a time: the model is created
abstractly, each tensor is read, checked, converted and cast (a stacked weight's L tensors into one host
array), and each parameter is handed to a `place` callback (default: `jax.device_put`; a sharded loader
passes one that puts it straight into its sharding), so the full model never exists twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from flax import nnx

from coevo_jax.models.config import ModelConfig
from coevo_jax.models.decoder import Decoder

# Tensors some checkpoints carry that have no parameter (recomputed RoPE tables).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

PlaceFn = Callable[[str, np.ndarray, tuple[str, ...]], jax.Array]


class CheckpointError(ValueError):
    """A checkpoint does not match the architecture: missing, unexpected or mis-shaped tensor."""


@dataclasses.dataclass(frozen=True)
class TensorMapping:
    """One HF tensor: its name and shape, the NNX state path of its parameter (and its index on the
    stacked layers' leading axis, or None), and layout conversions in both directions."""

    hf_name: str
    path: tuple[str, ...]
    hf_shape: tuple[int, ...]
    to_nnx: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    layer: int | None = None


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """Lazy access to named HF-layout tensors: `read(name)` loads one; `location(name)` names its file."""

    names: frozenset[str]
    read: Callable[[str], np.ndarray]
    location: Callable[[str], str]


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _transpose(x: np.ndarray) -> np.ndarray:
    return x.T


def tensor_mappings(cfg: ModelConfig) -> list[TensorMapping]:
    """All parameters of `Decoder(cfg)` with their HF counterparts, in checkpoint order."""
    d, v = cfg.hidden_size, cfg.vocab_size
    out = [TensorMapping("model.embed_tokens.weight", ("embed",), (v, d), _identity, _identity)]
    for i in range(cfg.num_layers):
        stack, index = cfg.layer_site(i)
        layer_cfg = cfg.kind_config(stack[1]) if cfg.layer_types else cfg
        out += [
            TensorMapping(f"model.layers.{i}.{name}", (*stack, *path), **conv, layer=index)
            for name, path, conv in _layer_entries(layer_cfg)
        ]
    out.append(TensorMapping("model.norm.weight", ("final_norm", "scale"), (d,), _identity, _identity))
    if not cfg.tie_word_embeddings:
        out.append(TensorMapping("lm_head.weight", ("lm_head",), (v, d), _transpose, _transpose))
    return out


def _vector(n: int) -> dict[str, Any]:
    return dict(hf_shape=(n,), to_nnx=_identity, to_hf=_identity)


def _dense(n_in: int, n_out: int) -> dict[str, Any]:  # HF [out, in] <-> [in, out]
    return dict(hf_shape=(n_out, n_in), to_nnx=_transpose, to_hf=_transpose)


def _heads_in(d: int, heads: int, e: int) -> dict[str, Any]:  # HF [heads*E, D] <-> [D, heads, E]
    return dict(
        hf_shape=(heads * e, d),
        to_nnx=lambda w: w.T.reshape(d, heads, e),
        to_hf=lambda w: w.reshape(d, heads * e).T,
    )


def _heads_out(heads: int, e: int, d: int) -> dict[str, Any]:  # HF [D, heads*E] <-> [heads, E, D]
    return dict(
        hf_shape=(d, heads * e),
        to_nnx=lambda w: w.T.reshape(heads, e, d),
        to_hf=lambda w: w.reshape(heads * e, d).T,
    )


def _layer_entries(cfg: ModelConfig) -> list[tuple[str, tuple, dict[str, Any]]]:
    """(HF name inside `model.layers.<i>.`, path in the block, shape and conversions) of one block of `cfg`
    (a `kind_config` view when the model has several kinds of layer)."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    linear = cfg.block_kind == "linear_attention"
    # Gemma's sandwich: `post_attention_layernorm` norms the attention output, `pre_feedforward_layernorm`
    # the MLP input (our `post_attn_norm`, Llama's `post_attention_layernorm`).
    pre_mlp = "pre_feedforward_layernorm.weight" if cfg.sandwich_norm else "post_attention_layernorm.weight"
    entries: list[tuple[str, tuple, dict[str, Any]]] = [
        ("input_layernorm.weight", ("input_norm", "scale"), _vector(d)),
        *(_linear_entries(cfg) if linear else _attention_entries(cfg)),
        (pre_mlp, ("post_attn_norm", "scale"), _vector(d)),
        ("mlp.gate_proj.weight", ("mlp", "gate_kernel"), _dense(d, f)),
        ("mlp.up_proj.weight", ("mlp", "up_kernel"), _dense(d, f)),
        ("mlp.down_proj.weight", ("mlp", "down_kernel"), _dense(f, d)),
    ]
    if cfg.sandwich_norm:
        entries += [
            ("post_attention_layernorm.weight", ("attn_out_norm", "scale"), _vector(d)),
            ("post_feedforward_layernorm.weight", ("mlp_out_norm", "scale"), _vector(d)),
        ]
    if cfg.layer_scalar:
        entries.append(("layer_scalar", ("scalar",), _vector(1)))
    if cfg.mlp_bias:
        entries += [
            ("mlp.gate_proj.bias", ("mlp", "gate_bias"), _vector(f)),
            ("mlp.up_proj.bias", ("mlp", "up_bias"), _vector(f)),
            ("mlp.down_proj.bias", ("mlp", "down_bias"), _vector(d)),
        ]
    return entries


def _attention_entries(cfg: ModelConfig) -> list[tuple[str, tuple, dict[str, Any]]]:
    """The entries of an attention layer's token mixer (`blocks.Attention`)."""
    d, h, k, e = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    own_k, own_v = not cfg.shares_kv, not cfg.shares_kv and not cfg.attention_k_eq_v
    q_width = 2 * e if cfg.attention_output_gate else e  # Qwen3.5: each head's query, then its output gate
    entries = [("self_attn.q_proj.weight", ("attn", "q_kernel"), _heads_in(d, h, q_width))]
    entries += [("self_attn.k_proj.weight", ("attn", "k_kernel"), _heads_in(d, k, e))] if own_k else []
    entries += [("self_attn.v_proj.weight", ("attn", "v_kernel"), _heads_in(d, k, e))] if own_v else []
    entries.append(("self_attn.o_proj.weight", ("attn", "o_kernel"), _heads_out(h, e, d)))

    def bias(heads: int, width: int):  # HF [heads*E] <-> [heads, E]
        return dict(
            hf_shape=(heads * width,),
            to_nnx=lambda b: b.reshape(heads, width),
            to_hf=lambda b: b.reshape(heads * width),
        )

    if cfg.attention_bias:
        entries.append(("self_attn.q_proj.bias", ("attn", "q_bias"), bias(h, q_width)))
        entries += [("self_attn.k_proj.bias", ("attn", "k_bias"), bias(k, e))] if own_k else []
        entries += [("self_attn.v_proj.bias", ("attn", "v_bias"), bias(k, e))] if own_v else []
    if cfg.attention_out_bias:
        entries.append(("self_attn.o_proj.bias", ("attn", "o_bias"), _vector(d)))
    if cfg.qk_norm:
        entries.append(("self_attn.q_norm.weight", ("attn", "q_norm", "scale"), _vector(e)))
        entries += [("self_attn.k_norm.weight", ("attn", "k_norm", "scale"), _vector(e))] if own_k else []
    return entries


def _linear_entries(cfg: ModelConfig) -> list[tuple[str, tuple, dict[str, Any]]]:
    """The entries of a linear-attention layer's token mixer (`linear_attention.LinearAttention`)."""
    d, heads, ev, width = (
        cfg.hidden_size,
        cfg.linear_value_heads,
        cfg.linear_value_head_dim,
        cfg.linear_conv_width,
    )
    c = 2 * cfg.linear_key_heads * cfg.linear_key_head_dim + heads * ev
    conv = dict(  # torch's depthwise Conv1d weight [C, 1, W] <-> [W, C]
        hf_shape=(c, 1, width), to_nnx=lambda w: w[:, 0, :].T, to_hf=lambda w: w.T[:, None, :]
    )
    return [
        ("linear_attn.in_proj_qkv.weight", ("attn", "qkv_kernel"), _dense(d, c)),
        ("linear_attn.in_proj_z.weight", ("attn", "z_kernel"), _heads_in(d, heads, ev)),
        ("linear_attn.in_proj_b.weight", ("attn", "beta_kernel"), _dense(d, heads)),
        ("linear_attn.in_proj_a.weight", ("attn", "decay_kernel"), _dense(d, heads)),
        ("linear_attn.conv1d.weight", ("attn", "conv_kernel"), conv),
        ("linear_attn.dt_bias", ("attn", "dt_bias"), _vector(heads)),
        ("linear_attn.A_log", ("attn", "a_log"), _vector(heads)),
        ("linear_attn.norm.weight", ("attn", "norm", "scale"), _vector(ev)),
        ("linear_attn.out_proj.weight", ("attn", "out_kernel"), _heads_out(heads, ev, d)),
    ]


def default_place(name: str, value: np.ndarray, logical_axes: tuple[str, ...]) -> jax.Array:
    """Puts a parameter on the default device (ignores the logical axes)."""
    del name, logical_axes
    return jax.device_put(value)


def _check_names(cfg: ModelConfig, mappings: list[TensorMapping], source: TensorSource) -> None:
    expected = {m.hf_name for m in mappings}
    missing = sorted(expected - source.names)
    if missing:
        raise CheckpointError(
            f"{source.location(missing[0])}: missing tensor {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    unexpected = sorted(
        name
        for name in source.names - expected
        if not name.endswith(_IGNORED_SUFFIXES) and not (cfg.tie_word_embeddings and name == "lm_head.weight")
    )
    if unexpected:
        raise CheckpointError(
            f"{source.location(unexpected[0])}: unexpected tensor {unexpected[0]!r} for a "
            f"{cfg.model_type} model" + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else "")
        )


def decoder_from_hf_tensors(cfg: ModelConfig, source: TensorSource, place: PlaceFn | None = None) -> Decoder:
    """Builds a `Decoder(cfg)` whose parameters are read from HF-named tensors, one at a time.

    `place(hf_name, array_in_param_dtype, logical_axes)` returns the device array for one parameter.
    Raises `CheckpointError` (a ValueError) naming the file and tensor on any mismatch.
    """
    place = default_place if place is None else place
    mappings = tensor_mappings(cfg)
    _check_names(cfg, mappings, source)
    graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    variables = dict(nnx.to_flat_state(abstract_state))
    if set(variables) != {m.path for m in mappings}:  # guards the mapping table itself
        raise AssertionError(f"mapping/parameter mismatch: {set(variables) ^ {m.path for m in mappings}}")
    read_tensors_into(variables, mappings, source, place, cfg.param_dtype)
    return nnx.merge(graphdef, abstract_state)


def read_tensors_into(
    variables: dict, mappings: list[TensorMapping], source: TensorSource, place: PlaceFn, param_dtype
) -> None:
    """Reads the mappings' tensors from `source`, checks their shapes, converts them to our layout and
    `param_dtype`, and sets each abstract variable (at a mapping's `path`) to its placed device array.

    One parameter is on the host at a time: a stacked layer weight is filled layer by layer into one host
    array and placed whole (its `place` name is the HF name with the layer index as `*`)."""
    by_path: dict[tuple, list[TensorMapping]] = {}
    for mapping in mappings:
        by_path.setdefault(mapping.path, []).append(mapping)
    for path, group in by_path.items():
        variable = variables[path]
        if group[0].layer is None:
            (mapping,) = group
            value, name = _read_converted(mapping, source, param_dtype), mapping.hf_name
        else:
            value = np.empty(variable.get_value().shape, param_dtype)
            for mapping in group:
                value[mapping.layer] = _read_converted(mapping, source, param_dtype)
            name = group[0].hf_name.replace(f".{group[0].layer}.", ".*.", 1)
        variable.set_value(place(name, value, tuple(variable.get_metadata()["out_sharding"])))


def _read_converted(mapping: TensorMapping, source: TensorSource, param_dtype) -> np.ndarray:
    """One tensor read from `source`, its shape checked, in our layout and `param_dtype`."""
    tensor = source.read(mapping.hf_name)
    if tuple(tensor.shape) != mapping.hf_shape:
        raise CheckpointError(
            f"{source.location(mapping.hf_name)}: tensor {mapping.hf_name!r} has shape "
            f"{tuple(tensor.shape)}, expected {mapping.hf_shape} for this config"
        )
    return np.ascontiguousarray(mapping.to_nnx(np.asarray(tensor)).astype(param_dtype))


def hf_tensors_from_decoder(model: Decoder) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(HF name, thunk producing the HF-layout host array) for every parameter, in checkpoint order.

    Thunks let a writer fetch one tensor at a time from device memory.
    """
    variables = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for mapping in tensor_mappings(model.config):
        yield mapping.hf_name, host_fetcher(variables[mapping.path], mapping)


def host_fetcher(variable: nnx.Variable, mapping: TensorMapping) -> Callable[[], np.ndarray]:
    """A thunk fetching `mapping`'s tensor (its layer's slice of a stacked weight) in the HF layout."""

    def fetch() -> np.ndarray:
        value = variable.get_value()
        value = value if mapping.layer is None else value[mapping.layer]
        return np.ascontiguousarray(mapping.to_hf(np.asarray(jax.device_get(value))))

    return fetch
