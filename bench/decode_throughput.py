"""Decode throughput of coevo_jax's sampler on issue 8's anchor config: greedy, prompt 256, 128 new tokens.

    python bench/decode_throughput.py                       # batches 1, 8, 32; float32 and bfloat16
    python bench/decode_throughput.py --batches 8 --dtypes float32

Random-init anchor model (`bench/common.py`; the transformers and tunix scripts use the same prompts),
a KV cache of 384 slots (prompt + new tokens), no stop token, so every row generates 128 tokens.
Per batch size: one warm-up run (compiles prefill and decode), then the median of `--repeats` runs of
- end to end: prefill of the prompts + the 128-token decode loop, blocked until tokens are on the host
  (what `generate` costs a caller; new tokens/s = batch * 128 / time);
- decode only: the 128-token loop alone, prefill excluded (127 forward steps: the first new token
  comes from the prefill's logits).
Bounds (`bench/flops.py`, `bench/ceiling.py`): a decode step must read every matmul weight and every
row's whole KV cache, so bytes per step over the measured streaming bandwidth is a floor on its time;
the prefill's useful FLOPs (`flops.prefill_flops`: every prompt token through the layers, the unembedding
for the last one only) over the measured matmul ceiling are a floor on the prefill. Together they cap
the end-to-end new tokens/s any implementation of this model can reach on this machine.
"""

from __future__ import annotations

import argparse
import time

import ceiling
import common
import flops
import numpy as np

NEW = common.DECODE["new_tokens"]
PROMPT = common.DECODE["prompt_length"]


def bounds(dtype_name: str, batch: int, gbps: float, gflops: float) -> dict:
    """Floors on the decode step and the prefill, and the end-to-end new tokens/s they allow."""
    import jax.numpy as jnp

    step_bytes = flops.decode_step_bytes(
        common.MODEL, batch, PROMPT + NEW, bytes_per_value=jnp.dtype(dtype_name).itemsize
    )
    step_floor_s = step_bytes / (gbps * 1e9)
    prefill_floor_s = batch * flops.prefill_flops(common.MODEL, PROMPT) / (gflops * 1e9)
    return {
        "decode_step_bytes": step_bytes,
        "decode_step_floor_ms": step_floor_s * 1e3,
        "prefill_floor_s": prefill_floor_s,
        "max_new_tokens_per_s": batch * NEW / (prefill_floor_s + (NEW - 1) * step_floor_s),
    }


def bench_batch(dtype_name: str, batch: int, repeats: int) -> dict:
    import jax
    from flax import nnx

    from coevo_jax.models import Decoder
    from coevo_jax.sampling import Sampler, SamplingConfig

    cfg = common.anchor_config(dtype_name)
    sampler, params = Sampler.for_model(
        Decoder(cfg, rngs=nnx.Rngs(0)),
        batch_size=batch,
        cache_len=PROMPT + NEW,
        sampling=SamplingConfig(max_new_tokens=NEW),
    )
    prompts = common.decode_prompts(batch).tolist()

    def run(key):
        start = time.perf_counter()
        logits, cache = sampler.prefill(params, sampler.init_cache(), prompts, [0] * batch)
        jax.block_until_ready(logits)
        decode_start = time.perf_counter()
        result, _ = sampler.decode(params, cache, logits, [True] * batch, key)
        tokens = np.asarray(result.tokens_BxN)
        end = time.perf_counter()
        if not np.all(np.asarray(result.counts_B) == NEW):
            raise RuntimeError(f"rows stopped early: {np.asarray(result.counts_B)}")
        return end - start, end - decode_start, tokens

    run(jax.random.key(0))  # compile
    totals, decodes = [], []
    for repeat in range(repeats):
        total, decode, _ = run(jax.random.key(repeat + 1))
        totals.append(total)
        decodes.append(decode)
    total, decode = common.summarize(totals), common.summarize(decodes)
    return {
        "dtype": dtype_name,
        "batch": batch,
        "run": total,
        "decode_only": decode,
        "new_tokens_per_s": batch * NEW / total["median_s"],
        "decode_only_new_tokens_per_s": batch * NEW / decode["median_s"],
        "decode_step_ms": decode["median_s"] / (NEW - 1) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=list(common.DECODE["batch_sizes"]))
    parser.add_argument(
        "--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    args = parser.parse_args()
    import jax

    results = [bench_batch(d, b, args.repeats) for d in args.dtypes for b in args.batches]
    gbps = ceiling.memory_gbps()
    gflops = {d: ceiling.matmul_gflops(d) for d in args.dtypes}
    for r in results:
        r["bounds"] = bounds(r["dtype"], r["batch"], gbps, gflops[r["dtype"]])
    print(f"coevo_jax Sampler, jax {jax.__version__} on {jax.devices()[0].device_kind}")
    print(f"streaming read {gbps:.1f} GB/s; matmul ceiling (GFLOP/s) {gflops}")
    print(
        f"{'dtype':9s} {'batch':>5} {'s/run':>7} {'new tok/s':>10} {'decode-only tok/s':>18}"
        f" {'ms/step':>8} {'floor ms':>9} {'max new tok/s':>14}"
    )
    for r in results:
        b = r["bounds"]
        print(
            f"{r['dtype']:9s} {r['batch']:5d} {r['run']['median_s']:7.2f} {r['new_tokens_per_s']:10.0f}"
            f" {r['decode_only_new_tokens_per_s']:18.0f} {r['decode_step_ms']:8.2f}"
            f" {b['decode_step_floor_ms']:9.2f} {b['max_new_tokens_per_s']:14.0f}"
        )
    common.write_result(
        "decode_coevo_jax",
        {
            "framework": "coevo_jax",
            "versions": {"jax": jax.__version__},
            "device": str(jax.devices()[0].device_kind),
            "memory_gbps": gbps,
            "ceilings_gflops": gflops,
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
