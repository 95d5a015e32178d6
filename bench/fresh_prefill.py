"""A first prefill chunk (every row starting at slot 0), A/B: attending the cache window slot by slot against
attending only itself on the causal block path (`Decoder.hidden_states_cached(fresh=True)`).

`Sampler` picks the causal block path for such chunks unless the CPU kernel `prefix_attention` serves the
cache (float32 on the CPU), where the first variant is the kernel's. The block variant is traced with the
kernels off (`COEVO_JAX_CPU_KERNELS=0`), or the sampler would send it through the kernel too.

    python bench/fresh_prefill.py [--layers 4] [--rows 4] [--rounds 3]

SmolLM2-135M's layer shape (hidden 576, 9 query and 3 KV heads of 64, MLP 1,536, vocab 49,152) with
`--layers` of its 30 layers and random weights, float32. Each case is `--rows` prompts of T tokens at slot 0
(left-padded to the chunk bucket), in the cache window a rollout turn would use (T plus 96 new tokens, rounded
up to a power of two). Both programs are compiled first and then timed alternately; minimum and median over
rounds, in milliseconds, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--lengths", default="256,1024,2000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from coevo_jax.models.config import ModelConfig
    from coevo_jax.models.decoder import Decoder
    from coevo_jax.sampling import Sampler, SamplingConfig, left_pad

    cfg = ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=args.layers,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        tie_word_embeddings=True,
        dtype=jnp.float32,
    )
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    sampler, params = Sampler.for_model(
        model, batch_size=args.rows, cache_len=4096, sampling=SamplingConfig(max_new_tokens=96)
    )
    rng = np.random.RandomState(0)
    cases = {}
    for length in (int(x) for x in args.lengths.split(",")):
        chunks = [rng.randint(3, cfg.vocab_size, size=length - 3 * row).tolist() for row in range(args.rows)]
        ids, mask = left_pad(chunks, sampler.buckets)
        cases[length] = (jnp.asarray(ids), jnp.asarray(mask), sampler.window_for(length))
    starts = jnp.zeros((args.rows,), jnp.int32)

    def run(length: int, fresh: bool):
        ids, mask, window = cases[length]
        cache = jax.block_until_ready(sampler.init_cache())
        begin = time.perf_counter()
        logits, _ = sampler._prefill(params, cache, ids, mask, starts, window=window, fresh=fresh)
        jax.block_until_ready(logits)
        return 1000 * (time.perf_counter() - begin)

    variants = {"whole window": False, "causal blocks": True}
    for length in cases:
        for fresh in variants.values():
            kernels = os.environ.get("COEVO_JAX_CPU_KERNELS")
            if fresh:  # traced (here, on its first call) without the kernel override of `fresh`
                os.environ["COEVO_JAX_CPU_KERNELS"] = "0"
            try:
                run(length, fresh)  # compile
            finally:
                if kernels is None:
                    os.environ.pop("COEVO_JAX_CPU_KERNELS", None)
                else:
                    os.environ["COEVO_JAX_CPU_KERNELS"] = kernels
    times = {}
    for _ in range(args.rounds):
        for length in cases:
            for name, fresh in variants.items():
                times.setdefault(length, {}).setdefault(name, []).append(run(length, fresh))
    print(f"{args.layers} layers, {args.rows} rows, float32; ms, min / median of {args.rounds}")
    print(f"{'chunk':>6} {'window':>6} " + " ".join(f"{n:>24}" for n in variants) + f" {'ratio':>6}")
    for length, by_name in times.items():
        medians = [float(np.median(v)) for v in by_name.values()]
        cells = [f"{min(v):11.1f} / {m:10.1f}" for v, m in zip(by_name.values(), medians, strict=True)]
        window = cases[length][2]
        print(f"{length:>6} {window:>6} " + " ".join(cells) + f" {medians[0] / medians[1]:6.2f}")


if __name__ == "__main__":
    main()
