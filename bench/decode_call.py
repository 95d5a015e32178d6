"""A decode call's fixed cost beside its per-token step, A/B-able across checkouts: calls of 2 and 18 new tokens.

    python bench/decode_call.py                                   # SmolLM2's shape: 16 rows, 512 slots
    python bench/decode_call.py --model anchor --rows 8 --window 384

Random-init model, float32, `--rows` prompts of `--live` random tokens prefilled into a cache of `--window`
slots, then one greedy decode call of 2 and one of 18 new tokens (no stop token), each timed from dispatch
until its tokens are on the host (median of `--repeats`, after one warm-up each). The 16 extra tokens'
time over 16 is the step; the 2-token call less one step is what every call pays once (its set-up before
the first step: the state, the cache window, the weights as the loop reads them). A rollout turn pays it
once per turn, so it weighs most on short turns.
"""

from __future__ import annotations

import argparse
import time

import anchor
import numpy as np
from shapes import DECODE_MODELS, decode_model_config

SHORT, LONG = 2, 18


def call_seconds(model_name: str, rows: int, window: int, live: int, new: int, repeats: int) -> float:
    import jax
    from flax import nnx

    from coevo_jax.models import Decoder
    from coevo_jax.sampling import Sampler, SamplingConfig

    cfg = decode_model_config(model_name)
    sampler, params = Sampler.for_model(
        Decoder(cfg, rngs=nnx.Rngs(0)),
        batch_size=rows,
        cache_len=window,
        sampling=SamplingConfig(max_new_tokens=new),
        window_buckets=(window,),
    )
    prompts = np.random.default_rng(0).integers(anchor.FIRST_TOKEN_ID, cfg.vocab_size, (rows, live)).tolist()

    def once() -> float:
        logits, cache = sampler.prefill(params, sampler.init_cache(), prompts, [0] * rows)
        jax.block_until_ready(logits)
        start = time.perf_counter()
        result, _ = sampler.decode(params, cache, logits, [True] * rows, jax.random.key(0))
        np.asarray(result.tokens_BxN)
        return time.perf_counter() - start

    once()  # compile
    return float(np.median([once() for _ in range(repeats)]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=DECODE_MODELS, default="smollm2")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--window", type=int, default=512, help="cache slots (the decode's window)")
    parser.add_argument("--live", type=int, default=256, help="prompt tokens per row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    args = parser.parse_args()
    if args.live + LONG > args.window:
        parser.error(f"--live {args.live} + {LONG} new tokens exceed --window {args.window}")
    short, long = (
        call_seconds(args.model, args.rows, args.window, args.live, new, args.repeats)
        for new in (SHORT, LONG)
    )
    step = (long - short) / (LONG - SHORT)
    row = {
        "model": args.model,
        "rows": args.rows,
        "window": args.window,
        "live": args.live,
        "call_ms": {str(SHORT): short * 1e3, str(LONG): long * 1e3},
        "step_ms": step * 1e3,
        "fixed_ms": (short - step) * 1e3,
    }
    print(
        f"{args.model}, {args.rows} rows, {args.live} live of {args.window} slots: a call of {SHORT} tokens "
        f"{short * 1e3:.1f} ms, of {LONG} {long * 1e3:.1f} ms; step {row['step_ms']:.2f} ms, "
        f"fixed {row['fixed_ms']:.1f} ms a call"
    )
    anchor.write_result("decode_call", {"results": [row]}, args.out)


if __name__ == "__main__":
    main()
