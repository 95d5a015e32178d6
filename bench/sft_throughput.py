"""SFT step throughput of the quickstart's policy: tokens/s and useful FLOP/s against XLA's matmul ceiling.

    python bench/sft_throughput.py                      # every variant, prints a table, writes JSON
    python bench/sft_throughput.py --variants unrolled --lengths 512 --steps 6

The policy is the quickstart's (2 layers, hidden 128, 4 query / 2 key-value heads of 32, SwiGLU 384, a
4-token shift, vocabulary 1,024, float32) and a batch is its SFT batch: 8 rows padded to one length
bucket, each row a random length in [0.55, 1] of the bucket with about 29 % action tokens in spans (the
share in the built-in experts). Variants:
- `scan`: the layer scan as `lax.scan` (the default for models in general);
- `unrolled`: the scan unrolled (`model.unroll_layers`, the quickstart's setting);
- `*_pair`: two policies' steps dispatched from two threads at once, as both agents' SFT phases run
  (`experiment.agent_pairs`); its tokens/s count both agents' tokens.
Timings: `--warmup` untimed steps (the first compiles), then `--steps` steps blocked at the end. Useful
FLOPs (`flops.py`: 3x the forward, causal attention) count the rows' real tokens only, so padding shows
as a lower share of the matmul ceiling, which is measured in the same process (`ceiling.py`).
"""

from __future__ import annotations

import argparse
import threading
import time

import ceiling
import common
import flops
import numpy as np

QUICKSTART_MODEL = dict(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=384,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    token_shift=4,
)
ROWS = 8
ACTION_SHARE = 0.29
VARIANTS = ("scan", "unrolled", "scan_pair", "unrolled_pair")


def sft_batches(length: int, count: int, seed: int) -> list[dict]:
    """`count` SFT batches of `ROWS` rows padded to `length` (`data.batching.collate_sft`'s layout)."""
    from coevo_jax.data.batching import collate_sft
    from coevo_jax.data.chat_format import TokenizedTrajectory

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        rows = []
        for _ in range(ROWS):
            n = int(rng.integers(int(0.55 * length), length + 1))
            ids = rng.integers(common.FIRST_TOKEN_ID, QUICKSTART_MODEL["vocab_size"], n)
            mask = np.zeros(n, bool)
            for start in rng.choice(n - 16, size=max(1, int(ACTION_SHARE * n / 16)), replace=False):
                mask[start + 1 : start + 17] = True  # never the first token (it has no prediction)
            rows.append(TokenizedTrajectory(ids, mask))
        out.append(collate_sft(rows, length=length, batch_size=ROWS, pad_id=common.PAD_ID))
    return out


def useful_flops(batch: dict) -> float:
    """3x the forward FLOPs of the batch's real tokens, row by row."""
    lengths = np.asarray(batch["attention_mask"]).sum(axis=1)
    return sum(3 * flops.forward_flops(QUICKSTART_MODEL, int(n)) for n in lengths)


def bench_variant(variant: str, length: int, warmup: int, timed: int) -> dict:
    """Steady-state tokens/s and useful GFLOP/s of one variant at one bucket length."""
    import jax

    from coevo_jax import sharding
    from coevo_jax.models import ModelConfig
    from coevo_jax.train import StepKind
    from coevo_jax.train.state import init_train_state

    unrolled, pair = variant.startswith("unrolled"), variant.endswith("_pair")
    cfg = ModelConfig(**QUICKSTART_MODEL, dtype="float32", unroll_layers=unrolled)
    steps, scalars, tx, shardings, mesh, rules = common.build_dpo_steps(cfg, 6e-3, 0.0)
    step = steps.step(StepKind.SFT)
    agents = 2 if pair else 1
    states = [init_train_state(cfg, tx, shardings, jax.random.key(a)) for a in range(agents)]
    host = sft_batches(length, warmup + timed, seed=length)
    placed = [sharding.place_batch(sharding.device_layout(b), mesh, rules) for b in host]

    def walk(agent: int, batches: list) -> None:
        for batch in batches:
            states[agent], metrics = step(states[agent], batch, scalars)
        jax.block_until_ready(metrics)

    def run(batches: list) -> float:
        start = time.perf_counter()
        threads = [threading.Thread(target=walk, args=(a, batches)) for a in range(agents)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - start

    compile_s = run(placed[:1])
    run(placed[1:warmup])
    seconds = run(placed[warmup:])
    real = agents * sum(float(np.asarray(b["attention_mask"]).sum()) for b in host[warmup:])
    useful = agents * sum(useful_flops(b) for b in host[warmup:])
    return {
        "variant": variant,
        "length": length,
        "agents": agents,
        "first_call_s": compile_s,
        "ms_per_step": 1e3 * seconds / (timed * agents),
        "real_tokens_per_s": real / seconds,
        "slot_tokens_per_s": agents * timed * ROWS * length / seconds,
        "useful_gflops": useful / seconds / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 768])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    args = parser.parse_args()

    ceiling_gflops = ceiling.matmul_gflops("float32")
    print(f"XLA float32 matmul ceiling: {ceiling_gflops:.0f} GFLOP/s")
    print(
        f"{'variant':<14} {'length':>6} {'ms/step':>8} {'real tok/s':>10} {'GFLOP/s':>8} {'of ceiling':>10}"
    )
    rows = []
    for length in args.lengths:
        for variant in args.variants:
            row = bench_variant(variant, length, args.warmup, args.steps)
            row["of_ceiling"] = row["useful_gflops"] / ceiling_gflops
            rows.append(row)
            print(
                f"{variant:<14} {length:>6} {row['ms_per_step']:>8.1f} {row['real_tokens_per_s']:>10,.0f} "
                f"{row['useful_gflops']:>8.1f} {row['of_ceiling']:>10.1%}"
            )
    path = common.write_result("sft_throughput", {"ceiling_gflops": ceiling_gflops, "rows": rows}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
