"""Greedy text generation from a checkpoint with the KV cache: `python -m coevo_jax.generate --prompt ...`.

A small end-to-end check that a real model loads and decodes (the README's first command until the main job
exists), through the batched sampler (`coevo_jax.sampling`) with one row; the cache length is the prompt's
power-of-two bucket plus the new tokens, so prompts of similar length share compiled programs.
"""

from __future__ import annotations

import time

import jax
from absl import app, flags

from coevo_jax.checkpoint_formats import load_pretrained
from coevo_jax.checkpoint_formats.bundled import smollm2_gguf_path
from coevo_jax.models import Decoder
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig


def bucket_length(length: int, minimum: int = 16) -> int:
    """Smallest power of two >= length (and >= minimum)."""
    return max(minimum, 1 << (max(length, 1) - 1).bit_length())


def greedy_generate(
    model: Decoder, prompt_ids: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] = ()
) -> list[int]:
    """Greedy continuation of one prompt, stopping after a token in `stop_ids` or `max_new_tokens`."""
    sampler, params = Sampler.for_model(
        model,
        batch_size=1,
        cache_len=bucket_length(len(prompt_ids)) + max_new_tokens,
        sampling=SamplingConfig(max_new_tokens=max_new_tokens),
        stops=StopConfig(stop_ids=stop_ids),
    )
    return sampler.generate(params, [list(prompt_ids)], jax.random.key(0))[0]


FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "HF checkpoint directory or .gguf file (default: the bundled SmolLM2).")
flags.DEFINE_string("prompt", "The capital of France is", "Text to continue.")
flags.DEFINE_integer("max_new_tokens", 24, "Tokens to generate.")
flags.DEFINE_bool("chat", False, "Wrap the prompt in the tokenizer's chat template as a user turn.")


def main(argv):
    del argv
    path = FLAGS.model or smollm2_gguf_path()
    start = time.perf_counter()
    model, tokenizer = load_pretrained(path)
    if tokenizer is None:
        raise ValueError(f"{path}: carries no tokenizer; generation needs one")
    print(f"loaded {path} in {time.perf_counter() - start:.1f}s on {jax.devices()[0].platform}")
    if FLAGS.chat:
        messages = [{"role": "user", "content": FLAGS.prompt}]
        prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt_ids = list(getattr(prompt_ids, "input_ids", prompt_ids))
    else:
        prompt_ids = tokenizer.encode(FLAGS.prompt, add_special_tokens=False)
    stop_ids = tuple(i for i in (tokenizer.eos_token_id,) if i is not None)
    start = time.perf_counter()
    new_ids = greedy_generate(model, prompt_ids, FLAGS.max_new_tokens, stop_ids)
    seconds = time.perf_counter() - start
    separator = "\n" if FLAGS.chat else ""
    print(FLAGS.prompt + separator + tokenizer.decode(new_ids, skip_special_tokens=True))
    print(f"{len(new_ids)} new tokens in {seconds:.2f}s (including compilation)")


if __name__ == "__main__":
    app.run(main)
