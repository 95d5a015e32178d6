"""Shared helper for the rollout tests that play real episodes with SmolLM2-135M-Instruct (GGUF)."""

from __future__ import annotations

from coevo_jax.checkpoint_formats import load_pretrained
from coevo_jax.data.chat_format import chat_format_for
from coevo_jax.rollout import ModelActor, TurnCodec
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig


def smollm2_actor(gguf_path: str, *, cache_len: int, max_new_tokens: int, batch_size: int = 2):
    """A greedy KV-cache actor of SmolLM2 stopping at <|im_end|> and "Observation:"; (actor, sampler, codec)."""
    model, tokenizer = load_pretrained(gguf_path)
    codec = TurnCodec(tokenizer, chat_format_for(tokenizer))
    sampler, params = Sampler.for_model(
        model,
        batch_size=batch_size,
        cache_len=cache_len,
        sampling=SamplingConfig(max_new_tokens=max_new_tokens),
        stops=StopConfig(stop_ids=codec.end_of_turn_ids),
    )
    actor = ModelActor(
        sampler, params, codec, stop_strings=("Observation:",), model_name="SmolLM2-135M-Instruct"
    )
    return actor, sampler, codec
