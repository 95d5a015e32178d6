"""Text generation for the LLM path: a chat model loaded with `load_pretrained`, one reply per prompt.

Prompts go through the tokenizer's chat template (a system message when one is given, then the user's), are
cut from the left to `max_prompt_tokens`, and are decoded by the project's sampler (`sampling.Sampler`, one
row, a compiled program per power-of-two cache length) until the end-of-turn token or `max_new_tokens`.
"""

from __future__ import annotations

import jax

from coevo_jax.checkpoint_formats import load_pretrained
from coevo_jax.checkpoint_formats.bundled import smollm2_gguf_path
from coevo_jax.generate import bucket_length
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig


class TextGenerator:
    """`generator(system, user) -> reply` with a loaded chat model (see the module docstring)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_new_tokens: int = 192,
        temperature: float = 0.7,
        max_prompt_tokens: int = 1536,
        seed: int = 0,
    ):
        if tokenizer is None:
            raise ValueError("the LLM path needs a checkpoint with a tokenizer")
        self.model, self.tokenizer = model, tokenizer
        self.sampling = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens)
        self.stops = StopConfig(stop_ids=tuple(i for i in (tokenizer.eos_token_id,) if i is not None))
        self.max_prompt_tokens = max_prompt_tokens
        self.key = jax.random.key(seed)
        self.calls = 0
        self._samplers: dict[int, tuple[Sampler, dict]] = {}

    @classmethod
    def load(cls, path: str = "", **kwargs) -> TextGenerator:
        """From a checkpoint `load_pretrained` reads; "" is the bundled SmolLM2-135M-Instruct."""
        model, tokenizer = load_pretrained(path or smollm2_gguf_path())
        return cls(model, tokenizer, **kwargs)

    def prompt_ids(self, system: str, user: str) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(getattr(ids, "input_ids", ids))[-self.max_prompt_tokens :]

    def __call__(self, system: str, user: str) -> str:
        ids = self.prompt_ids(system, user)
        cache_len = bucket_length(len(ids)) + self.sampling.max_new_tokens
        if cache_len not in self._samplers:
            self._samplers[cache_len] = Sampler.for_model(
                self.model, batch_size=1, cache_len=cache_len, sampling=self.sampling, stops=self.stops
            )
        sampler, params = self._samplers[cache_len]
        self.calls += 1
        tokens = sampler.generate(params, [ids], jax.random.fold_in(self.key, self.calls))[0]
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
