"""Building blocks of the decoder: annotated parameters, activation constraints, RMSNorm, RoPE.

Sharding is expressed with *logical* axis names only. Parameters carry them as `out_sharding` metadata
(read them with `nnx.get_partition_spec(nnx.state(model))` under `nnx.logical_axis_rules(...)`);
activations go through `constrain`, which is a no-op unless both logical axis rules and a mesh
(`jax.set_mesh`) are active.

Shape legend: B batch, T length, N heads, E head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.core import spmd as flax_spmd

from coevo_jax.models.config import ModelConfig

MASKED_SCORE = float(np.finfo(np.float32).min)  # finite, so fully-masked rows give a uniform softmax, not NaN
INIT_STD = 0.02  # HF `initializer_range`; real weights come from checkpoints


def param(value: jax.Array, logical_axes: tuple[str, ...]) -> nnx.Param:
    """An `nnx.Param` annotated with logical axis names (sharding is applied later, by rules)."""
    if len(logical_axes) != value.ndim:
        raise ValueError(f"{len(logical_axes)} axis names {logical_axes} for a {value.ndim}-d parameter")
    return nnx.Param(value, eager_sharding=False, out_sharding=logical_axes)


def normal(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> jax.Array:
    """A fresh weight: normal with standard deviation `INIT_STD`, drawn in float32, stored in `dtype`."""
    return (INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


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


def unit_rms_norm(x: jax.Array, eps: float) -> jax.Array:
    """RMS norm over the last axis without a scale (Gemma 4's value norm), statistics in float32."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis; statistics in float32, output in the compute dtype. With
    `zero_centered` (Qwen3.5) the scale is 1 + the stored weight, which starts at zero."""

    def __init__(self, size: int, eps: float, *, dtype, param_dtype, zero_centered: bool = False):
        start = jnp.zeros if zero_centered else jnp.ones
        self.scale = param(start((size,), param_dtype), ("norm",))
        self.eps = eps
        self.dtype = dtype
        self.zero_centered = zero_centered

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.zero_centered:  # the product in float32, then rounded (as transformers' Qwen3.5)
            return (normed * (1.0 + self.scale[...].astype(jnp.float32))).astype(self.dtype)
        return self.scale[...].astype(self.dtype) * normed.astype(self.dtype)


def rope_inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Per-pair rotation frequencies [E/2] (float32), Llama-3 rescaled when `cfg.rope_scaling` is set, zero
    beyond the `cfg.partial_rotary_factor` share of the pairs; with `cfg.rotary_dim` those of a head of
    that size."""
    size = cfg.rotary_dim or cfg.head_dim
    exponents = np.arange(0, size, 2, dtype=np.float64) / size
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
    # Partial rotary (Gemma 4's 'proportional' RoPE): only the first pairs turn, the rest keep angle 0.
    turning = int(cfg.partial_rotary_factor * size // 2)
    inv_freq = np.where(np.arange(inv_freq.shape[0]) < turning, inv_freq, 0.0)
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


def rotate(x_BxTxNxE: jax.Array, positions_BxT: jax.Array, cfg: ModelConfig) -> jax.Array:
    """RoPE as `cfg` turns a head: all of it, or with `rotary_dim` its first features as a head of that size
    and the rest as they are (Qwen3.5)."""
    inv_freq = rope_inverse_frequencies(cfg)
    size = cfg.rotary_dim or x_BxTxNxE.shape[-1]
    if size == x_BxTxNxE.shape[-1]:
        return apply_rope(x_BxTxNxE, positions_BxT, inv_freq)
    turned = apply_rope(x_BxTxNxE[..., :size], positions_BxT, inv_freq)
    return jnp.concatenate([turned, x_BxTxNxE[..., size:]], axis=-1)
