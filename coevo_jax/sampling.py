"""Batched sampling with the KV cache: jitted chunk prefill and a `lax.while_loop` decode loop.

Two programs, both pure functions of (parameters, cache, ...) with the cache donated:

* `prefill` appends a left-padded chunk of new tokens to every row's cache (a whole prompt, or just the
  tokens that arrived since the row's last turn: closing tokens of the reply plus the next observation)
  and returns each row's next-token logits. Chunks are padded to a few power-of-two buckets, so a rollout
  phase compiles one prefill program per bucket that actually occurs.
* `decode` samples up to `max_new_tokens` tokens for every active row, stopping each row on its own at a
  stop token (end of turn), a stop token *sequence*, `max_new_tokens`, or a full cache. With each token it
  returns its log-prob under the distribution it was drawn from (`sample_with_logprobs`: softmax of the
  logits / temperature, after any top-k / top-p cut), which GRPO keeps as its "old" log-probs.

Both run on a *window* of the cache: its first W slots, W the smallest of a few power-of-two buckets that
holds the longest live row plus `max_new_tokens` (at most the whole cache). Attention reads W slots per
step, not the cache's capacity, so a turn's cost follows the context the batch really has; the result is
the same as over the whole cache (slots past a row's length are masked either way). One decode program
compiles per window bucket that occurs, one prefill program per (chunk bucket, window bucket).

Prompts that share a leading run of tokens (a system prompt, an in-context example) need it encoded once:
`prompt_prefix` computes its keys and values in one row, and `copy_prefix` writes them into the rows that
start a new episode with it, so their prefill chunk is only the rest of the prompt.

Each row's cache length is set by the caller on every prefill (`start_lengths_B`), which makes starting a
new episode in a row (length 0) and rolling back a reply cut at a stop string (a shorter length) free: the
cache is compacted (`coevo_jax.models.kv_cache`), so slots past the length are simply ignored. After
`decode`, a row's cache holds every generated token except the last one (which was sampled, never fed);
the caller appends it with the next chunk.

The random key is one for the whole batch, or one per row (a [B] key array): with a key per row, a row's
tokens depend only on its own key and logits, not on which other rows share the batch, so a caller that
derives each row's key from its episode gets the same samples however episodes are batched.

Stop sequences are matched on token ids on the device (cheap early exit); text-level stop strings are the
caller's to enforce after detokenization, since the same string can tokenize in more than one way.

A LoRA policy is sampled either with its adapters merged into the base weights (`merge_lora`, the default:
`Sampler.weights` folds them in once per policy, and the programs are those of the base architecture) or
unmerged (the programs apply each adapter's two small matmuls at every token; no merged copy of the base).
`bench/lora_sampling.py` measures both.

Shape legend: B batch rows, T chunk length, V vocabulary, N max new tokens, W longest stop sequence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from coevo_jax.data.batching import bucket_for, power_of_two_buckets
from coevo_jax.models.config import ModelConfig
from coevo_jax.models.cpu_kernels import logit_stats, logit_stats_applies, prefix_attention_applies
from coevo_jax.models.decoder import abstract_model, bind, partition_trainable
from coevo_jax.models.kv_cache import (
    KVCache,
    by_layer,
    init_cache,
    leading_slots,
    stacked,
    with_leading_slots,
)
from coevo_jax.models.lora import merged_params
from coevo_jax.sharding import ShardingRules, activation_context, compute_shardings

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


ARGMAX_BLOCK = 128  # the block width of `first_argmax`'s first pass


def first_argmax(x_BxV: jax.Array) -> jax.Array:
    """int32 [...]: `jnp.argmax(x, axis=-1)` (the first maximum; NaN counts as the largest), in two passes.

    XLA:CPU emits argmax's one-pass (value, index) reduction as scalar code: ~150 µs on [8, 8192], at every
    decode step. Here a plain maximum over blocks of `ARGMAX_BLOCK` values (vectorised) finds the first block
    holding the row's maximum (or its first NaN), and one argmax over that block alone finds it: ~50 µs in all
    (`bench/argmax.py`). A last partial block is padded with -inf, which never comes before a real value."""
    if logit_stats_applies(x_BxV.dtype):  # one pass of a CPU kernel instead
        return logit_stats(x_BxV)[0]
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


def categorical(key: jax.Array, logits_BxV: jax.Array) -> jax.Array:
    """int32 [B]: `jax.random.categorical(key, logits)` (the same draws: the Gumbel-max trick on the same
    noise), its argmax taken by `first_argmax`. `key`: one key, or a [B] key array (row b drawn with key[b])."""
    if key.ndim:
        noise_BxV = jax.vmap(lambda k: jax.random.gumbel(k, logits_BxV.shape[1:], logits_BxV.dtype))(key)
    else:
        noise_BxV = jax.random.gumbel(key, logits_BxV.shape, logits_BxV.dtype)
    return first_argmax(noise_BxV + logits_BxV)


def log_normaliser(logits_BxV: jax.Array) -> jax.Array:
    """float32 [B]: log sum exp over the vocabulary, the sum of exponentials taken as a product with a vector
    of ones (at full float32 precision, which TPUs and GPUs do not give a float32 product by default). On
    XLA:CPU, `jax.nn.logsumexp`'s fused exp-and-sum reduction took 108 µs of a 1.6 ms anchor decode step
    (8 rows x 8,192), the exponentials and the matrix-vector product ~30 µs."""
    if logit_stats_applies(logits_BxV.dtype):  # one pass of a CPU kernel instead
        return logit_stats(logits_BxV)[1]
    max_B = jnp.max(logits_BxV, axis=-1)
    ones_V = jnp.ones(logits_BxV.shape[-1], logits_BxV.dtype)
    exp_sum_B = jnp.matmul(jnp.exp(logits_BxV - max_B[:, None]), ones_V, precision=jax.lax.Precision.HIGHEST)
    return max_B + jnp.log(exp_sum_B)


def sample_with_logprobs(
    logits_BxV: jax.Array, key: jax.Array, cfg: SamplingConfig
) -> tuple[jax.Array, jax.Array]:
    """(int32 [B] tokens, float32 [B] log-probs): `sample_tokens`'s draw and its log-probability under the
    distribution it was drawn from, log softmax(`sampling_logits`)[token] (greedy: under softmax(logits)).

    These are the "old" log-probs of GRPO's importance ratio; a trainer reproduces them from the same
    logits divided by the same temperature (top-k / top-p truncation it cannot reproduce)."""
    logits_BxV = sampling_logits(logits_BxV, cfg)
    if cfg.greedy and logit_stats_applies(logits_BxV.dtype):  # the token and its normaliser in one call
        token_B, normaliser_B = logit_stats(logits_BxV)
    else:
        token_B = first_argmax(logits_BxV) if cfg.greedy else categorical(key, logits_BxV)
        normaliser_B = log_normaliser(logits_BxV)
    chosen_B = jnp.take_along_axis(logits_BxV, token_B[:, None], axis=-1)[:, 0]
    return token_B, chosen_B - normaliser_B


def sample_tokens(logits_BxV: jax.Array, key: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """int32 [B]: argmax, or a sample from softmax(logits / T) restricted to the top-k / top-p set.

    `key`: one key for the batch, or a [B] key array (row b sampled with key[b] alone)."""
    return sample_with_logprobs(logits_BxV, key, cfg)[0]


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
    CPU kernel `prefix_attention` serves the cache: it attends the chunk through the cache as fast or faster
    (the anchor's 8 x 256-token prefill 41-42 ms against 44 on the block path; SmolLM2's layers 0.89-1.03x the
    block path's time from 256 to 2,000 tokens, `bench/fresh_prefill.py`; bench/README.md session 18).
    """
    with _maybe_activation_context(mesh, rules):
        model = bind(graphdef, params, weights, per_layer=False)
        cfg = model.config
        fresh = fresh and not prefix_attention_applies(cfg.dtype, cache.keys.dtype, cfg.head_dim)
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
        # the CPU kernel reads the stacked cache in place; XLA's attention reads per-layer buffers in place
        in_place = prefix_attention_applies(cfg.dtype, cache.keys.dtype, cfg.head_dim)
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
        state = _record(state, *sample_with_logprobs(logits_BxV, _fold_in(key, 0), sampling), stops, max_new)

        def body(state: DecodeState) -> DecodeState:
            feed_B = state.reasons_B == RUNNING
            logits_Bx1xV, cache = model.forward_cached(
                state.last_token_B[:, None],
                state.cache,
                feed_B[:, None].astype(jnp.int32),
                layer_weights=layer_weights,
            )
            token_B, logprob_B = sample_with_logprobs(logits_Bx1xV[:, 0], _fold_in(key, state.step), sampling)
            return _record(state.replace(cache=cache), token_B, logprob_B, stops, max_new)

        state = jax.lax.while_loop(lambda s: jnp.any(s.reasons_B == RUNNING), body, state)
    result = DecodeResult(state.tokens_BxN, state.counts_B, state.reasons_B, state.logprobs_BxN)
    return result, with_leading_slots(full, state.cache if in_place else stacked(state.cache))


