"""Where a DPO step's time goes: the XLA ops of the anchor step ranked by time, with what they compute.

    python bench/profile_dpo_step.py                  # float32, 2 profiled steps, top 25 ops
    python bench/profile_dpo_step.py --dtype bfloat16 --top 40

Runs the anchor DPO step (`bench/dpo_throughput.py`'s set-up) under `jax.profiler`, sums each XLA op's
time over the profiled steps from the Perfetto trace, and names it by the JAX operation it came from
(`op_name` metadata of the compiled HLO). Profiling slows the step; read the shares, not the totals.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile

import dpo_throughput
import numpy as np


def _op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> (shape, JAX op_name) from a compiled module's text."""
    out = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.-]+) = (\S+)", line)
        if match:
            op_name = re.search(r'op_name="([^"]*)"', line)
            out[match.group(1)] = f"{match.group(2)}  {op_name.group(1) if op_name else ''}"
    return out


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
    names = _op_names(steps.dpo.lower(state, batch, scalars).compile().as_text())
    for _ in range(2):
        state, metrics = steps.dpo(state, batch, scalars)
        jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        for _ in range(args.steps):
            state, metrics = steps.dpo(state, batch, scalars)
            jax.block_until_ready(metrics)
        jax.profiler.stop_trace()
        trace = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
        with gzip.open(trace) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    per_op = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and event.get("name") in names:
            per_op[event["name"]] += event["dur"] / 1e3 / args.steps  # ms per step
    total = sum(per_op.values())
    print(f"{args.dtype} anchor DPO step: {total:.0f} ms of XLA ops per profiled step")
    print(f"{'ms/step':>8} {'share':>6}  op  shape  JAX op")
    for name, ms in per_op.most_common(args.top):
        print(f"{ms:8.1f} {ms / total:6.1%}  {name}  {names[name][:140]}")
    per_kind = collections.Counter()
    for name, ms in per_op.items():
        per_kind[_kind(names[name])] += ms
    print(f"\nby JAX primitive (last part of the op name):\n{'ms/step':>8} {'share':>6}  primitive")
    for kind, ms in per_kind.most_common():
        print(f"{ms:8.1f} {ms / total:6.1%}  {kind}")


def _kind(described: str) -> str:
    """The JAX primitive an op came from ('dot_general', 'exp', ...), from its `op_name` path."""
    parts = described.split(maxsplit=1)
    if len(parts) < 2 or not parts[1].strip():
        return "(no op_name: layout copy or XLA-inserted)"
    return parts[1].split(";")[0].rstrip("/").split("/")[-1]


if __name__ == "__main__":
    main()
