"""Where a DPO step's time goes: the XLA ops of the anchor step ranked by time, with what they compute.

    python bench/profile_dpo_step.py                  # float32, 2 profiled steps, top 25 ops
    python bench/profile_dpo_step.py --dtype bfloat16 --top 40

Runs the anchor DPO step (`bench/dpo_throughput.py`'s set-up) under `jax.profiler`, sums each XLA op's
time over the profiled steps from the Perfetto trace, and names it by the JAX operation it came from
(`op_name` metadata of the compiled HLO). Profiling slows the step; read the shares, not the totals.
"""

from __future__ import annotations

import argparse

import dpo_throughput
import numpy as np
import op_profile


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    import jax

    steps, scalars, state, mesh, rules = dpo_throughput._setup(args.dtype)
    pairs = dpo_throughput._pairs()
    first = list(range(8))
    chosen, rejected = jax.device_get(
        steps.reference(state.params, dpo_throughput._collate(pairs, first, mesh, rules))
    )
    batch = dpo_throughput._collate(pairs, first, mesh, rules, (np.ravel(chosen), np.ravel(rejected)))
    compiled = steps.dpo.lower(state, batch, scalars).compile()
    for _ in range(2):
        state, metrics = steps.dpo(state, batch, scalars)
        jax.block_until_ready(metrics)
    carry = {"state": state}

    def run():
        carry["state"], metrics = steps.dpo(carry["state"], batch, scalars)
        return metrics

    summary = op_profile.profile_ops(run, compiled.as_text(), args.steps)
    op_profile.print_summary(summary, f"{args.dtype} anchor DPO step", args.top)


if __name__ == "__main__":
    main()
