"""Actors: what produces the agent's replies for a batch of episodes in flight.

The rollout loop hands an actor a batch of `TurnRequest`s (one per slot: the conversation so far, ending
with a user message) and gets back a `PendingReplies`; `result()` gives each slot's reply text. Submitting
returns at once, so the loop can step environments while the device decodes.

* `ModelActor`: a language model through `coevo_jax.sampling.Sampler`. Slots are rows of G equally sized
  groups (one KV cache each); a request for a slot continues that row's cache with only the new tokens.
  A reply ends at the end-of-turn token, a stop string (cut off, with the cache rolled back to the kept
  tokens), `max_new_tokens`, or a full cache. A slot whose context no longer fits gets `None` back.
  Each reply is sampled with a key of its own: the actor's seed folded with the episode (task id, sample)
  and the turn, so an episode's replies do not depend on which slot, batch or process plays it (a rollout
  resumed after a crash samples its remaining episodes as the uninterrupted one did).
  The leading tokens that the first two episodes' prompts share (at least `MIN_SHARED_PREFIX`: the
  environment's instructions) are encoded once and copied into the cache of every episode that starts
  with them, so a new episode prefills only the rest of its prompt.
  `trace(slot)` gives the episode's exact tokens (`TokenTrace`: the context as the sampler saw it, each
  reply's kept tokens and the sampler's log-prob of each), which the rollout loop stores with the
  trajectory for GRPO.
* `ScriptedActor`: a Python function of the request (tests, expert replay, baselines).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from coevo_jax.data.records import Message, TokenTrace
from coevo_jax.rollout.turns import TurnCodec
from coevo_jax.sampling import STOP_SEQUENCE, STOP_TOKEN, Sampler


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    """The conversation of one slot so far (ending with a user message) and whether it is a new episode."""

    messages: Sequence[Message]
    new_episode: bool
    task_id: str = ""
    sample: int = 0  # which of the task's episodes (0 .. samples_per_task - 1)


class PendingReplies:
    """Replies being computed; `result()` blocks until they are ready: {slot: text, or None if out of room}."""

    def __init__(self, finish: Callable[[], dict[int, str | None]]):
        self._finish, self._value = finish, None

    def result(self) -> dict[int, str | None]:
        if self._value is None:
            self._value = self._finish()
        return self._value


class ScriptedActor:
    """Replies from `reply_fn(request) -> str` (one slot per group member, no device)."""

    def __init__(self, reply_fn: Callable[[TurnRequest], str], *, num_slots: int = 8, num_groups: int = 1):
        self.reply_fn, self.num_slots, self.num_groups = reply_fn, num_slots, num_groups

    def submit(self, requests: Mapping[int, TurnRequest]) -> PendingReplies:
        replies = {slot: self.reply_fn(request) for slot, request in requests.items()}
        return PendingReplies(lambda: replies)

    def sampling_info(self) -> dict:
        return {"actor": "scripted"}


MIN_SHARED_PREFIX = 32  # shorter shared prompt prefixes are not worth a cache copy


def shared_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share, leaving at least one token of each to prefill."""
    limit, n = min(len(a), len(b)) - 1, 0
    while n < limit and a[n] == b[n]:
        n += 1
    return max(n, 0)


@dataclasses.dataclass
class _SlotContext:
    tokens: list[int]  # everything the model is conditioned on, up to the last reply's kept tokens
    cached: int  # how many leading tokens of `tokens` the device cache of the slot's row holds
    messages_seen: int
    reply_closed: bool = True
    reply_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # [start, end) in tokens
    reply_logprobs: list[float] = dataclasses.field(default_factory=list)  # the sampler's, per span token


@jax.jit
def _turn_keys(key: jax.Array, turns_Bx3: jax.Array) -> jax.Array:
    """[B] keys: `key` folded with each row's (task id hash, sample, turn)."""

    def one(row):
        return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, row[0]), row[1]), row[2])

    return jax.vmap(one)(turns_Bx3)


