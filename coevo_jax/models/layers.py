"""Building blocks of the decoder: annotated parameters, activation constraints, RMSNorm, RoPE, attention.

Sharding is expressed with *logical* axis names only. Parameters carry them as `out_sharding` metadata
(read them with `nnx.get_partition_spec(nnx.state(model))` under `nnx.logical_axis_rules(...)`);
activations go through `constrain`, which is a no-op unless both logical axis rules and a mesh
(`jax.set_mesh`) are active.

Shape legend: B batch, T query length, S key/cache length, D model width, H query heads, K key/value
heads, G = H // K query heads per kv head, E head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.core import spmd as flax_spmd

from coevo_jax.models.config import ModelConfig
from coevo_jax.models.cpu_kernels import prefix_attention, prefix_attention_applies
from coevo_jax.models.kv_cache import layer_slots

MASKED_SCORE = float(np.finfo(np.float32).min)  # finite, so fully-masked rows give a uniform softmax, not NaN


def param(value: jax.Array, logical_axes: tuple[str, ...]) -> nnx.Param:
    """An `nnx.Param` annotated with logical axis names (sharding is applied later, by rules)."""
    if len(logical_axes) != value.ndim:
        raise ValueError(f"{len(logical_axes)} axis names {logical_axes} for a {value.ndim}-d parameter")
    return nnx.Param(value, eager_sharding=False, out_sharding=logical_axes)


LAYERS_AXIS = "layers"  # logical name of the leading axis of stacked layer weights (never sharded)


def stack_layers(modules: list[nnx.Module]) -> nnx.Module:
    """One module like `modules[0]` whose every variable holds the `modules`' values stacked on a new
    leading axis (logical name `LAYERS_AXIS`): the decoder's blocks as one module, scanned over layers."""
    graphdef = nnx.split(modules[0])[0]
    states = [nnx.state(m) for m in modules]

    def stack(*variables: nnx.Variable) -> nnx.Variable:
        axes = variables[0].get_metadata()["out_sharding"]
        value = jnp.stack([v.get_value() for v in variables])
        return variables[0].replace(value, out_sharding=(LAYERS_AXIS, *axes))

    stacked = jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, stacked)


def constrain(x: jax.Array, logical_axes: tuple[str | None, ...]) -> jax.Array:
    """Sharding constraint by logical axis names; identity when no rules or no mesh are active."""
    rules = flax_spmd.get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return x
    mapping = dict(rules)
    spec = jax.sharding.PartitionSpec(*(mapping.get(name) if name else None for name in logical_axes))
    if mesh.are_all_axes_explicit:  # explicit-sharding meshes treat the constraint as an assertion
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, spec)


