"""Greedy text generation from a checkpoint with the KV cache: `python -m coevo_jax.generate --prompt ...`.

A small end-to-end check that a real model loads and decodes (the README's first command until the main job
exists). Prompts are left-padded to a power-of-two bucket so the prefill compiles once per bucket, and the
one-token decode step compiles once; both are jitted pure functions of the split NNX state.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from coevo_jax.models import Decoder, init_cache, load_pretrained
from coevo_jax.models.bundled import smollm2_gguf_path


def bucket_length(length: int, minimum: int = 16) -> int:
    """Smallest power of two >= length (and >= minimum)."""
    return max(minimum, 1 << (max(length, 1) - 1).bit_length())


def greedy_generate(
    model: Decoder, prompt_ids: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] = ()
) -> list[int]:
    """Greedy continuation of one prompt, stopping after a token in `stop_ids` or `max_new_tokens`."""
    graphdef, state = nnx.split(model)
    padded_len = bucket_length(len(prompt_ids))
    input_ids = np.zeros((1, padded_len), np.int32)
    mask = np.zeros((1, padded_len), np.int32)
    input_ids[0, padded_len - len(prompt_ids) :] = prompt_ids  # left padding: last column is real
    mask[0, padded_len - len(prompt_ids) :] = 1
    cache = init_cache(model.config, batch=1, max_len=padded_len + max_new_tokens)

    @jax.jit
    def step(state, ids_BxT, mask_BxT, cache):
        logits_BxTxV, cache = nnx.merge(graphdef, state).forward_cached(ids_BxT, cache, mask_BxT)
        return jnp.argmax(logits_BxTxV[:, -1], axis=-1).astype(jnp.int32), cache

    token, cache = step(state, jnp.asarray(input_ids), jnp.asarray(mask), cache)
    generated = []
    one = jnp.ones((1, 1), jnp.int32)
    for _ in range(max_new_tokens):
        token_id = int(token[0])
        generated.append(token_id)
        if token_id in stop_ids:
            break
        token, cache = step(state, token[:, None], one, cache)
    return generated


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
