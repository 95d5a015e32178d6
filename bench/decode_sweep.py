"""Decode tokens/s of the sampler alone: greedy, prompt 256, 128 new tokens, over batch and cache size.

    python bench/decode_sweep.py                 # float32 compute
    python bench/decode_sweep.py --dtype bfloat16

Random-init Llama-shaped model (hidden 256, intermediate 688, 4 layers, 8 query / 4 KV heads of 32) at two
vocabulary sizes; the best of two timed runs after one warm-up, prefill excluded.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from shapes import anchor_config

from coevo_jax.models import Decoder
from coevo_jax.sampling import Sampler, SamplingConfig


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    print(f"{'vocab':>6} {'slots':>6} {'batch':>5} {'ms/step':>8} {'tokens/s':>9}")
    for vocab in (620, 8192):
        cfg = anchor_config(dtype, vocab)
        model = Decoder(cfg, rngs=nnx.Rngs(0))
        for cache_len in (512, 2048):
            for batch in (1, 8, 32):
                sampler, params = Sampler.for_model(
                    model, batch_size=batch, cache_len=cache_len, sampling=SamplingConfig(max_new_tokens=128)
                )
                prompts = np.random.RandomState(0).randint(3, vocab, size=(batch, 256)).tolist()
                times = []
                for repeat in range(3):
                    cache = sampler.init_cache()
                    logits, cache = sampler.prefill(params, cache, prompts, [0] * batch)
                    jax.block_until_ready(logits)
                    start = time.perf_counter()
                    result, cache = sampler.decode(
                        params, cache, logits, [True] * batch, jax.random.key(repeat)
                    )
                    jax.block_until_ready(result.tokens_BxN)
                    times.append(time.perf_counter() - start)
                seconds = min(times[1:])
                print(
                    f"{vocab:6d} {cache_len:6d} {batch:5d} {seconds / 128 * 1e3:8.2f} {batch * 128 / seconds:9.0f}"
                )


if __name__ == "__main__":
    main()