def batch_shards() -> int:
    """How many ways the logical 'batch' axis is split on the active mesh (1 without rules or mesh)."""
    rules = flax_spmd.get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return 1
    axes = dict(rules).get("batch")
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis; statistics in float32, output in the compute dtype."""

    def __init__(self, size: int, eps: float, *, dtype, param_dtype):
        self.scale = param(jnp.ones((size,), param_dtype), ("norm",))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * normed.astype(self.dtype)


def rope_inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Per-pair rotation frequencies [E/2] (float32), Llama-3 rescaled when `cfg.rope_scaling` is set."""
    exponents = np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    scaling = cfg.rope_scaling
    if scaling is not None:
        # Long wavelengths are slowed down by `factor`, short ones kept, the band between interpolated.
        old_len = scaling.original_max_position_embeddings
        wavelength = 2 * np.pi / inv_freq
        low_freq_wavelength = old_len / scaling.low_freq_factor
        high_freq_wavelength = old_len / scaling.high_freq_factor
        scaled = np.where(wavelength > low_freq_wavelength, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelength - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        interpolated = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        in_band = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
        inv_freq = np.where(in_band, interpolated, scaled)
    return inv_freq.astype(np.float32)


def apply_rope(x_BxTxNxE: jax.Array, positions_BxT: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotary embedding, "rotate-half" convention of the HF checkpoints (pairs i and i + E/2)."""
    angles_BxTxE2 = positions_BxT[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)
    angles_BxTx1xE = jnp.concatenate([angles_BxTxE2, angles_BxTxE2], axis=-1)[:, :, None, :]
    x32 = x_BxTxNxE.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    out = x32 * jnp.cos(angles_BxTx1xE) + rotated * jnp.sin(angles_BxTx1xE)
    return out.astype(x_BxTxNxE.dtype)


def attend(
    q_BxTxHxE: jax.Array, k_BxKxExS: jax.Array, v_BxKxSxE: jax.Array, allowed_BxTxS: jax.Array
) -> jax.Array:
    """Grouped-query scaled dot-product attention; scores and softmax in float32, output in q's dtype.

    Keys and values come as the KV cache holds them (keys [B, K, E, S], values [B, K, S, E]): with the
    queries brought to [B, K, G, T, E] (small), both contractions are plain products per (row, head) that
    read the cache in place, contiguous along what they sum or produce.
    """
    batch, length, num_heads, head_dim = q_BxTxHxE.shape
    num_kv_heads = k_BxKxExS.shape[1]
    q_BxKxGxTxE = q_BxTxHxE.reshape(
        batch, length, num_kv_heads, num_heads // num_kv_heads, head_dim
    ).transpose(0, 2, 3, 1, 4)
    scores_BxKxGxTxS = jnp.einsum(
        "bkgte,bkes->bkgts", q_BxKxGxTxE, k_BxKxExS, preferred_element_type=jnp.float32
    ) * (head_dim**-0.5)
    scores_BxKxGxTxS = jnp.where(allowed_BxTxS[:, None, None], scores_BxKxGxTxS, MASKED_SCORE)
    probs_BxKxGxTxS = jax.nn.softmax(scores_BxKxGxTxS, axis=-1)
    out_BxKxGxTxE = jnp.einsum("bkgts,bkse->bkgte", probs_BxKxGxTxS.astype(v_BxKxSxE.dtype), v_BxKxSxE)
    out_BxTxKxGxE = out_BxKxGxTxE.transpose(0, 3, 1, 2, 4)
    return out_BxTxKxGxE.reshape(batch, length, num_heads, head_dim).astype(q_BxTxHxE.dtype)


def attend_cached_rows(
    q_BxTxHxE: jax.Array,
    keys_LxBxKxExS: jax.Array,
    values_LxBxKxSxE: jax.Array,
    layer: jax.Array,
    allowed_BxTxS: jax.Array,
    row_chunks: int,
) -> jax.Array:
    """`attend` over layer `layer` of the stacked cache (keys [L, B, K, E, S], values [L, B, K, S, E]), in
    `row_chunks` sequential chunks of the batch rows (a `lax.map`; it must divide B); with one chunk (decode,
    short chunks, accelerators) over the whole layer at once.

    A prefill chunk of T tokens against S cached slots scores [K, G, T, S] per row: on the CPU one row's
    scores stay in cache where a whole batch's do not, which made prefill several times faster. Each chunk of
    rows is one slice [rows, K, E, S] of the stacked arrays, cast to q's dtype there: slicing the layer out
    first and then its rows copied the keys and values two to three times (a fifth of a rollout prefill).

    `allowed_BxTxS` must let each query attend a prefix of the slots, as `kv_cache.place_chunk` makes it. In
    float32 on the CPU the hand-written `cpu_kernels.prefix_attention` then serves every chunk: it reads only
    each query's prefix, not the whole window, in one pass (`bench/README.md`, session 15)."""
    batch, length, num_heads, head_dim = q_BxTxHxE.shape
    if batch % max(row_chunks, 1):
        raise ValueError(f"row_chunks={row_chunks} must divide the batch of {batch}")
    if prefix_attention_applies(q_BxTxHxE.dtype, keys_LxBxKxExS.dtype, head_dim):
        num_kv_heads = keys_LxBxKxExS.shape[2]
        groups = num_heads // num_kv_heads
        q_BxKxQxE = (
            q_BxTxHxE.reshape(batch, length, num_kv_heads, groups, head_dim)
            .transpose(0, 2, 3, 1, 4)
            .reshape(batch, num_kv_heads, groups * length, head_dim)
        )  # Q = G * T, g-major, as the kernel takes them
        limits_BxT = jnp.sum(allowed_BxTxS, axis=-1, dtype=jnp.int32)
        out_BxKxQxE = prefix_attention(q_BxKxQxE, keys_LxBxKxExS, values_LxBxKxSxE, layer, limits_BxT)
        out_BxTxKxGxE = out_BxKxQxE.reshape(batch, num_kv_heads, groups, length, head_dim).transpose(
            0, 3, 1, 2, 4
        )
        return out_BxTxKxGxE.reshape(q_BxTxHxE.shape)
    if row_chunks <= 1:
        dtype = q_BxTxHxE.dtype
        k_BxKxExS = layer_slots(keys_LxBxKxExS, layer).astype(dtype)
        v_BxKxSxE = layer_slots(values_LxBxKxSxE, layer).astype(dtype)
        return attend(q_BxTxHxE, k_BxKxExS, v_BxKxSxE, allowed_BxTxS)
    rows = batch // row_chunks

    def split(x):
        return x.reshape(row_chunks, rows, *x.shape[1:])

    def chunk(args):
        index, q_RxTxHxE, allowed_RxTxS = args
        start = (layer, index * rows, 0, 0, 0)
        k_RxKxExS = jax.lax.dynamic_slice(keys_LxBxKxExS, start, (1, rows, *keys_LxBxKxExS.shape[2:]))[0]
        v_RxKxSxE = jax.lax.dynamic_slice(values_LxBxKxSxE, start, (1, rows, *values_LxBxKxSxE.shape[2:]))[0]
        dtype = q_RxTxHxE.dtype
        return attend(q_RxTxHxE, k_RxKxExS.astype(dtype), v_RxKxSxE.astype(dtype), allowed_RxTxS)

    indices = jnp.arange(row_chunks, dtype=jnp.int32)
    out = jax.lax.map(chunk, (indices, split(q_BxTxHxE), split(allowed_BxTxS)))
    return out.reshape(q_BxTxHxE.shape)
