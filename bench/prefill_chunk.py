"""Prefill of a chunk into the KV cache, A/B: attention over the whole batch at once against row by row
(`layers.attend_cached_rows`, what `Decoder` uses on the CPU for chunks of 32+ tokens).

    python bench/prefill_chunk.py [--rounds 4]

The quickstart's policy shape (2 layers, hidden 128, 4 heads of 32, 2 KV heads, token shift 4), 8 rows: one
row starts an episode (a chunk of T tokens at slot 0), seven continue after 400 cached tokens with 30
new ones, as in a rollout turn; cache windows of 512, 1,024 and 1,280 slots. Both variants are compiled
first and then timed alternately; the minimum and median over rounds are printed, in milliseconds.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import coevo_jax.models.decoder as decoder
    from coevo_jax.models.config import ModelConfig
    from coevo_jax.sampling import Sampler, SamplingConfig

    cfg = ModelConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=384,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        token_shift=4,
        dtype=jnp.float32,
    )
    model = decoder.Decoder(cfg, rngs=nnx.Rngs(0))
    windows, lengths = (1280, 1024, 512), (200, 60, 30)
    rng = np.random.RandomState(0)
    cases = {
        (w, t): [rng.randint(3, 1024, size=t).tolist()] + [rng.randint(3, 1024, size=30).tolist()] * 7
        for w in windows
        for t in lengths
    }
    starts = [0] + [400] * 7
    by_rows = decoder.attend_cached_rows
    variants = {}
    for name in ("whole batch", "row by row"):
        # the programs are traced now, under this variant's attention; later calls reuse them
        decoder.attend_cached_rows = (
            by_rows if name == "row by row" else lambda q, k, v, layer, m, r: by_rows(q, k, v, layer, m, 1)
        )
        sampler, params = Sampler.for_model(
            model,
            batch_size=8,
            cache_len=1280,
            sampling=SamplingConfig(max_new_tokens=48),
            window_buckets=windows,
        )
        for (w, _), chunks in cases.items():
            sampler.prefill(params, sampler.init_cache(), chunks, starts, w)
        variants[name] = sampler, params
    decoder.attend_cached_rows = by_rows
    times = {}
    for _ in range(args.rounds):
        for (w, t), chunks in cases.items():
            for name, (sampler, params) in variants.items():
                cache = jax.block_until_ready(sampler.init_cache())
                start = time.perf_counter()
                jax.block_until_ready(sampler.prefill(params, cache, chunks, starts, w)[0])
                times.setdefault((w, t), {}).setdefault(name, []).append(1000 * (time.perf_counter() - start))
    print(f"{'window':>6} {'chunk':>5} " + " ".join(f"{n + ' min/median ms':>28}" for n in variants))
    for (w, t), by_name in times.items():
        cells = [f"{min(v):12.1f} {float(np.median(v)):15.1f}" for v in by_name.values()]
        print(f"{w:>6} {t:>5} " + " ".join(cells))


if __name__ == "__main__":
    main()