class ModelActor:
    """Batched multi-turn sampling with a persistent KV cache per group of slots."""

    def __init__(
        self,
        sampler: Sampler,
        params,
        codec: TurnCodec,
        *,
        num_groups: int = 1,
        stop_strings: Sequence[str] = (),
        seed: int = 0,
        model_name: str = "",
        share_prompt_prefix: bool = True,
    ):
        self.sampler, self.params, self.codec = sampler, params, codec
        self.weights = sampler.weights(params)  # LoRA adapters merged once per actor, if the sampler merges
        self.num_groups, self.rows = num_groups, sampler.batch_size
        self.num_slots = num_groups * self.rows
        self.stop_strings = tuple(stop_strings)
        self.seed, self.model_name = seed, model_name
        self._key = jax.random.key(seed)
        self._caches = [sampler.init_cache() for _ in range(num_groups)]
        self._slots: dict[int, _SlotContext] = {}
        self.generated_tokens = 0
        self._first_prompt: list[int] | None = None if share_prompt_prefix else []
        self._prefix: list[int] = []
        self._prefix_cache = None

    def sampling_info(self) -> dict:
        cfg = self.sampler.sampling
        return {
            "actor": "model",
            "model": self.model_name,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k,
            "max_new_tokens": cfg.max_new_tokens,
            "seed": self.seed,
        }

    def context(self, slot: int) -> tuple[list[int], list[tuple[int, int]]]:
        """The tokens the slot's current (or last) episode was conditioned on, and its replies' spans."""
        context = self._slots[slot]
        return list(context.tokens), list(context.reply_spans)

    def trace(self, slot: int) -> TokenTrace | None:
        """The exact tokens of the slot's current (or last) episode with the sampler's log-probs of its
        replies; None when the slot has none (its episode ended at the context limit).

        The rollout loop calls it from an environment thread once the slot's episode has ended, before the
        slot's next request: the context is complete then and nothing else writes it."""
        context = self._slots.get(slot)
        if context is None:
            return None
        return TokenTrace(tuple(context.tokens), tuple(context.reply_spans), tuple(context.reply_logprobs))

    def _prepare(self, slot: int, request: TurnRequest) -> list[int] | None:
        """The slot's new chunk (and its context updated), or None when the context no longer fits."""
        context = self._slots.get(slot)
        if request.new_episode or context is None:
            prompt = self.codec.prompt_tokens(request.messages)
            context = _SlotContext(prompt, self._shared_start(prompt), len(request.messages))
        else:
            new = request.messages
            if len(new) != context.messages_seen + 2:
                raise ValueError(f"slot {slot}: expected the reply and one observation since the last turn")
            context.tokens += self.codec.continuation_tokens(new, context.reply_closed)
            context.messages_seen = len(new)
        self._slots[slot] = context
        if len(context.tokens) >= self.sampler.cache_len:  # no room left to generate
            del self._slots[slot]
            return None
        return context.tokens[context.cached :]

    def _shared_start(self, prompt: list[int]) -> int:
        """How many leading tokens of a new episode's prompt come from the shared prefix (0: none)."""
        if self._first_prompt is None:
            self._first_prompt = prompt
        elif self._prefix_cache is None and self._first_prompt:
            shared = shared_prefix_length(self._first_prompt, prompt)
            self._first_prompt = []  # decided once
            if shared >= MIN_SHARED_PREFIX:
                self._prefix = prompt[:shared]
                self._prefix_cache = self.sampler.prompt_prefix(self.weights, self._prefix)
        size = len(self._prefix)
        if size and len(prompt) > size and prompt[:size] == self._prefix:
            return size
        return 0

    def submit(self, requests: Mapping[int, TurnRequest]) -> PendingReplies:
        groups = {slot // self.rows for slot in requests}
        if len(groups) != 1:
            raise ValueError(f"one submit serves one group of slots; got slots of groups {sorted(groups)}")
        group = groups.pop()
        chunks: list[list[int] | None] = [None] * self.rows
        starts = np.zeros(self.rows, np.int32)
        turns = np.zeros((self.rows, 3), np.uint32)  # per row: task id hash, sample, turn
        out_of_room = []
        copy_rows = [False] * self.rows  # rows whose new episode starts from the shared prefix
        for slot, request in requests.items():
            chunk = self._prepare(slot, request)
            if chunk is None:
                out_of_room.append(slot)
                continue
            row = slot % self.rows
            chunks[row], starts[row] = chunk, self._slots[slot].cached
            # a fresh context (no reply yet) holds cached tokens only when they are the shared prefix
            copy_rows[row] = starts[row] > 0 and not self._slots[slot].reply_spans
            turns[row] = (zlib.crc32(request.task_id.encode()), request.sample, len(request.messages))
        active = [chunk is not None for chunk in chunks]
        if not any(active):
            return PendingReplies(lambda: dict.fromkeys(out_of_room))
        cache = self._caches[group]
        if any(copy_rows):
            cache = self.sampler.copy_prefix(cache, self._prefix_cache, copy_rows)
        window = self.sampler.window_for(
            max(starts[r] + len(c) for r, c in enumerate(chunks) if c is not None)
        )
        logits, cache = self.sampler.prefill(self.weights, cache, chunks, starts, window)
        keys = _turn_keys(self._key, turns)
        result, self._caches[group] = self.sampler.decode(self.weights, cache, logits, active, keys, window)
        slots = [slot for slot in requests if slot not in out_of_room]

        def finish() -> dict[int, str | None]:
            tokens = np.asarray(result.tokens_BxN)
            counts = np.asarray(result.counts_B)
            reasons = np.asarray(result.reasons_B)
            logprobs = np.asarray(result.logprobs_BxN)
            replies = dict.fromkeys(out_of_room)
            for slot in slots:
                row = slot % self.rows
                generated = tokens[row, : counts[row]].tolist()
                self.generated_tokens += len(generated)
                replies[slot] = self._accept(
                    slot,
                    generated,
                    logprobs[row, : counts[row]].tolist(),
                    int(reasons[row]),
                    len(chunks[row]),
                )
            return replies

        return PendingReplies(finish)

    def _accept(
        self, slot: int, generated: list[int], logprobs: list[float], reason: int, chunk_len: int
    ) -> str:
        """Turns a row's generated tokens into the reply text and updates the slot's context and cache.

        The tokens kept in the context are always a prefix of the generated ones, so their log-probs are
        the sampler's first ones."""
        context = self._slots[slot]
        device_len = context.cached + chunk_len + len(generated) - 1  # the last token was never fed
        closed = reason == STOP_TOKEN
        content = generated[:-1] if closed else generated
        if reason == STOP_SEQUENCE:
            matched = next(s for s in self.sampler.stops.stop_sequences if tuple(generated[-len(s) :]) == s)
            content = generated[: -len(matched)]
        text = self.codec.decode(content)
        cut = min((i for i in (text.find(s) for s in self.stop_strings) if i >= 0), default=-1)
        if cut >= 0:
            text, closed = text[:cut], False
            while content and not text.startswith(self.codec.decode(content)):
                content = content[:-1]
            text = self.codec.decode(content)
        kept = content + ([generated[-1]] if closed else [])
        context.reply_spans.append((len(context.tokens), len(context.tokens) + len(kept)))
        context.reply_logprobs += logprobs[: len(kept)]
        context.tokens += kept
        context.cached = min(device_len, len(context.tokens))
        context.reply_closed = closed
        return text
