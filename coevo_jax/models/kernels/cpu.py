"""The CPU kernel set: XLA:CPU with the hand-written C++ kernels (`cpu_ffi`) for the operations they serve.

Each method takes its kernel when the operands allow it and XLA's implementation (`XlaKernels`) otherwise.
The conditions are correctness conditions, checked as each program is traced: float32 operands, shapes the
kernel's buffers hold, and no mesh of several devices (XLA cannot partition a custom call: it would gather
sharded operands).

- Products of a decode step's few rows (up to `cpu_ffi.SMALL_MATMUL_MAX_ROWS`) go to `small_matmul`, forward
  only (`models.dense`'s backward stays XLA's), and the untied or tied unembedding of those rows to
  `small_matmul` or `small_matmul_nt`. A decode step's projection kernels come as `StackedLayer`s
  (`decode_weight`): the kernel reads its layer inside the stacked parameters, where a slice
  `stacked[layer]` would be copied out at every decode call (for SmolLM2, 0.4 GB of weights a call).
- Attention over the cache goes to `prefix_attention`, which reads only each query's live prefix: a fresh
  prefill chunk attends through the cache as fast as on its own, and the decode loop keeps the cache
  stacked (`reads_cache_in_place`).
- A decode step's greedy token and log-prob normaliser come from `logit_stats` in one pass.

Shape legend: L layers, B batch, T query length, S cache slots, H query heads, K key/value heads,
G = H // K, E head_dim, M leading axes of a product's input, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from coevo_jax.models.dense import dense
from coevo_jax.models.kernels import cpu_ffi
from coevo_jax.models.kernels.xla import XlaKernels


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StackedLayer:
    """Layer `layer` of a stacked weight [L, ...], standing in for that layer's weight in a decode step.

    Supports what the blocks do with a kernel: `shape`, `dtype`, `kernel[...]` and `reshape` (of the layer's
    axes; a bitcast of the stack)."""

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


def _serves(*dtypes) -> bool:
    """Every operand float32 and no mesh of several devices active."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        return False
    return all(jnp.dtype(dtype) == jnp.float32 for dtype in dtypes)


def serves_matmul(x_dtype, w_dtype, rows: int) -> bool:
    """Whether `small_matmul` serves a product of `rows` rows."""
    return _serves(x_dtype, w_dtype) and 0 < rows <= cpu_ffi.SMALL_MATMUL_MAX_ROWS


def serves_attention(q_dtype, cache_dtype, head_dim: int) -> bool:
    """Whether `prefix_attention` serves attention over a cache (a head_dim its buffers hold)."""
    return _serves(q_dtype, cache_dtype) and head_dim <= cpu_ffi.MAX_HEAD_DIM


@dataclasses.dataclass(frozen=True)
class CpuKernels(XlaKernels):
    """XLA:CPU plus the C++ kernels where they serve (see the module docstring)."""

    platform: str = "cpu"

    def matmul(self, x_MxK: jax.Array, kernel_KxN) -> jax.Array:
        """`XlaKernels.matmul`; the kernel may be a `StackedLayer` (no autodiff rule: decode only)."""
        rows = math.prod(x_MxK.shape[:-1])
        serves = serves_matmul(x_MxK.dtype, kernel_KxN.dtype, rows)
        if isinstance(kernel_KxN, StackedLayer):
            if serves:
                return cpu_ffi.small_matmul(x_MxK, kernel_KxN.stacked, kernel_KxN.layer)
            kernel_KxN = kernel_KxN.sliced()
        if serves:
            return cpu_ffi.small_matmul(x_MxK, kernel_KxN)
        return super().matmul(x_MxK, kernel_KxN)

    def decode_weight(self, stacked_LxKxN: jax.Array, layer: int, x_dtype, rows: int):
        """A `StackedLayer` read in place by `small_matmul` where it serves these rows, else a slice."""
        if serves_matmul(x_dtype, stacked_LxKxN.dtype, rows):
            return StackedLayer(stacked_LxKxN, layer)
        return super().decode_weight(stacked_LxKxN, layer, x_dtype, rows)

    def logits(self, hidden_BxTxD: jax.Array, table: jax.Array, tied: bool) -> jax.Array:
        """`XlaKernels.logits`; a decode step's rows through `small_matmul` (as `dense`, with its backward), or
        `small_matmul_nt` over the tied table as it is stored (each logit a row's dot product; no autodiff
        rule)."""
        rows = hidden_BxTxD.shape[0] * hidden_BxTxD.shape[1]
        if not serves_matmul(hidden_BxTxD.dtype, table.dtype, rows):
            return super().logits(hidden_BxTxD, table, tied)
        if tied:
            return cpu_ffi.small_matmul_nt(hidden_BxTxD, table)
        return dense(hidden_BxTxD, table.astype(hidden_BxTxD.dtype), self)

    def reads_cache_in_place(self, q_dtype, cache_dtype, head_dim: int) -> bool:
        return serves_attention(q_dtype, cache_dtype, head_dim)

    def attend_cache(self, q_BxTxHxE, keys_LxBxKxExS, values_LxBxKxSxE, layer, allowed_BxTxS, row_chunks):
        """`XlaKernels.attend_cache`; through `prefix_attention` in one pass where it serves (it needs no
        row chunks: it reads each query's prefix only)."""
        batch, length, num_heads, head_dim = q_BxTxHxE.shape
        if not serves_attention(q_BxTxHxE.dtype, keys_LxBxKxExS.dtype, head_dim):
            return super().attend_cache(
                q_BxTxHxE, keys_LxBxKxExS, values_LxBxKxSxE, layer, allowed_BxTxS, row_chunks
            )
        if batch % max(row_chunks, 1):
            raise ValueError(f"row_chunks={row_chunks} must divide the batch of {batch}")
        num_kv_heads = keys_LxBxKxExS.shape[2]
        groups = num_heads // num_kv_heads
        q_BxKxQxE = (
            q_BxTxHxE.reshape(batch, length, num_kv_heads, groups, head_dim)
            .transpose(0, 2, 3, 1, 4)
            .reshape(batch, num_kv_heads, groups * length, head_dim)
        )  # Q = G * T, g-major, as the kernel takes them
        limits_BxT = jnp.sum(allowed_BxTxS, axis=-1, dtype=jnp.int32)
        out_BxKxQxE = cpu_ffi.prefix_attention(q_BxKxQxE, keys_LxBxKxExS, values_LxBxKxSxE, layer, limits_BxT)
        out_BxTxKxGxE = out_BxKxQxE.reshape(batch, num_kv_heads, groups, length, head_dim).transpose(
            0, 3, 1, 2, 4
        )
        return out_BxTxKxGxE.reshape(q_BxTxHxE.shape)

    def argmax(self, x_BxV: jax.Array) -> jax.Array:
        if _serves(x_BxV.dtype):
            return cpu_ffi.logit_stats(x_BxV)[0]
        return super().argmax(x_BxV)

    def log_normaliser(self, logits_BxV: jax.Array) -> jax.Array:
        if _serves(logits_BxV.dtype):
            return cpu_ffi.logit_stats(logits_BxV)[1]
        return super().log_normaliser(logits_BxV)

    def argmax_and_log_normaliser(self, logits_BxV: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Both from one `logit_stats` call where it serves."""
        if _serves(logits_BxV.dtype):
            return cpu_ffi.logit_stats(logits_BxV)
        return super().argmax_and_log_normaliser(logits_BxV)
