"""Decode throughput of transformers' `generate` on the anchor model (issue 8), for comparison with our sampler.

    bench/.venvs/trl/bin/python bench/peers/hf_generate.py                       # float32, bfloat16; batch 1/8/32
    bench/.venvs/trl/bin/python bench/peers/hf_generate.py --batches 1 --dtypes float32 --runs 1

Random-init `LlamaForCausalLM` of the anchor shape (see torch_llama.py), its weights cast to the dtype;
prompts `common.decode_prompts(batch)` (256 ids, no padding), greedy (`do_sample=False`), exactly 128 new
tokens (`min_new_tokens=max_new_tokens=128`), default dynamic KV cache, no compilation.

Per (dtype, batch): one untimed warm-up call, then `--runs` timed calls of `model.generate` (median/min/max).
new_tokens_per_s = batch * 128 / median: prefill included, as a caller sees it.
decode_only_new_tokens_per_s = batch * 127 / (median with 128 new tokens - median with 1 new token): the
127 tokens after the first, without the prefill (the 1-token calls get their own warm-up and runs).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import transformers
from torch_llama import build_model, common, setup_device, synchronize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def generate_seconds(model, prompts: torch.Tensor, new_tokens: int, device: torch.device) -> float:
    """Wall time of one greedy `generate` call producing exactly `new_tokens` per row."""
    synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
        )
    synchronize(device)
    seconds = time.perf_counter() - start
    assert out.shape == (prompts.shape[0], prompts.shape[1] + new_tokens), out.shape
    return seconds


def timed(model, prompts, new_tokens, runs, device) -> dict:
    """One warm-up call, then `runs` timed ones."""
    generate_seconds(model, prompts, new_tokens, device)
    return common.summarize([generate_seconds(model, prompts, new_tokens, device) for _ in range(runs)])


def measure(model, dtype: str, batch: int, args, device) -> dict:
    new = common.DECODE["new_tokens"]
    prompts = torch.from_numpy(common.decode_prompts(batch)).long().to(device)
    run = timed(model, prompts, new, args.runs, device)
    first = None if args.no_decode_only else timed(model, prompts, 1, args.runs, device)
    return common.decode_result(dtype, batch, run, first)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default=",".join(map(str, common.DECODE["batch_sizes"])), help="e.g. 1,8,32")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    p.add_argument("--runs", type=int, default=3, help="timed calls per point (after one warm-up)")
    p.add_argument("--no-decode-only", action="store_true", help="skip the 1-new-token calls")
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="attn_implementation")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--out", default=None, help="results folder (default bench/results)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    device = setup_device(args.device)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    batches = [int(b) for b in args.batches.split(",") if b]
    results = []
    common.print_decode_header()
    for dtype in [d for d in args.dtypes.split(",") if d]:
        model = build_model(args.attn, device, DTYPES[dtype]).eval()
        for batch in batches:
            results.append(measure(model, dtype, batch, args, device))
            common.print_decode_row(results[-1])
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    print(
        f"\ntransformers generate, {device.type}, {torch.get_num_threads()} threads, attn {args.attn}, {versions}"
    )
    common.print_decode_header()
    for r in results:
        common.print_decode_row(r)
    payload = {
        "framework": "transformers",
        "versions": versions,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "results": results,
    }
    print("wrote", common.write_result("decode_transformers", payload, out_dir=args.out))


if __name__ == "__main__":
    main()