def copy_prefix(cache: KVCache, prefix: KVCache, rows_B: jax.Array) -> KVCache:
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


def _maybe_activation_context(mesh, rules):
    return contextlib.nullcontext() if mesh is None else activation_context(mesh, rules)


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
    can be sampled in float32 (faster for decoding on the CPU, where XLA emulates bf16 elementwise math;
    measured 2x) and trained in bf16, or sampled in bf16 on a GPU.

    The programs take `weights(params)`, where `params` is a policy's pure parameter dict (the whole
    policy: base and adapters under LoRA; `nnx.state(model)` as a pure dict): the same dict, or with
    `merge_lora` the base with the adapters folded in. With a mesh, cache rows are sharded over the batch
    mesh axes and FSDP-stored weights are gathered for compute, as in the train steps.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        *,
        batch_size: int,
        cache_len: int,
        sampling: SamplingConfig = SamplingConfig(),
        stops: StopConfig = StopConfig(),
        cache_dtype=None,
        mesh: Mesh | None = None,
        rules: ShardingRules | None = None,
        param_shardings=None,
        merge_lora: bool = True,
        window_buckets: tuple[int, ...] | None = None,
    ):
        self.merge_lora = bool(model_config.lora_rank) and merge_lora
        program_config = model_config.without_lora() if self.merge_lora else model_config
        # remat and unrolled layers only pay in backward passes, and sampling has none
        program_config = program_config.replace(remat=False, unroll_layers=False)
        graphdef, _ = abstract_model(program_config)
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
        # cache windows: (cache_len,) turns windowing off. From 512 slots up: below that a decode step saves
        # little (0.79 ms at 512, 0.66 at 256 on a 2-core CPU) and every bucket compiles its own programs.
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
        self._copy_prefix = jax.jit(functools.partial(copy_prefix), donate_argnums=0)

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
        ids = cache.token_ids_BxS
        return KVCache(
            keys=self._rows(cache.keys, axis=1),  # [L, B, K, E, S]
            values=self._rows(cache.values, axis=1),
            lengths_B=self._rows(cache.lengths_B),
            token_ids_BxS=None if ids is None else self._rows(ids),
        )

    def window_for(self, live_length: int) -> int:
        """The cache window for a turn whose longest row holds `live_length` tokens before decoding."""
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
        head = leading_slots(cache, len(tokens))
        ids = head.token_ids_BxS
        return KVCache(
            keys=head.keys[:, :1],  # [L, B, K, E, S]: the first row
            values=head.values[:, :1],
            lengths_B=head.lengths_B[:1],
            token_ids_BxS=None if ids is None else ids[:1],
        )

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
