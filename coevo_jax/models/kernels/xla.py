"""XLA's kernel set: every operation that has more than one implementation, as XLA computes it.

It runs on every platform and is the reference the CPU set (`kernels.cpu.CpuKernels`) must match. A few
operations are written around XLA:CPU's weak spots, with the same results everywhere:

- Products (`product`) ask for float32 results on the CPU: XLA:CPU has no bf16 x bf16 -> bf16 matmul and
  runs one as a float32 matmul between converted copies of the operands, while a bf16 x bf16 -> float32
  product does run in bf16, 1.6-2.5x faster. Accelerators return the compute dtype directly (their matmul
  units accumulate in float32 either way, so the numbers are the same).
- `first_argmax` finds a row's first maximum in two vectorised passes: XLA:CPU emits argmax's one-pass
  (value, index) reduction as scalar code (~150 us on [8, 8192] at every decode step, ~50 us in two passes).
- `log_normaliser` sums the exponentials as a product with a vector of ones: XLA:CPU's fused exp-and-sum
  reduction took 108 us of a 1.6 ms decode step (8 rows x 8,192), the exponentials and the product ~30 us.
- Attention over the cache (`attend_cache`) reads the stacked cache in place and, for long prefill chunks
  on the CPU, one chunk of rows at a time (`causal_plan`).

Shape legend: L layers, B batch, T query length, S key/cache slots, H query heads, K key/value heads,
G = H // K, E head_dim, M leading axes of a product's input, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from coevo_jax.models.kv_cache import layer_slots
from coevo_jax.models.layers import MASKED_SCORE, batch_shards

ARGMAX_BLOCK = 128  # the block width of `first_argmax`'s first pass


@dataclasses.dataclass(frozen=True)
class XlaKernels:
    """The operations a decoder and its sampler hand to a kernel set, through XLA's own ops.

    A kernel set is static, hashable data of a built decoder (`kernels.kernel_set`): the model calls one
    method per operation and never asks which set it holds."""

    platform: str  # the backend the programs are compiled for: 'cpu', 'gpu' or 'tpu'

    def product(self, a, b, spec: str, dtype) -> jax.Array:
        """einsum of same-dtype operands, accumulated in float32, returned in `dtype` (see the module
        docstring for the float32 results on the CPU)."""
        float32_result = dtype == jnp.float32 or self.platform == "cpu"
        result_dtype = jnp.float32 if float32_result else dtype
        return jnp.einsum(spec, a, b, preferred_element_type=result_dtype).astype(dtype)

    def matmul(self, x_MxK: jax.Array, kernel_KxN: jax.Array) -> jax.Array:
        """x [..., K] @ kernel [K, N] -> [..., N] in x's dtype, the kernel cast to it first: the forward
        product of `models.dense`."""
        return self.product(x_MxK, kernel_KxN.astype(x_MxK.dtype), "...k,kn->...n", x_MxK.dtype)

    def decode_weight(self, stacked_LxKxN: jax.Array, layer: int, x_dtype, rows: int):
        """Layer `layer`'s projection kernel for a decode step of `rows` rows in `x_dtype`, as `matmul` takes
        it: here a slice of the stacked weights."""
        del x_dtype, rows
        return stacked_LxKxN[layer]

    def logits(self, hidden_BxTxD: jax.Array, table: jax.Array, tied: bool) -> jax.Array:
        """Float32 logits [B, T, V]: hidden @ the output projection, `table` as stored (the embedding [V, D]
        when `tied`, else the output projection [D, V]), cast to the hidden states' dtype."""
        unembedding_DxV = (table.T if tied else table).astype(hidden_BxTxD.dtype)
        return jnp.einsum("btd,dv->btv", hidden_BxTxD, unembedding_DxV, preferred_element_type=jnp.float32)

    def reads_cache_in_place(self, q_dtype, cache_dtype, head_dim: int) -> bool:
        """Whether `attend_cache` reads only each query's live prefix of the stacked cache in one pass (a
        fresh chunk then attends as fast through the cache as on its own, and the decode loop keeps the cache
        stacked). XLA reads whole windows: no."""
        del q_dtype, cache_dtype, head_dim
        return False

    def attend_cache(
        self,
        q_BxTxHxE: jax.Array,
        keys_LxBxKxExS: jax.Array,
        values_LxBxKxSxE: jax.Array,
        layer: jax.Array,
        allowed_BxTxS: jax.Array,
        row_chunks: int,
    ) -> jax.Array:
        """`attend` over layer `layer` of the stacked cache (keys [L, B, K, E, S], values [L, B, K, S, E]),
        in `row_chunks` sequential chunks of the batch rows (a `lax.map`; it must divide B); with one chunk
        (decode, short chunks, accelerators) over the whole layer at once.

        A prefill chunk of T tokens against S cached slots scores [K, G, T, S] per row: on the CPU one row's
        scores stay in cache where a whole batch's do not, which made prefill several times faster. Each
        chunk of rows is one slice [rows, K, E, S] of the stacked arrays, cast to q's dtype there: slicing
        the layer out first and then its rows copied the keys and values two to three times.

        `allowed_BxTxS` must let each query attend a prefix of the slots, as `kv_cache.place_chunk` makes it.
        """
        batch = q_BxTxHxE.shape[0]
        if batch % max(row_chunks, 1):
            raise ValueError(f"row_chunks={row_chunks} must divide the batch of {batch}")
        if row_chunks <= 1:
            return self.attend_slots(q_BxTxHxE, keys_LxBxKxExS, values_LxBxKxSxE, layer, allowed_BxTxS)
        rows = batch // row_chunks

        def split(x):
            return x.reshape(row_chunks, rows, *x.shape[1:])

        def chunk(args):
            index, q_RxTxHxE, allowed_RxTxS = args
            start = (layer, index * rows, 0, 0, 0)
            k_RxKxExS = jax.lax.dynamic_slice(keys_LxBxKxExS, start, (1, rows, *keys_LxBxKxExS.shape[2:]))[0]
            v_RxKxSxE = jax.lax.dynamic_slice(
                values_LxBxKxSxE, start, (1, rows, *values_LxBxKxSxE.shape[2:])
            )[0]
            dtype = q_RxTxHxE.dtype
            return attend(q_RxTxHxE, k_RxKxExS.astype(dtype), v_RxKxSxE.astype(dtype), allowed_RxTxS)

        indices = jnp.arange(row_chunks, dtype=jnp.int32)
        out = jax.lax.map(chunk, (indices, split(q_BxTxHxE), split(allowed_BxTxS)))
        return out.reshape(q_BxTxHxE.shape)

    def attend_slots(
        self,
        q_BxTxHxE: jax.Array,
        keys_LxBxKxExS: jax.Array,
        values_LxBxKxSxE: jax.Array,
        layer: jax.Array,
        allowed_BxTxS: jax.Array,
    ) -> jax.Array:
        """`attend` over whichever slots of layer `layer` of the stacked cache `allowed_BxTxS` picks, in any
        pattern (a sliding window is no prefix, which `attend_cache` may assume): every kernel set reads it
        through XLA."""
        dtype = q_BxTxHxE.dtype
        k_BxKxExS = layer_slots(keys_LxBxKxExS, layer).astype(dtype)
        v_BxKxSxE = layer_slots(values_LxBxKxSxE, layer).astype(dtype)
        return attend(q_BxTxHxE, k_BxKxExS, v_BxKxSxE, allowed_BxTxS)

    def causal_plan(self, batch: int) -> dict:
        """Block size and row chunking of `causal_attention` (and of long cached chunks) on this platform.

        On the CPU, one row per device at a time keeps each block's scores in cache (several times faster);
        accelerators take every row at once and larger blocks."""
        if self.platform != "cpu":
            return {"block_size": 256, "row_chunks": 1}
        shards = batch_shards()
        return {"block_size": 64, "row_chunks": batch // shards if batch % shards == 0 else 1}

    def argmax(self, x_BxV: jax.Array) -> jax.Array:
        """int32 [...]: `jnp.argmax(x, axis=-1)`, the first maximum (NaN counts as the largest)."""
        return first_argmax(x_BxV)

    def log_normaliser(self, logits_BxV: jax.Array) -> jax.Array:
        """float32 [...]: log sum exp over the last axis."""
        return log_normaliser(logits_BxV)

    def argmax_and_log_normaliser(self, logits_BxV: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(`argmax`, `log_normaliser`) of the same logits: a greedy decode step's token and normaliser."""
        return self.argmax(logits_BxV), self.log_normaliser(logits_BxV)


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


def first_argmax(x_BxV: jax.Array) -> jax.Array:
    """int32 [...]: `jnp.argmax(x, axis=-1)` (the first maximum; NaN counts as the largest), in two passes.

    A plain maximum over blocks of `ARGMAX_BLOCK` values (vectorised) finds the first block holding the row's
    maximum (or its first NaN), and one argmax over that block alone finds it. A last partial block is
    padded with -inf, which never comes before a real value."""
    *lead, vocab = x_BxV.shape
    if vocab <= ARGMAX_BLOCK:
        return jnp.argmax(x_BxV, axis=-1).astype(jnp.int32)
    blocks = -(-vocab // ARGMAX_BLOCK)
    pad = blocks * ARGMAX_BLOCK - vocab
    if pad:
        x_BxV = jnp.pad(x_BxV, [(0, 0)] * len(lead) + [(0, pad)], constant_values=-jnp.inf)
    x_BxNxK = x_BxV.reshape(*lead, blocks, ARGMAX_BLOCK)
    # XLA:CPU's vectorised maximum may drop a NaN, so blocks holding one are found apart.
    nan_BxN = jnp.any(jnp.isnan(x_BxNxK), axis=-1)
    block_B = jnp.where(
        jnp.any(nan_BxN, axis=-1),
        jnp.argmax(nan_BxN, axis=-1),
        jnp.argmax(jnp.max(x_BxNxK, axis=-1), axis=-1),
    )
    inside_BxK = jnp.take_along_axis(x_BxNxK, block_B[..., None, None], axis=-2)[..., 0, :]
    return (block_B * ARGMAX_BLOCK + jnp.argmax(inside_BxK, axis=-1)).astype(jnp.int32)


def log_normaliser(logits_BxV: jax.Array) -> jax.Array:
    """float32 [B]: log sum exp over the vocabulary, the sum of exponentials taken as a product with a vector
    of ones (at full float32 precision, which TPUs and GPUs do not give a float32 product by default)."""
    max_B = jnp.max(logits_BxV, axis=-1)
    ones_V = jnp.ones(logits_BxV.shape[-1], logits_BxV.dtype)
    exp_sum_B = jnp.matmul(jnp.exp(logits_BxV - max_B[:, None]), ones_V, precision=jax.lax.Precision.HIGHEST)
    return max_B + jnp.log(exp_sum_B)
