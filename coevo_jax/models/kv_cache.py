"""Key/value cache for incremental decoding: an explicit, static-shape pytree.

Each row's valid tokens are stored *compacted*: the token with RoPE position p lives in slot p, so the
filled slots of row b are exactly `[0, lengths[b])` and padding tokens never occupy a slot. Appending a
chunk (prefill, an observation, or one sampled token) writes its valid tokens at
`lengths[b] + (cumsum(mask) - 1)` and drops the padded ones; the shapes never change, so a jitted step
compiles once per (batch, chunk length, capacity).

The caller must keep `lengths + tokens appended <= capacity`; writes beyond capacity are dropped silently
(nothing can raise inside `jit`), so check `cache.lengths` against `cache.capacity` between steps.

Keys are stored [L, B, K, E, S] and values [L, B, K, S, E]: one array each for all layers, which the
decoder's scan over its stacked layers updates in place (layer l's chunk is scattered into `keys[l]`).
Heads come before slots, so that attention over the cache contracts without transposing it (on the CPU
~4x faster decoding than a [B, S, K, E] layout). Keys put the slots last, so the score product is a plain
[G*T, E] x [E, S] product per (row, head) with the slots contiguous, as the value product's [G*T, S] x
[S, E] is: on the CPU its score product ran 1.3-4x faster than against [S, E] keys (`bench/README.md`).

A step whose rows all end within the first W slots can run on `leading_slots(cache, W)` and write the
result back with `with_leading_slots`: attention then reads W slots instead of S (the sampler's window).

The decode loop runs on `by_layer(cache)`: keys and values as tuples of L separate buffers. XLA
copies a layer's slice out of a stacked array before attention reads it, so a scan over the stacked cache
reads and writes the whole cache once more per token; separate buffers are read in place and updated in
place. `stacked` turns them back after the loop.

A cache may also keep the token in each slot (`token_ids_BxS`), for a model whose inputs depend on earlier
tokens' ids; every function here carries them along with the slots when they are there.

Shape legend: L layers, B batch, S capacity (slots), T chunk length, K kv heads, E head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVCache:
    """Keys/values of every layer (RoPE already applied) and the number of filled slots per row."""

    keys: jax.Array  # [L, B, K, E, S], or L x [B, K, E, S] (`by_layer`)
    values: jax.Array  # [L, B, K, S, E], or L x [B, K, S, E]
    lengths_B: jax.Array  # int32 [B]: filled slots == next RoPE position
    token_ids_BxS: jax.Array | None = None  # int32 [B, S]: the token in each slot, if the cache keeps them
    # Per layer of a model with linear-attention layers: such a layer's recurrent state (rows first), an
    # attention layer's () (`mixed_layers.init_cache`); None for attention-only models.
    states: tuple | None = None

    @property
    def capacity(self) -> int:
        """Number of slots S per row."""
        return self.keys[0].shape[-1] if isinstance(self.keys, tuple) else self.keys.shape[-1]

    @property
    def slot_valid_BxS(self) -> jax.Array:
        """True where a slot holds a token (slots are filled left to right)."""
        return jnp.arange(self.capacity)[None, :] < self.lengths_B[:, None]


def empty_cache(
    layers: int, batch: int, kv_heads: int, head_dim: int, slots: int, dtype, *, token_ids: bool = False
) -> KVCache:
    """A cache of `slots` empty slots per row in `dtype`; with `token_ids`, keeping each slot's token."""
    heads = (layers, batch, kv_heads)
    # Distinct buffers for keys and values, so the cache can be donated to a jitted step.
    keys = jnp.zeros((*heads, head_dim, slots), dtype)
    values = jnp.zeros((*heads, slots, head_dim), dtype)
    ids = jnp.zeros((batch, slots), jnp.int32) if token_ids else None
    return KVCache(keys=keys, values=values, lengths_B=jnp.zeros((batch,), jnp.int32), token_ids_BxS=ids)


def map_rows(cache: KVCache, fn) -> KVCache:
    """`cache` with `fn(array, row_axis)` applied to each of its arrays (e.g. to shard or select rows)."""
    ids = cache.token_ids_BxS
    return KVCache(
        keys=fn(cache.keys, 1),  # [L, B, K, E, S]
        values=fn(cache.values, 1),  # [L, B, K, S, E]
        lengths_B=fn(cache.lengths_B, 0),
        token_ids_BxS=None if ids is None else fn(ids, 0),
        states=None if cache.states is None else jax.tree.map(lambda state: fn(state, 0), cache.states),
    )


def leading_slots(cache: KVCache, size: int) -> KVCache:
    """The cache cut to its first `size` slots: exact for a step that reads and writes no slot >= size."""
    if size >= cache.capacity:
        return cache
    ids = None if cache.token_ids_BxS is None else cache.token_ids_BxS[:, :size]
    return KVCache(
        keys=cache.keys[..., :size],
        values=cache.values[:, :, :, :size],
        lengths_B=cache.lengths_B,
        token_ids_BxS=ids,
        states=cache.states,
    )


