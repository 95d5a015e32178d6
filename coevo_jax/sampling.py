"""Batched sampling with the KV cache, driven from the host: `Sampler` compiles and calls the programs of
`decode_loop` for one architecture, batch size, cache size and mesh.

* `prefill` appends a left-padded chunk of new tokens to every row's cache (a whole prompt, or just the
  tokens that arrived since the row's last turn: closing tokens of the reply plus the next observation)
  and returns each row's next-token logits. Chunks are padded to a few power-of-two buckets, so a rollout
  phase compiles one prefill program per bucket that actually occurs.
* `decode` samples up to `max_new_tokens` tokens for every active row, each with its log-prob
  (`decode_loop.decode`).

Both run on a *window* of the cache (`window_for`), so a turn's cost follows the context the batch really has.
Shared leading tokens (a system prompt) are encoded once (`prompt_prefix`, `copy_prefix`); each row's cache
length is set by the caller on every prefill; a LoRA policy is sampled merged or not (`merge_lora`).

The names a caller needs besides `Sampler` (the sampling and stop configs, the stop reasons, the drawing
function) are importable from here too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from coevo_jax.data.batching import bucket_for, power_of_two_buckets
from coevo_jax.decode_loop import (
    CACHE_FULL,
    INACTIVE,
    MAX_TOKENS,
    RUNNING,
    STOP_REASON_NAMES,
    STOP_SEQUENCE,
    STOP_TOKEN,
    DecodeResult,
    SamplingConfig,
    StopConfig,
    decode,
    prefill,
    sample_with_logprobs,
)
from coevo_jax.models import KVCache, ModelConfig, abstract_model, init_cache, partition_trainable
from coevo_jax.models.kv_cache import leading_slots, map_rows, with_prefix
from coevo_jax.models.lora import merged_params
from coevo_jax.sharding import ShardingRules, compute_shardings

__all__ = [
    "CACHE_FULL",
    "INACTIVE",
    "MAX_TOKENS",
    "RUNNING",
    "STOP_REASON_NAMES",
    "STOP_SEQUENCE",
    "STOP_TOKEN",
    "DecodeResult",
    "Sampler",
    "SamplingConfig",
    "StopConfig",
    "left_pad",
    "sample_with_logprobs",
]


def left_pad(chunks: list[list[int] | None], buckets: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """ids and mask int32 [B, bucket]: each row's tokens right-aligned; None or [] is all padding."""
    length = bucket_for(max((len(c) for c in chunks if c), default=1), buckets)
    ids = np.zeros((len(chunks), length), np.int32)
    mask = np.zeros((len(chunks), length), np.int32)
    for row, chunk in enumerate(chunks):
        if chunk:
            ids[row, length - len(chunk) :] = chunk
            mask[row, length - len(chunk) :] = 1
    return ids, mask


