"""Decode throughput of tunix's `Sampler` on the anchor model (issue 8), for comparison with our sampler.

    bench/.venvs/tunix/bin/python bench/peers/tunix_sample.py                    # float32; batch 1/8/32
    bench/.venvs/tunix/bin/python bench/peers/tunix_sample.py --batches 1 --runs 1

`tunix.generate.sampler.Sampler` on tunix's Llama3 at the anchor shape (see tunix_llama.py), KV cache of
384 = 256 + 128 positions; prompts `common.decode_prompts(batch)` (256 ids, no padding), greedy (tunix's
default with no top_p), 128 new tokens. The Sampler takes strings and a tokenizer; here the "strings"
are the id rows and `IdTokenizer.encode` returns them unchanged (no BOS added), so no text is involved.
EOS is an id outside the vocabulary, so no row stops early; every row is checked to get 128 tokens.

Per (dtype, batch): one untimed warm-up call (it compiles prefill and decode for that batch), then
`--runs` timed calls (median/min/max), each from the id rows to the returned tokens on the host.
new_tokens_per_s = batch * 128 / median (prefill included).
decode_only_new_tokens_per_s = batch * 127 / (median with 128 new tokens - median with 1 new token).
"""

from __future__ import annotations

import argparse
import os
import time
from importlib.metadata import version

import jax
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix_llama import build_model, check_device, common

NO_EOS = common.MODEL["vocab_size"]  # never produced: the vocabulary is [0, vocab)


class IdTokenizer:
    """The tokenizer interface tunix's Sampler needs, over ids: `encode` passes an id row through."""

    def encode(self, ids, **kwargs) -> list[int]:
        return [int(i) for i in ids]

    def decode(self, ids, **kwargs) -> str:
        return ""  # the text is never looked at

    def bos_id(self):
        return None  # falsy: the Sampler prepends nothing

    def eos_id(self) -> int:
        return common.EOS_ID

    def pad_id(self) -> int:
        return common.PAD_ID


def make_sampler(dtype: str) -> sampler_lib.Sampler:
    m = common.MODEL
    cache = sampler_lib.CacheConfig(
        cache_size=common.DECODE["prompt_length"] + common.DECODE["new_tokens"],
        num_layers=m["num_layers"],
        num_kv_heads=m["num_kv_heads"],
        head_dim=m["head_dim"],
    )
    return sampler_lib.Sampler(build_model(dtype), IdTokenizer(), cache)


def sample_seconds(sampler, rows: list[np.ndarray], new_tokens: int) -> float:
    """Wall time of one greedy Sampler call producing exactly `new_tokens` per row."""
    start = time.perf_counter()
    out = sampler(
        rows,
        max_generation_steps=new_tokens,
        max_prompt_length=common.DECODE["prompt_length"],
        eos_tokens=[NO_EOS],
    )
    seconds = time.perf_counter() - start
    lengths = {len(t) for t in out.tokens}
    assert lengths == {new_tokens}, f"generated lengths {lengths}, wanted {new_tokens}"
    return seconds


def timed(sampler, rows, new_tokens, runs) -> dict:
    """One warm-up (compiling) call, then `runs` timed ones."""
    sample_seconds(sampler, rows, new_tokens)
    return common.summarize([sample_seconds(sampler, rows, new_tokens) for _ in range(runs)])


def measure(sampler, dtype: str, batch: int, args) -> dict:
    new = common.DECODE["new_tokens"]
    rows = list(common.decode_prompts(batch))
    run = timed(sampler, rows, new, args.runs)
    first = None if args.no_decode_only else timed(sampler, rows, 1, args.runs)
    return common.decode_result(dtype, batch, run, first)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default=",".join(map(str, common.DECODE["batch_sizes"])), help="e.g. 1,8,32")
    p.add_argument("--dtypes", default="float32", help="comma-separated: float32, bfloat16 (parameters cast)")
    p.add_argument("--runs", type=int, default=3, help="timed calls per point (after one warm-up)")
    p.add_argument("--no-decode-only", action="store_true", help="skip the 1-new-token calls")
    p.add_argument("--device", default="cpu", help="cpu or cuda (JAX's default backend must match)")
    p.add_argument("--out", default=None, help="results folder (default bench/results)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    check_device(args.device)
    batches = [int(b) for b in args.batches.split(",") if b]
    results = []
    common.print_decode_header()
    for dtype in [d for d in args.dtypes.split(",") if d]:
        sampler = make_sampler(dtype)
        for batch in batches:
            results.append(measure(sampler, dtype, batch, args))
            common.print_decode_row(results[-1])
    versions = {name: version(name) for name in ("google-tunix", "jax", "jaxlib", "flax")}
    device = str(jax.devices()[0])
    print(f"\ntunix Sampler, {device}, {versions}")
    common.print_decode_header()
    for r in results:
        common.print_decode_row(r)
    payload = {
        "framework": "tunix",
        "versions": versions,
        "device": device,
        "threads": os.cpu_count() if jax.default_backend() == "cpu" else 0,  # XLA:CPU uses every core
        "results": results,
    }
    print("wrote", common.write_result("decode_tunix", payload, out_dir=args.out))


if __name__ == "__main__":
    main()
