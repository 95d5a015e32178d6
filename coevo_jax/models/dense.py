"""`dense`: x @ kernel in the compute dtype, accumulated in float32, with a backward that stays in it too.

Why not plain `x @ kernel.astype(dtype)`: XLA's CPU backend has no bf16 x bf16 -> bf16 matmul, so it runs
such a product (and the two products of its autodiff backward, whose operands mix a float32 cotangent with
bf16 values) as a float32 matmul between converted copies of the operands: the "bf16" train step then did
most of its matmuls in float32. Every product here goes through the model's kernel set
(`kernels.XlaKernels.product`), which asks XLA:CPU for a float32 result and rounds it to the compute dtype
afterwards. On every backend the kernel's gradient comes straight from the float32 accumulator in the
kernel's own dtype, so float32 master weights get a gradient that was never rounded to bf16.

The forward product is the kernel set's `matmul`: on the CPU set, a decode step's few float32 rows go to a
hand-written kernel (which also reads a `StackedLayer` in place); the backward is XLA's either way.

Shape legend: M the leading (batch, length, ...) axes of `x`, K contracted, N output features.
"""

from __future__ import annotations

import functools

import jax


def dense(x_MxK: jax.Array, kernel_KxN, kernels) -> jax.Array:
    """x [..., K] @ kernel [K, N] -> [..., N] in x's dtype; the kernel is cast to x's dtype first. `kernels`
    is the model's kernel set (`models.kernels`: its `matmul` and `product`); a kernel it hands out for
    decoding (`decode_weight`) has no autodiff rule."""
    return _dense(x_MxK, kernel_KxN, kernels)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense(x_MxK: jax.Array, kernel_KxN: jax.Array, kernels) -> jax.Array:
    return kernels.matmul(x_MxK, kernel_KxN)


def _dense_fwd(x_MxK, kernel_KxN, kernels):
    return kernels.matmul(x_MxK, kernel_KxN), (x_MxK, kernel_KxN)


def _dense_bwd(kernels, residuals, d_out_MxN):
    x_MxK, kernel_KxN = residuals
    d_out_MxN = d_out_MxN.astype(x_MxK.dtype)
    d_x = kernels.product(d_out_MxN, kernel_KxN.astype(x_MxK.dtype), "...n,kn->...k", x_MxK.dtype)
    d_kernel = kernels.product(x_MxK, d_out_MxN, "...k,...n->kn", kernel_KxN.dtype)
    return d_x, d_kernel


_dense.defvjp(_dense_fwd, _dense_bwd)