def with_leading_slots(cache: KVCache, window: KVCache) -> KVCache:
    """`cache` with its first slots and its lengths replaced by those of `window` (see `leading_slots`)."""
    size = window.capacity
    if size >= cache.capacity:
        return window
    ids = cache.token_ids_BxS
    if ids is not None:
        ids = ids.at[:, :size].set(window.token_ids_BxS)
    return KVCache(
        keys=cache.keys.at[..., :size].set(window.keys),
        values=cache.values.at[:, :, :, :size].set(window.values),
        lengths_B=window.lengths_B,
        token_ids_BxS=ids,
        states=window.states,
    )


def with_prefix(cache: KVCache, prefix: KVCache, rows_B: jax.Array) -> KVCache:
    """The cache with the first P slots of each row where `rows_B` replaced by `prefix` (one row, P slots)."""
    size = prefix.capacity

    def put(full, part, row_axis, slot_axis):
        rows = rows_B.reshape([-1 if axis == row_axis else 1 for axis in range(full.ndim)])
        slots = (slice(None),) * slot_axis + (slice(0, size),)
        return full.at[slots].set(jnp.where(rows, part.astype(full.dtype), full[slots]))

    ids = cache.token_ids_BxS
    return cache.replace(
        keys=put(cache.keys, prefix.keys, 1, 4),  # [L, B, K, E, S]
        values=put(cache.values, prefix.values, 1, 3),  # [L, B, K, S, E]
        token_ids_BxS=None if ids is None else put(ids, prefix.token_ids_BxS, 0, 1),  # [B, S]
    )


def by_layer(cache: KVCache) -> KVCache:
    """`cache` with its keys and values split into L separate buffers (see the module docstring)."""
    split = lambda stacked: tuple(stacked[layer] for layer in range(stacked.shape[0]))
    return cache.replace(keys=split(cache.keys), values=split(cache.values))


def stacked(cache: KVCache) -> KVCache:
    """`cache` with per-layer buffers (`by_layer`) stacked back into [L, ...] arrays."""
    return cache.replace(keys=jnp.stack(cache.keys), values=jnp.stack(cache.values))


@struct.dataclass
class ChunkPlacement:
    """Where the tokens of an appended chunk go and what they may attend to."""

    positions_BxT: jax.Array  # RoPE position of each new token (padding: a harmless clamped value)
    slots_BxT: jax.Array  # cache slot of each new token; padding gets S (out of range: dropped)
    allowed_BxTxS: jax.Array  # query t may attend slot s
    new_lengths_B: jax.Array


def place_chunk(lengths_B: jax.Array, mask_BxT: jax.Array, capacity: int) -> ChunkPlacement:
    """Positions, slots and attention mask for appending a (possibly padded) chunk to the cache."""
    mask_BxT = mask_BxT.astype(jnp.int32)
    positions_BxT = lengths_B[:, None] + jnp.cumsum(mask_BxT, axis=1) - 1
    slots_BxT = jnp.where(mask_BxT > 0, positions_BxT, capacity)
    positions_BxT = jnp.maximum(positions_BxT, 0)
    new_lengths_B = lengths_B + jnp.sum(mask_BxT, axis=1)
    slot_S = jnp.arange(capacity)
    allowed_BxTxS = (slot_S[None, None, :] <= positions_BxT[:, :, None]) & (
        slot_S[None, None, :] < new_lengths_B[:, None, None]
    )
    return ChunkPlacement(positions_BxT, slots_BxT, allowed_BxTxS, new_lengths_B)


def _write_slots(
    stacked: jax.Array, layer: jax.Array, slots_BxT: jax.Array, new_BxKxTxE: jax.Array, *, slots_last: bool
) -> jax.Array:
    """Scatters layer `layer`'s chunk into `stacked` at `slots_BxT` (out-of-range slots are dropped); the
    slots are the last axis (keys) or the one before the head dimension (values)."""
    batch, heads = stacked.shape[1:3]
    rows_Bx1x1 = jnp.arange(batch)[:, None, None]
    heads_1xKx1 = jnp.arange(heads)[None, :, None]
    slots_Bx1xT = slots_BxT[:, None, :]
    # With the slots last, the indexed axes are apart (E sits between), so the update is still [B, K, T]
    # then the sliced E, as it is with the slots before E.
    index = (layer, rows_Bx1x1, heads_1xKx1) + ((slice(None), slots_Bx1xT) if slots_last else (slots_Bx1xT,))
    return stacked.at[index].set(new_BxKxTxE.astype(stacked.dtype), mode="drop")


def write_keys(
    keys_LxBxKxExS: jax.Array, layer: jax.Array, slots_BxT: jax.Array, new_BxKxTxE: jax.Array
) -> jax.Array:
    """Scatters layer `layer`'s chunk of keys into their slots; out-of-range slots are dropped."""
    return _write_slots(keys_LxBxKxExS, layer, slots_BxT, new_BxKxTxE, slots_last=True)


def write_values(
    values_LxBxKxSxE: jax.Array, layer: jax.Array, slots_BxT: jax.Array, new_BxKxTxE: jax.Array
) -> jax.Array:
    """Scatters layer `layer`'s chunk of values into their slots; out-of-range slots are dropped."""
    return _write_slots(values_LxBxKxSxE, layer, slots_BxT, new_BxKxTxE, slots_last=False)


def layer_slots(stacked: jax.Array, layer: jax.Array) -> jax.Array:
    """Layer `layer`'s keys [B, K, E, S] (or values [B, K, S, E])."""
    return jax.lax.dynamic_index_in_dim(stacked, layer, axis=0, keepdims=False)
