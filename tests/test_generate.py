"""The demo generator: cached greedy decoding equals argmax of the full forward at every step."""

import jax.numpy as jnp
import numpy as np
from model_fixtures import KITCHEN_SINK, random_decoder

from coevo_jax.generate import bucket_length, greedy_generate


def test_bucket_length_is_a_power_of_two_at_least_the_length():
    assert [bucket_length(n) for n in (1, 16, 17, 100, 128, 129)] == [16, 16, 32, 128, 128, 256]


def test_cached_greedy_generation_matches_full_forward_argmax():
    model = random_decoder(KITCHEN_SINK, seed=3)
    prompt = list(np.random.RandomState(7).randint(1, KITCHEN_SINK.vocab_size, size=11))
    generated = greedy_generate(model, prompt, max_new_tokens=6)
    # One causal forward over prompt + generated: each generated token must be the argmax at the position
    # before it (the decoder's own causality test makes this equal to step-by-step re-encoding).
    logits = model(jnp.asarray([prompt + generated], jnp.int32))
    expected = np.asarray(jnp.argmax(logits[0, len(prompt) - 1 : -1], axis=-1)).tolist()
    assert generated == expected


def test_generation_stops_at_a_stop_token():
    model = random_decoder(KITCHEN_SINK, seed=3)
    prompt = [5, 6, 7]
    free_run = greedy_generate(model, prompt, max_new_tokens=5)
    stopped = greedy_generate(model, prompt, max_new_tokens=5, stop_ids=(free_run[1],))
    assert stopped == free_run[: free_run.index(free_run[1]) + 1]
