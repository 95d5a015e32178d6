"""`models.dense` (x @ kernel with a float32-accumulating custom VJP) against a float64 NumPy reference, in
XLA's kernel set (the CPU set's small-row kernel has its own tests, `test_cpu_kernels.py`)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from coevo_jax.models.dense import dense
from coevo_jax.models.kernels import XlaKernels

XLA_CPU = XlaKernels("cpu")


def _inputs(seed, x_shape, features):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    kernel = (rng.standard_normal((x_shape[-1], features)) / np.sqrt(x_shape[-1])).astype(np.float32)
    d_out = rng.standard_normal((*x_shape[:-1], features)).astype(np.float32)
    return x, kernel, d_out


def _rounded(a, dtype):
    """`a` rounded to `dtype` and back to float64: the values a `dtype` computation actually sees."""
    return np.asarray(a).astype(dtype).astype(np.float64)


def _vjp(x, kernel, d_out, dtype):
    out, pullback = jax.vjp(lambda x, k: dense(x, k, XLA_CPU), jnp.asarray(x, dtype), jnp.asarray(kernel))
    d_x, d_kernel = pullback(jnp.asarray(d_out, dtype))
    return out, d_x, d_kernel


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("x_shape", [(5, 7), (3, 4, 6)])
def test_float32_matches_float64_reference(seed, x_shape):
    x, kernel, d_out = _inputs(seed, x_shape, 9)
    out, d_x, d_kernel = _vjp(x, kernel, d_out, jnp.float32)
    x64, k64, g64 = x.astype(np.float64), kernel.astype(np.float64), d_out.astype(np.float64)
    flat_x, flat_g = x64.reshape(-1, x.shape[-1]), g64.reshape(-1, 9)
    np.testing.assert_allclose(out, x64 @ k64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_x, g64 @ k64.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_kernel, flat_x.T @ flat_g, rtol=1e-5, atol=1e-5)
    assert out.dtype == d_x.dtype == d_kernel.dtype == jnp.float32


@pytest.mark.parametrize("seed", [2, 3])
def test_bfloat16_compute_accumulates_in_float32(seed):
    """bf16 x, float32 master kernel: outputs are one bf16 rounding of the float64 product of the bf16
    inputs, and the kernel's gradient keeps float32 precision (it is never rounded to bf16)."""
    x, kernel, d_out = _inputs(seed, (4, 32, 64), 48)
    out, d_x, d_kernel = _vjp(x, kernel, d_out, jnp.bfloat16)
    bf16 = ml_dtypes.bfloat16
    x16, k16, g16 = _rounded(x, bf16), _rounded(kernel, bf16), _rounded(d_out, bf16)
    assert out.dtype == d_x.dtype == jnp.bfloat16 and d_kernel.dtype == jnp.float32
    # One rounding to bf16 (8 significant bits) of the exact product: relative error <= 2^-8.
    for got, want in [(out, x16 @ k16), (d_x, g16 @ k16.T)]:
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2**-8, atol=1e-6)
    want_d_kernel = x16.reshape(-1, 64).T @ g16.reshape(-1, 48)
    np.testing.assert_allclose(d_kernel, want_d_kernel, rtol=1e-4, atol=1e-4)
    # A gradient rounded to bf16 on the way would be off by ~2^-9 relative: check it is not.
    rounded_error = np.abs(_rounded(want_d_kernel, bf16) - want_d_kernel).max()
    assert np.abs(np.asarray(d_kernel, np.float64) - want_d_kernel).max() < rounded_error / 10


def test_matches_plain_matmul_gradients_inside_a_model_loss():
    """Same values and gradients as `x @ kernel` under jit and grad (float32), for a two-layer net."""
    x, k1, _ = _inputs(4, (2, 5, 8), 12)
    k2 = np.random.default_rng(5).standard_normal((12, 3)).astype(np.float32)

    def loss(matmul, k1, k2):
        return jnp.sum(jnp.tanh(matmul(jnp.tanh(matmul(jnp.asarray(x), k1)), k2)) ** 2)

    plain = jax.jit(jax.value_and_grad(lambda a, b: loss(jnp.matmul, a, b), argnums=(0, 1)))(k1, k2)
    ours = jax.jit(
        jax.value_and_grad(lambda a, b: loss(lambda x, k: dense(x, k, XLA_CPU), a, b), argnums=(0, 1))
    )(k1, k2)
    for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's compiled products")
def test_bfloat16_gradient_runs_bfloat16_products_on_cpu():
    """The reason for the custom VJP: every product of the bf16 forward and backward keeps bf16
    operands in the compiled program (XLA:CPU would otherwise up-convert them to float32)."""

    def loss(x, kernel):
        return jnp.sum(dense(x, kernel, XLA_CPU).astype(jnp.float32) ** 2)

    x = jnp.ones((4, 64, 128), jnp.bfloat16)
    kernel = jnp.ones((128, 96), jnp.float32)
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, kernel).compile().as_text()
    types = dict(re.findall(r"%([\w.-]+) = (\w+)\[", hlo))
    dots = re.findall(r"= \w+\[[^\]]*\]\S* dot\(([^)]*)\)", hlo)
    assert len(dots) >= 2  # d_x and d_kernel (the forward's product is needed by the loss too)
    operand_types = {types[name.strip().lstrip("%")] for operands in dots for name in operands.split(",")}
    assert operand_types == {"bf16"}, f"products with {operand_types} operands"


def test_products_ask_xla_cpu_for_float32_results_and_accelerators_for_the_compute_dtype():
    """The platform comes from the resolved config, not from the machine tracing: a GPU program traced here
    asks for bf16 results."""
    x, kernel = jnp.ones((4, 8, 16), jnp.bfloat16), jnp.ones((16, 12), jnp.float32)
    for platform, result in [("cpu", "f32"), ("gpu", "bf16"), ("tpu", "bf16")]:
        text = jax.jit(dense, static_argnums=2).lower(x, kernel, XlaKernels(platform)).as_text()
        (dot,) = [line for line in text.splitlines() if "dot_general" in line]
        assert dot.endswith(f"-> tensor<4x8x12x{result}>"), (platform, dot)