class Sampler:
    """Compiled prefill/decode programs for one architecture, batch size, cache size and mesh.

    The compute dtype is `model_config.dtype`, independent of how the policy trains: the same parameters
    can be sampled in float32 (faster for decoding on the CPU, where XLA emulates bf16 elementwise math)
    and trained in bf16, or sampled in bf16 on a GPU.

    The programs take `weights(params)`, where `params` is a policy's pure parameter dict (the whole
    policy: base and adapters under LoRA; `nnx.state(model)` as a pure dict): the same dict, or with
    `merge_lora` the base with the adapters folded in. With a mesh, cache rows are sharded over the batch
    mesh axes and FSDP-stored weights are gathered for compute, as in the train steps.

    `merge_lora` (the default) folds a LoRA policy's adapters in once per policy and compiles the base
    architecture's programs; without it the programs apply each adapter's two small matmuls at every token,
    and no merged copy of the base exists.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        *,
        batch_size: int,
        cache_len: int,
        sampling: SamplingConfig = SamplingConfig(),  # noqa: B008 (frozen, immutable)
        stops: StopConfig = StopConfig(),  # noqa: B008 (frozen, immutable)
        cache_dtype=None,
        mesh: Mesh | None = None,
        rules: ShardingRules | None = None,
        param_shardings=None,
        merge_lora: bool = True,
        window_buckets: tuple[int, ...] | None = None,
    ):
        if model_config.layer_types:
            raise NotImplementedError(
                f"{model_config.model_type}: the sampler's decode loop keeps one stacked cache, not the "
                "per-layer cache of several kinds of layer (Decoder.forward_cached decodes such models)"
            )
        self.merge_lora = bool(model_config.lora_rank) and merge_lora
        program_config = model_config.without_lora() if self.merge_lora else model_config
        # remat and unrolled layers only pay in backward passes, and sampling has none
        program_config = program_config.replace(remat=False, unroll_layers=False)
        graphdef, _ = abstract_model(program_config)  # its config resolved: the platform and kernel set
        self.graphdef, self.model_config = graphdef, model_config
        self.batch_size, self.cache_len = batch_size, cache_len
        self.sampling, self.stops, self.cache_dtype = sampling, stops, cache_dtype
        self.mesh, self.rules = mesh, rules if rules is not None or mesh is None else ShardingRules()
        self.buckets = power_of_two_buckets(cache_len, min_length=16)  # prefill chunk lengths
        if self.merge_lora and param_shardings is not None:  # the merged weights are sharded like the base
            param_shardings = partition_trainable(param_shardings, model_config)[1]
        self._merge = jax.jit(
            functools.partial(merged_params, cfg=model_config), out_shardings=param_shardings
        )
        # cache windows: (cache_len,) turns windowing off. From 512 slots up: a smaller window saves a decode
        # step little, and every bucket compiles its own programs.
        buckets = (
            power_of_two_buckets(cache_len, min_length=512) if window_buckets is None else window_buckets
        )
        self.window_buckets = tuple(sorted({min(int(b), cache_len) for b in buckets} | {cache_len}))
        weights = None if param_shardings is None else compute_shardings(param_shardings, self.rules)
        static = dict(graphdef=graphdef, mesh=mesh, rules=self.rules, weights=weights)
        self._prefill = jax.jit(
            functools.partial(prefill, **static), donate_argnums=1, static_argnames=("window", "fresh")
        )
        self._decode = jax.jit(
            functools.partial(decode, sampling=sampling, stops=stops, **static),
            donate_argnums=1,
            static_argnames="window",
        )
        # A fresh callable per sampler: jit shares one cache among wrappers of the same function, and
        # `compilations` must count this sampler's programs only.
        self._copy_prefix = jax.jit(functools.partial(with_prefix), donate_argnums=0)

    @classmethod
    def for_model(cls, model, **kwargs) -> tuple[Sampler, dict]:
        """A sampler for an NNX decoder and its parameters as a pure dict (pass them through `weights`)."""
        return cls(model.config, **kwargs), nnx.to_pure_dict(nnx.state(model))

    def weights(self, params: dict) -> dict:
        """What `prefill` and `decode` take for the policy `params`: the adapters merged into the base
        (LoRA with `merge_lora`, computed on device once per call of this), else `params` itself."""
        return self._merge(params) if self.merge_lora else params

    @property
    def compilations(self) -> int:
        """Programs compiled so far (prefill and decode per bucket, the prefix copy)."""
        return self._prefill._cache_size() + self._decode._cache_size() + self._copy_prefix._cache_size()

    def _rows(self, array, axis: int = 0):
        """`array` with its rows (axis `axis`) sharded over the batch mesh axes (as is without a mesh)."""
        array = jnp.asarray(array)
        if self.mesh is None:
            return array
        spec = PartitionSpec(*([None] * axis), self.rules.batch_axes, *([None] * (array.ndim - axis - 1)))
        return jax.device_put(array, NamedSharding(self.mesh, spec))

    def init_cache(self) -> KVCache:
        """An empty cache for `batch_size` rows of `cache_len` slots, rows sharded over the mesh."""
        cache = init_cache(self.model_config, self.batch_size, self.cache_len, self.cache_dtype)
        return map_rows(cache, self._rows)

    def window_for(self, live_length: int) -> int:
        """The cache window for a turn whose longest row holds `live_length` tokens before decoding.

        Its first W slots, W the smallest window bucket that holds the longest live row plus `max_new_tokens`
        (at most the whole cache): attention reads W slots a step, not the cache's capacity, with the same
        result (slots past a row's length are masked either way). One decode program compiles per window
        bucket that occurs, one prefill program per (chunk bucket, window bucket)."""
        return bucket_for(
            min(live_length + self.sampling.max_new_tokens, self.cache_len), self.window_buckets
        )

    def prefill(
        self,
        weights,
        cache: KVCache,
        chunks: list[list[int] | None],
        start_lengths,
        window: int | None = None,
    ) -> tuple:
        """Appends per-row chunks (None: nothing) after `start_lengths` tokens; returns (logits, cache).

        A chunk is a whole prompt or the tokens since the row's last turn (the reply's closing tokens and the
        next observation), padded to a power-of-two bucket. Setting the lengths makes a new episode (length 0)
        and rolling back a reply cut at a stop string free: the cache is compacted, so slots past a length are
        ignored. After `decode` a row's cache holds every generated token but the last (sampled, never fed),
        which the caller appends with the next chunk.

        `weights` is `self.weights(params)`. `window` (see `window_for`) defaults to the one this turn's
        longest row needs; pass the same one to `decode`."""
        if len(chunks) != self.batch_size:
            raise ValueError(f"expected {self.batch_size} chunks, got {len(chunks)}")
        ids, mask = left_pad(chunks, self.buckets)
        start = np.asarray(start_lengths, np.int32)
        if np.any(start + mask.sum(axis=1) > self.cache_len):
            row = int(np.argmax(start + mask.sum(axis=1) > self.cache_len))
            raise ValueError(
                f"row {row}: {start[row]} cached + {mask[row].sum()} new tokens exceed the "
                f"cache of {self.cache_len}"
            )
        live = int(np.max(np.where(mask.sum(axis=1) > 0, start + mask.sum(axis=1), 0)))
        window = self.window_for(live) if window is None else window
        if live > window or window not in self.window_buckets:
            raise ValueError(f"window {window} is not one of {self.window_buckets} holding {live} tokens")
        fresh = bool(np.all(start[mask.sum(axis=1) > 0] == 0))  # a first chunk: the causal block path
        return self._prefill(
            weights, cache, self._rows(ids), self._rows(mask), self._rows(start), window=window, fresh=fresh
        )

    def decode(
        self, weights, cache: KVCache, logits, active, key, window: int | None = None
    ) -> tuple[DecodeResult, KVCache]:
        """Dispatches the decode loop for rows where `active` is true (asynchronous, like any jit call);
        `key` is one key or a [B] key array, one per row; `weights` is `self.weights(params)`. `window`: the
        prefill's (default: the whole cache); every active row's length plus `max_new_tokens` must fit in it."""
        key = self._rows(key) if key.ndim else key
        window = self.cache_len if window is None else window
        if window not in self.window_buckets:
            raise ValueError(f"window {window} is not one of {self.window_buckets}")
        active = self._rows(np.asarray(active, bool))
        return self._decode(weights, cache, logits, active, key, window=window)

    def prompt_prefix(self, weights, tokens: list[int]) -> KVCache:
        """Keys, values and ids of `tokens` at the start of a row: a one-row cache of len(tokens) slots
        (`weights` as for `prefill`)."""
        cache = self.init_cache()
        chunks = [list(tokens)] + [None] * (self.batch_size - 1)
        _, cache = self.prefill(weights, cache, chunks, np.zeros(self.batch_size, np.int32))
        first_row = lambda array, axis: jax.lax.slice_in_dim(array, 0, 1, axis=axis)
        return map_rows(leading_slots(cache, len(tokens)), first_row)

    def copy_prefix(self, cache: KVCache, prefix: KVCache, rows) -> KVCache:
        """`cache` with `prefix` (see `prompt_prefix`) written at the start of each row where `rows` is true;
        the caller then prefills those rows from `prefix.capacity` on."""
        return self._copy_prefix(cache, prefix, self._rows(np.asarray(rows, bool)))

    def generate(self, params, prompts: list[list[int]], key) -> list[list[int]]:
        """One-shot convenience: sample a continuation of each prompt (at most `batch_size` of them) from
        the policy `params`."""
        weights = self.weights(params)
        chunks = list(prompts) + [None] * (self.batch_size - len(prompts))
        cache = self.init_cache()
        window = self.window_for(max(len(p) for p in prompts))
        logits, cache = self.prefill(weights, cache, chunks, np.zeros(self.batch_size, np.int32), window)
        result, _ = self.decode(weights, cache, logits, [c is not None for c in chunks], key, window)
        tokens, counts = np.asarray(result.tokens_BxN), np.asarray(result.counts_B)
        return [tokens[row, : counts[row]].tolist() for row in range(len(prompts))]
