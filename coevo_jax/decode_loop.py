"""The jitted sampling programs: chunk prefill and the `lax.while_loop` decode loop, and how a token is drawn.

Both programs are pure functions of (parameters, cache, ...) with the cache donated; `sampling.Sampler`
compiles and drives them:

* `prefill` appends a left-padded chunk of new tokens to every row's cache, after the length the caller sets
  for each row, and returns each row's next-token logits;
* `decode` samples up to `max_new_tokens` tokens for every active row, stopping each row on its own at a
  stop token (end of turn), a stop token *sequence*, `max_new_tokens`, or a full cache. With each token it
  returns its log-prob under the distribution it was drawn from (`sample_with_logprobs`: softmax of the
  logits / temperature, after any top-k / top-p cut), which GRPO keeps as its "old" log-probs.

Both run on the cache's first `window` slots (`kv_cache.leading_slots`). The decode loop takes each layer's
weights once per call, outside its per-token loop (`Decoder.layer_weights`), and keeps the cache as the
model's kernel set reads it best: stacked where it reads the live prefix in place, else split into per-layer
buffers (`kv_cache.by_layer`).

The random key is one for the whole batch, or one per row (a [B] key array): with a key per row, a row's
tokens depend only on its own key and logits, not on which other rows share the batch.

Stop sequences are matched on token ids on the device (cheap early exit); text-level stop strings are the
caller's to enforce after detokenization, since the same string can tokenize in more than one way.

Shape legend: B batch rows, T chunk length, V vocabulary, N max new tokens, W longest stop sequence.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from coevo_jax.models import KVCache, bind
from coevo_jax.models.kernels import XlaKernels
from coevo_jax.models.kv_cache import by_layer, leading_slots, stacked, with_leading_slots
from coevo_jax.sharding import activation_context

# Per-row stop reasons reported by `decode`.
RUNNING, STOP_TOKEN, STOP_SEQUENCE, MAX_TOKENS, CACHE_FULL, INACTIVE = range(6)
STOP_REASON_NAMES = ("running", "stop_token", "stop_sequence", "max_tokens", "cache_full", "inactive")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen: greedy (temperature 0) or temperature with optional top-k / top-p."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    max_new_tokens: int = 256

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError(f"invalid sampling config: {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass(frozen=True)
class StopConfig:
    """Token ids that end a row (they are kept as its last token) and token sequences that end it too."""

    stop_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        sequences = tuple(tuple(int(i) for i in seq) for seq in self.stop_sequences if len(seq))
        object.__setattr__(self, "stop_sequences", sequences)

    @property
    def window(self) -> int:
        """W: how many recent tokens the sequence matcher keeps (at least 1)."""
        return max([1, *(len(s) for s in self.stop_sequences)])

    def sequence_table(self) -> np.ndarray:
        """int32 [M, W], right-aligned, -1 where a shorter sequence leaves positions free."""
        table = np.full((max(1, len(self.stop_sequences)), self.window), -1, np.int32)
        for row, seq in enumerate(self.stop_sequences):
            table[row, self.window - len(seq) :] = seq
        return table


def sampling_logits(logits_BxV: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """float32 [B, V]: the logits a sampled token is drawn from, logits / T with tokens outside the
    top-k / top-p set at -inf (greedy: the logits themselves)."""
    logits_BxV = logits_BxV.astype(jnp.float32)
    if cfg.greedy:
        return logits_BxV
    logits_BxV = logits_BxV / cfg.temperature
    if cfg.top_k:
        kth_B = jax.lax.top_k(logits_BxV, cfg.top_k)[0][:, -1]
        logits_BxV = jnp.where(logits_BxV < kth_B[:, None], -jnp.inf, logits_BxV)
    if cfg.top_p < 1.0:
        sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
        probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
        mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
        # Smallest set whose mass reaches top_p: keep a token while the mass before it is < top_p.
        cutoff_B = jnp.min(jnp.where(mass_before_BxV < cfg.top_p, sorted_BxV, jnp.inf), axis=-1)
        logits_BxV = jnp.where(logits_BxV < cutoff_B[:, None], -jnp.inf, logits_BxV)
    return logits_BxV


# The drawing functions' default kernel set: XLA's ops. Drawing a token takes no product, the one operation
# whose XLA form depends on the platform.
_XLA = XlaKernels(platform="cpu")


def categorical(key: jax.Array, logits_BxV: jax.Array, kernels: XlaKernels = _XLA) -> jax.Array:
    """int32 [B]: `jax.random.categorical(key, logits)` (the same draws: the Gumbel-max trick on the same
    noise), its argmax taken by the kernel set. `key`: one key, or a [B] key array (row b drawn with
    key[b])."""
    if key.ndim:
        noise_BxV = jax.vmap(lambda k: jax.random.gumbel(k, logits_BxV.shape[1:], logits_BxV.dtype))(key)
    else:
        noise_BxV = jax.random.gumbel(key, logits_BxV.shape, logits_BxV.dtype)
    return kernels.argmax(noise_BxV + logits_BxV)


def sample_with_logprobs(
    logits_BxV: jax.Array, key: jax.Array, cfg: SamplingConfig, kernels: XlaKernels = _XLA
) -> tuple[jax.Array, jax.Array]:
    """(int32 [B] tokens, float32 [B] log-probs): the argmax, or a sample from softmax(logits / T) restricted
    to the top-k / top-p set, and its log-probability under the distribution it was drawn from,
    log softmax(`sampling_logits`)[token] (greedy: under softmax(logits)). `key`: one key for the batch, or a
    [B] key array (row b sampled with key[b] alone).

    These are the "old" log-probs of GRPO's importance ratio; a trainer reproduces them from the same
    logits divided by the same temperature (top-k / top-p truncation it cannot reproduce). `kernels`: the
    model's kernel set (default XLA's)."""
    logits_BxV = sampling_logits(logits_BxV, cfg)
    if cfg.greedy:
        token_B, normaliser_B = kernels.argmax_and_log_normaliser(logits_BxV)
    else:
        token_B = categorical(key, logits_BxV, kernels)
        normaliser_B = kernels.log_normaliser(logits_BxV)
    chosen_B = jnp.take_along_axis(logits_BxV, token_B[:, None], axis=-1)[:, 0]
    return token_B, chosen_B - normaliser_B


def _fold_in(key: jax.Array, data) -> jax.Array:
    """`jax.random.fold_in` of one key or of each key of a [B] key array."""
    if key.ndim:
        return jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, data)
    return jax.random.fold_in(key, data)


@struct.dataclass
class DecodeState:
    """The while-loop carry: cache, last sampled token per row, the output buffer and stop bookkeeping."""

    cache: KVCache
    last_token_B: jax.Array  # sampled but not yet fed to the model
    tokens_BxN: jax.Array
    logprobs_BxN: jax.Array  # each sampled token's log-prob under the distribution it was drawn from
    counts_B: jax.Array
    reasons_B: jax.Array
    recent_BxW: jax.Array  # the last W tokens of each row (-2 before any), for stop sequences
    step: jax.Array


@struct.dataclass
class DecodeResult:
    """What `decode` returns besides the cache: tokens [B, N] of which the first `counts_B` are valid, and
    their log-probs [B, N] float32 (`sample_with_logprobs`)."""

    tokens_BxN: jax.Array
    counts_B: jax.Array
    reasons_B: jax.Array
    logprobs_BxN: jax.Array


def _record(
    state: DecodeState, token_B: jax.Array, logprob_B: jax.Array, stops: StopConfig, max_new: int
) -> DecodeState:
    """Appends the sampled token (and its log-prob) to the running rows and decides which rows stop after it."""
    running_B = state.reasons_B == RUNNING
    rows_B = jnp.arange(token_B.shape[0])
    slot_B = jnp.where(running_B, state.counts_B, max_new)  # out of range for stopped rows: dropped
    tokens_BxN = state.tokens_BxN.at[rows_B, slot_B].set(token_B, mode="drop")
    logprobs_BxN = state.logprobs_BxN.at[rows_B, slot_B].set(logprob_B, mode="drop")
    counts_B = state.counts_B + running_B.astype(jnp.int32)
    recent_BxW = jnp.where(
        running_B[:, None],
        jnp.concatenate([state.recent_BxW[:, 1:], token_B[:, None]], axis=1),
        state.recent_BxW,
    )
    hit_token_B = jnp.isin(token_B, jnp.asarray(stops.stop_ids, jnp.int32)) if stops.stop_ids else False
    if stops.stop_sequences:
        table_MxW = jnp.asarray(stops.sequence_table())
        matches_BxMxW = (recent_BxW[:, None, :] == table_MxW[None]) | (table_MxW[None] == -1)
        hit_sequence_B = jnp.any(jnp.all(matches_BxMxW, axis=-1), axis=-1)
    else:
        hit_sequence_B = False
    reason_B = jnp.select(
        [
            hit_token_B & running_B,
            hit_sequence_B & running_B,
            (counts_B >= max_new) & running_B,
            (state.cache.lengths_B >= state.cache.capacity) & running_B,  # no slot left to feed it
        ],
        [STOP_TOKEN, STOP_SEQUENCE, MAX_TOKENS, CACHE_FULL],
        state.reasons_B,
    )
    return state.replace(
        last_token_B=token_B,
        tokens_BxN=tokens_BxN,
        logprobs_BxN=logprobs_BxN,
        counts_B=counts_B,
        reasons_B=reason_B,
        recent_BxW=recent_BxW,
        step=state.step + 1,
    )


def prefill(
    params,
    cache: KVCache,
    ids_BxT,
    mask_BxT,
    start_lengths_B,
    *,
    graphdef,
    window: int,
    fresh: bool = False,
    mesh=None,
    rules=None,
    weights=None,
) -> tuple[jax.Array, KVCache]:
    """Sets each row's cache length, appends its (left-padded) chunk; returns next-token logits [B, V].

    A row whose chunk is all padding keeps its cache unchanged (its logits are garbage). Every row with a
    chunk must end within the first `window` slots. `fresh`: every row with a chunk starts at length 0, so
    the chunk attends only itself (the causal block path; see `Decoder.hidden_states_cached`), unless the
    model's kernel set reads the cache in place (the CPU kernels): it then attends the chunk through the
    cache, as fast as the block path or faster.
    """
    with _maybe_activation_context(mesh, rules):
        model = bind(graphdef, params, weights, per_layer=False)
        cfg = model.config
        fresh = fresh and not model.kernels.reads_cache_in_place(cfg.dtype, cache.keys.dtype, cfg.head_dim)
        full = cache.replace(lengths_B=start_lengths_B.astype(jnp.int32))
        hidden_BxTxD, part = model.hidden_states_cached(
            ids_BxT, leading_slots(full, window), mask_BxT, fresh=fresh
        )
        logits_BxV = model.logits_from_hidden(hidden_BxTxD[:, -1:])[:, 0]  # left padding: last is real
    return logits_BxV, with_leading_slots(full, part)


def decode(
    params,
    cache: KVCache,
    logits_BxV,
    active_B,
    key,
    *,
    graphdef,
    sampling: SamplingConfig,
    stops: StopConfig,
    window: int,
    mesh=None,
    rules=None,
    weights=None,
) -> tuple[DecodeResult, KVCache]:
    """Samples up to `max_new_tokens` per active row from `logits_BxV` on; see the module docstring.

    Runs on the cache's first `window` slots: every active row's length plus `max_new_tokens` must fit
    in them, unless `window` is the whole cache (then a row may stop at a full cache)."""
    batch, max_new = logits_BxV.shape[0], sampling.max_new_tokens
    full = cache
    with _maybe_activation_context(mesh, rules):
        model = bind(graphdef, params, weights, per_layer=False)
        layer_weights = model.layer_weights(rows=batch)  # taken once here, not at every token
        cfg = model.config
        # a kernel set that reads the stacked cache in place keeps it; XLA's attention reads per-layer buffers
        in_place = model.kernels.reads_cache_in_place(cfg.dtype, cache.keys.dtype, cfg.head_dim)
        window_cache = leading_slots(cache, window)
        state = DecodeState(
            cache=window_cache if in_place else by_layer(window_cache),
            last_token_B=jnp.zeros((batch,), jnp.int32),
            tokens_BxN=jnp.zeros((batch, max_new), jnp.int32),
            logprobs_BxN=jnp.zeros((batch, max_new), jnp.float32),
            counts_B=jnp.zeros((batch,), jnp.int32),
            reasons_B=jnp.where(active_B, RUNNING, INACTIVE).astype(jnp.int32),
            recent_BxW=jnp.full((batch, stops.window), -2, jnp.int32),
            step=jnp.zeros((), jnp.int32),
        )
        state = _record(
            state,
            *sample_with_logprobs(logits_BxV, _fold_in(key, 0), sampling, model.kernels),
            stops,
            max_new,
        )

        def body(state: DecodeState) -> DecodeState:
            feed_B = state.reasons_B == RUNNING
            logits_Bx1xV, cache = model.forward_cached(
                state.last_token_B[:, None],
                state.cache,
                feed_B[:, None].astype(jnp.int32),
                layer_weights=layer_weights,
            )
            token_B, logprob_B = sample_with_logprobs(
                logits_Bx1xV[:, 0], _fold_in(key, state.step), sampling, model.kernels
            )
            return _record(state.replace(cache=cache), token_B, logprob_B, stops, max_new)

        state = jax.lax.while_loop(lambda s: jnp.any(s.reasons_B == RUNNING), body, state)
    result = DecodeResult(state.tokens_BxN, state.counts_B, state.reasons_B, state.logprobs_BxN)
    return result, with_leading_slots(full, state.cache if in_place else stacked(state.cache))


def _maybe_activation_context(mesh, rules):
    return contextlib.nullcontext() if mesh is None else activation_context(mesh, rules)
