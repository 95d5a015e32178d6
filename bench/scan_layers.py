"""Scanned vs listed decoder layers, A/B in one run: compile and memory of a 7B-shaped DPO step, anchor step
time, decode throughput.

    python bench/scan_layers.py --list-tree /work/wt_list_bench --repeats 2
    python bench/scan_layers.py --list-tree DIR --only compile --layers 8     # a quicker compile check

Two source trees: `--list-tree` (the decoder with an `nnx.List` of layers looped in Python: a checkout of a
commit before the scan) and `--scan-tree` (default: this script's tree). Every measurement runs in a fresh
subprocess with `PYTHONPATH` pointing at one tree, using this tree's bench helpers, and the trees alternate
in ABBA order (list, scan, scan, list, ...), so a machine whose load drifts biases neither side.

- compile: the DPO step (eq. 7) of a Llama-2-7B-shaped policy (`train_step_devices.py --preset llama2_7b`:
  bf16 compute, float32 weights, remat) on 8 fake CPU devices, FSDP over all 8, lowered and compiled on
  abstract inputs (nothing allocated): lower and compile seconds, and XLA's per-device memory analysis
  (peak = arguments + outputs - aliased + temporaries).
- step: the DPO step at the anchor shape on one device (`dpo_throughput.py`'s set-up), float32, median of
  `--steps` steps after 2 warm-ups.
- decode: the anchor sampler, batch 8, float32 (`decode_throughput.bench_batch`), decode-only tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker_compile(args) -> dict:
    import train_step_devices

    options = argparse.Namespace(
        preset="llama2_7b",
        layers=args.layers,
        param_dtype="float32",
        no_remat=False,
        lora_rank=0,
        mesh="fsdp",
        rows=args.rows,
        length=args.length,
        step="dpo",
    )
    cfg = train_step_devices.model_config(options)
    mesh, rules, tx, scalars, shardings, steps = train_step_devices.build(options, cfg)
    return train_step_devices.compile_only(options, cfg, tx, shardings, steps, scalars, mesh, rules)


def worker_step(args) -> dict:
    import anchor
    import dpo_throughput
    import jax

    steps, scalars, state, mesh, rules = dpo_throughput._setup("float32")
    pairs = dpo_throughput._pairs()
    first = list(range(anchor.DPO["pairs_per_step"]))
    collate = dpo_throughput._collate
    chosen, rejected = jax.device_get(steps.reference(state.params, collate(pairs, first, mesh, rules)))
    batch = collate(pairs, first, mesh, rules, (chosen.ravel(), rejected.ravel()))
    times = []
    for i in range(2 + args.steps):
        start = time.perf_counter()
        state, metrics = steps.dpo(state, batch, scalars)
        jax.block_until_ready(metrics)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return {**anchor.summarize(times), "loss": float(metrics["loss"])}


def worker_decode(args) -> dict:
    import decode_throughput

    return decode_throughput.bench_batch("float32", 8, args.decode_repeats)


WORKERS = {"compile": worker_compile, "step": worker_step, "decode": worker_decode}


def run_worker(tree: str, what: str, args) -> dict:
    """One measurement in a subprocess importing `coevo_jax` from `tree`; returns its JSON result."""
    env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile every time: compile time is measured
    if what == "compile":
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    command = [sys.executable, os.path.abspath(__file__), "--worker", what, *sys.argv[1:]]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{what} on {tree} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result.pop("coevo_jax").startswith(os.path.abspath(tree)):
        raise RuntimeError(f"{what}: imported coevo_jax from outside {tree}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--list-tree", required=True, help="a checkout whose decoder loops over a layer list")
    parser.add_argument("--scan-tree", default=os.path.dirname(HERE))
    parser.add_argument("--only", nargs="+", choices=sorted(WORKERS), default=["compile", "step", "decode"])
    parser.add_argument("--repeats", type=int, default=2, help="A/B rounds (list, scan) per measurement")
    parser.add_argument("--layers", type=int, default=32, help="compile: layers of the 7B-shaped model")
    parser.add_argument(
        "--rows", type=int, default=16, help="compile: sequences per DPO step (2 x pairs, 8 | pairs)"
    )
    parser.add_argument("--length", type=int, default=1024, help="compile: tokens per sequence")
    parser.add_argument("--steps", type=int, default=8, help="step: timed DPO steps per run")
    parser.add_argument("--decode-repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "scan_layers.json"))
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import coevo_jax

        result = WORKERS[args.worker](args)
        print(json.dumps({**result, "coevo_jax": os.path.abspath(coevo_jax.__file__)}))
        return
    trees = {"list": args.list_tree, "scan": args.scan_tree}
    results: dict = {what: {"list": [], "scan": []} for what in args.only}
    for what in args.only:
        for repeat in range(args.repeats):
            order = (
                list(trees.items()) if repeat % 2 == 0 else list(trees.items())[::-1]
            )  # ABBA: drift cancels
            for name, tree in order:
                result = run_worker(tree, what, args)
                results[what][name].append(result)
                print(f"{what:8s} {name:5s} #{repeat}: {json.dumps(result)}", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {"args": vars(args), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "results": results}, f, indent=1
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
