"""`dense`: x @ kernel in the compute dtype, accumulated in float32, with a backward that stays in it too.

Why not plain `x @ kernel.astype(dtype)`: XLA's CPU backend has no bf16 x bf16 -> bf16 matmul, so it
runs such a product (and the two products of its autodiff backward, whose operands mix a float32
cotangent with bf16 values) as a float32 matmul between converted copies of the operands: the "bf16"
train step then did most of its matmuls in float32 (`bench/profile_dpo_step.py`). A bf16 x bf16 ->
float32 product (`preferred_element_type`) does run in bf16, 1.6-2.5x faster on this CPU, so every
product here asks XLA:CPU for a float32 result and rounds it to the compute dtype afterwards; on
accelerators the products return the compute dtype directly, as before (their matmul units accumulate
in float32 either way, so the numbers are the same). On every backend the kernel's gradient comes
straight from the float32 accumulator in the kernel's own dtype, so float32 master weights get a
gradient that was never rounded to bf16.

A decode step's few rows (up to `cpu_kernels.SMALL_MATMUL_MAX_ROWS`) in float32 on the CPU go to the
hand-written `cpu_kernels.small_matmul` instead, which streams the weight on both threads (XLA's product
runs on one thread); the backward is XLA's either way. A decode step's weights come as `StackedLayer`s (see
`Decoder.layer_weights`): the kernel reads them inside the stacked parameters, which XLA cannot do without
copying each layer's slice out first.

Shape legend: M the leading (batch, length, ...) axes of `x`, K contracted, N output features.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from coevo_jax.models.cpu_kernels import small_matmul, small_matmul_applies


def _product(a, b, spec: str, dtype) -> jax.Array:
    """einsum of same-dtype operands, accumulated in float32, returned in `dtype`."""
    float32_result = dtype == jnp.float32 or jax.default_backend() == "cpu"
    result_dtype = jnp.float32 if float32_result else dtype
    return jnp.einsum(spec, a, b, preferred_element_type=result_dtype).astype(dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StackedLayer:
    """Layer `layer` of a stacked weight [L, ...], standing in for that layer's weight in `dense`.

    `Decoder.layer_weights` hands a decode step's kernels over this way where `cpu_kernels.small_matmul`
    serves them: the kernel reads the layer inside the stack, where a slice `stacked[layer]` would be copied
    out at every decode call (for SmolLM2, 0.4 GB of weights a call). Supports what the blocks do with a
    kernel: `shape`, `dtype`, `kernel[...]` and `reshape` (of the layer's axes; a bitcast of the stack)."""

    stacked: jax.Array
    layer: int = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.stacked.shape[1:]

    @property
    def dtype(self):
        return self.stacked.dtype

    def __getitem__(self, key):
        if key is not Ellipsis:
            raise TypeError(f"a StackedLayer supports [...] only, not [{key!r}]")
        return self

    def reshape(self, *shape: int) -> StackedLayer:
        return StackedLayer(self.stacked.reshape(self.stacked.shape[0], *shape), self.layer)

    def sliced(self) -> jax.Array:
        """The layer's weight as an array of its own (a copy)."""
        return self.stacked[self.layer]


def dense(x_MxK: jax.Array, kernel_KxN) -> jax.Array:
    """x [..., K] @ kernel [K, N] -> [..., N] in x's dtype; the kernel (an array or a `StackedLayer`) is
    cast to x's dtype first. A `StackedLayer` read in place by the kernel has no autodiff rule (decode only)."""
    if isinstance(kernel_KxN, StackedLayer):
        if small_matmul_applies(x_MxK.dtype, kernel_KxN.dtype, math.prod(x_MxK.shape[:-1])):
            return small_matmul(x_MxK, kernel_KxN.stacked, kernel_KxN.layer)
        kernel_KxN = kernel_KxN.sliced()
    return _dense(x_MxK, kernel_KxN)


@jax.custom_vjp
def _dense(x_MxK: jax.Array, kernel_KxN: jax.Array) -> jax.Array:
    if small_matmul_applies(x_MxK.dtype, kernel_KxN.dtype, math.prod(x_MxK.shape[:-1])):
        return small_matmul(x_MxK, kernel_KxN)
    return _product(x_MxK, kernel_KxN.astype(x_MxK.dtype), "...k,kn->...n", x_MxK.dtype)


def _dense_fwd(x_MxK, kernel_KxN):
    return _dense(x_MxK, kernel_KxN), (x_MxK, kernel_KxN)


def _dense_bwd(residuals, d_out_MxN):
    x_MxK, kernel_KxN = residuals
    d_out_MxN = d_out_MxN.astype(x_MxK.dtype)
    d_x = _product(d_out_MxN, kernel_KxN.astype(x_MxK.dtype), "...n,kn->...k", x_MxK.dtype)
    d_kernel = _product(x_MxK, d_out_MxN, "...k,...n->kn", kernel_KxN.dtype)
    return d_x, d_kernel


_dense.defvjp(_dense_fwd, _dense_bwd)
