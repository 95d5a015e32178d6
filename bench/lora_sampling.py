"""Sampling a LoRA policy: adapters merged into the base once per policy, or applied at every token.

    python bench/lora_sampling.py                        # SmolLM2-135M shape, r = 16 on all projections
    python bench/lora_sampling.py --batch 8 --prompt 128 --new 64 --repeats 3

A random base with random adapters (B != 0: they change the output), float32, greedy, no stop token. Three
variants of `coevo_jax.sampling.Sampler`: the base alone (no adapters, the floor), `merge_lora=True`
(`Sampler.weights` folds W + alpha / r * A B once, then the base architecture's programs run) and
`merge_lora=False` (each adapted projection adds its two rank-r matmuls at every token). Per variant: one
warm-up run (compiles), then the median of `--repeats` runs of prefill + decode, blocked until the tokens
are on the host; the merge is timed on its own, since it is paid once per policy (per actor), not per run.
The two LoRA variants must produce the same tokens.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from shapes import smollm2_config

from coevo_jax.models import Decoder, partition_trainable
from coevo_jax.sampling import Sampler, SamplingConfig


def _params(cfg, seed: int = 0) -> dict:
    """Random parameters; the adapters' B drawn too (fresh adapters would be B = 0)."""
    init = jax.jit(
        lambda key: nnx.to_pure_dict(nnx.state(Decoder(cfg, rngs=nnx.Rngs(params=key)), nnx.Param))
    )
    params = init(jax.random.key(seed))
    rng = np.random.RandomState(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            jnp.asarray(0.02 * rng.standard_normal(x.shape), x.dtype)
            if jax.tree_util.keystr(path).endswith("_lora']['b']")
            else x
        ),
        params,
    )


def _time_runs(sampler: Sampler, weights: dict, prompts: list, repeats: int) -> tuple[float, np.ndarray]:
    def run():
        start = time.perf_counter()
        logits, cache = sampler.prefill(weights, sampler.init_cache(), prompts, [0] * len(prompts))
        result, _ = sampler.decode(weights, cache, logits, [True] * len(prompts), jax.random.key(0))
        tokens = np.asarray(result.tokens_BxN)
        return time.perf_counter() - start, tokens

    _, tokens = run()  # compile
    return float(np.median([run()[0] for _ in range(repeats)])), tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--layers", type=int, default=None, help="fewer layers than SmolLM2's 30 (a quick check)"
    )
    args = parser.parse_args()
    changes = {} if args.layers is None else {"num_layers": args.layers}
    cfg = smollm2_config(lora_rank=args.rank, lora_alpha=2.0 * args.rank, **changes)
    params = _params(cfg)
    prompts = np.random.RandomState(1).randint(3, cfg.vocab_size, (args.batch, args.prompt)).tolist()
    sampling = SamplingConfig(max_new_tokens=args.new)
    common = dict(batch_size=args.batch, cache_len=args.prompt + args.new, sampling=sampling)

    base = Sampler(cfg.without_lora(), **common)
    base_params = partition_trainable(params, cfg)[1]  # the base's weights, without the adapters
    merged, unmerged = Sampler(cfg, merge_lora=True, **common), Sampler(cfg, merge_lora=False, **common)
    jax.block_until_ready(merged.weights(params))  # compile the merge
    start = time.perf_counter()
    merged_weights = jax.block_until_ready(merged.weights(params))
    merge_seconds = time.perf_counter() - start

    rows = []
    for name, sampler, weights in (
        ("base (no adapters)", base, base_params),
        ("LoRA merged", merged, merged_weights),
        ("LoRA unmerged", unmerged, params),
    ):
        seconds, tokens = _time_runs(sampler, weights, prompts, args.repeats)
        rows.append((name, seconds, tokens))
    same = np.array_equal(rows[1][2], rows[2][2])
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {cfg.num_layers} layers x {cfg.hidden_size}, "
        f"LoRA r={cfg.lora_rank} on {','.join(cfg.lora_targets)}; batch {args.batch}, prompt {args.prompt}, "
        f"{args.new} new tokens, median of {args.repeats}"
    )
    print(f"{'variant':20s} {'s/run':>7} {'new tok/s':>10}")
    for name, seconds, _ in rows:
        print(f"{name:20s} {seconds:7.2f} {args.batch * args.new / seconds:10.1f}")
    print(f"merge (once per policy): {merge_seconds:.3f} s; merged and unmerged tokens identical: {same}")


if __name__ == "__main__":
    main()
