"""DPO throughput of coevo_jax on issue 8's anchor config: per step and per 3-epoch phase, float32 and bf16.

    python bench/dpo_throughput.py                    # both variants, prints a table, writes JSON
    python bench/dpo_throughput.py --variants float32 --steps 4 --warmup 1
    python bench/dpo_throughput.py --variants bfloat16 --profile 2   # also where a step's time goes

The model, pairs and hyper-parameters come from `bench/common.py` (the peers' scripts read the same).
Variants: `float32` (compute and parameters float32) and `bfloat16` (bf16 compute, float32 master weights).

Timings:
- step: the eq. 7 DPO step (policy forward + backward + AdamW), reference log-probs already attached
  (cached once per phase, as the training loop does); `--warmup` untimed steps (the first compiles),
  then the median of `--steps` steps, each blocked until its metrics are ready.
- phase: one whole 3-epoch DPO phase over 64 pairs as `coevo_jax.experiment` runs it, after warm-up
  (programs compiled): one reference forward per pair (8 batches), then 24 updates, each epoch in a
  fresh seeded order, batches collated and placed on the fly, the loss read back after every epoch.
- useful FLOP/s: `bench/flops.py` (causal attention, no recompute, 3x forward per train step) over the
  median step time, and its fraction of the XLA matmul ceiling measured in the same process.
- `--profile STEPS`: after the timings, that many more steps traced under `jax.profiler`, each XLA op's time
  summed and named by the JAX operation it came from (`bench/op_profile.py`). Profiling slows a step; read
  the shares, not the totals.
"""

from __future__ import annotations

import argparse
import time

import ceiling
import common
import flops
import numpy as np
import op_profile

LENGTH = common.DPO["prompt_length"] + common.DPO["response_length"]


def _pairs():
    """The anchor pairs as TokenizedPairs (prompt + response ids; response tokens are the actions)."""
    from coevo_jax.data.batching import TokenizedPair
    from coevo_jax.data.chat_format import TokenizedTrajectory

    data = common.dpo_pairs(common.PHASE_PAIRS)
    mask = np.zeros(LENGTH, bool)
    mask[common.DPO["prompt_length"] :] = True
    side = lambda name, i: TokenizedTrajectory(np.concatenate([data["prompt"][i], data[name][i]]), mask)
    return [
        TokenizedPair(side("chosen", i), side("rejected", i), 1.0, 0.0) for i in range(len(data["prompt"]))
    ]


def _collate(pairs, indices, mesh, rules, reference=None):
    """One placed DPO batch of `pairs[indices]`, with reference log-probs picked per pair if given."""
    from coevo_jax import sharding
    from coevo_jax.data.batching import collate_dpo

    batch = collate_dpo(
        [pairs[i] for i in indices], length=LENGTH, pairs_per_batch=len(indices), pad_id=common.PAD_ID
    )
    if reference is not None:
        batch["ref_chosen_logps"] = reference[0][list(indices)]
        batch["ref_rejected_logps"] = reference[1][list(indices)]
    return sharding.place_batch(sharding.device_layout(batch), mesh, rules)


def run_phase(steps, scalars, state, pairs, mesh, rules):
    """One 3-epoch phase as `experiment.phases.dpo_phase` runs it: a reference forward once per pair
    (batches in file order), then every epoch in a fresh seeded order with the cached log-probs attached.
    Returns the new state."""
    import jax

    from coevo_jax.data.batching import plan_batches

    per_step = common.DPO["pairs_per_step"]
    chosen = np.zeros(len(pairs), np.float32)
    rejected = np.zeros(len(pairs), np.float32)
    for start in range(0, len(pairs), per_step):
        indices = list(range(start, start + per_step))
        batch = _collate(pairs, indices, mesh, rules)
        c, r = jax.device_get(steps.reference(state.params, batch))
        chosen[indices], rejected[indices] = np.ravel(c), np.ravel(r)
    for epoch in range(common.PHASE_EPOCHS):
        for _, indices in plan_batches([LENGTH] * len(pairs), per_step, (LENGTH,), seed=epoch):
            state, metrics = steps.dpo(
                state, _collate(pairs, indices, mesh, rules, (chosen, rejected)), scalars
            )
        jax.device_get(metrics["loss"])
    return state


def bench_variant(dtype_name: str, warmup: int, timed: int, ceilings: dict, profile_calls: int = 0) -> dict:
    """One variant's step, phase and FLOP figures; with `profile_calls`, also where that many traced steps'
    time goes (`op_profile`)."""
    import jax

    cfg = common.anchor_config(dtype_name)
    steps, scalars, state, mesh, rules = common.setup_steps(
        cfg, common.DPO["learning_rate"], common.DPO["beta"]
    )
    pairs = _pairs()
    first = list(range(common.DPO["pairs_per_step"]))
    chosen, rejected = jax.device_get(steps.reference(state.params, _collate(pairs, first, mesh, rules)))
    batch = _collate(pairs, first, mesh, rules, (np.ravel(chosen), np.ravel(rejected)))

    state, metrics, compile_s, times = common.time_steps(steps.dpo, state, batch, scalars, warmup, timed)
    step = common.summarize(times)
    profile = None
    if profile_calls:
        hlo_text, run, carry = op_profile.train_step_calls(steps.dpo, state, batch, scalars)
        profile = op_profile.profile_ops(run, hlo_text, profile_calls)
        op_profile.print_summary(profile, f"{dtype_name} anchor DPO step", 25)
        state = carry["state"]  # the step donated the one before

    state = run_phase(
        steps, scalars, state, pairs[: common.DPO["pairs_per_step"] * 2], mesh, rules
    )  # warm the phase path
    start = time.perf_counter()
    run_phase(steps, scalars, state, pairs, mesh, rules)
    phase_s = time.perf_counter() - start

    pairs_per_step = common.DPO["pairs_per_step"]
    useful = flops.dpo_step_flops(common.MODEL, pairs_per_step, LENGTH, reference_forward=False)
    achieved = useful / step["median_s"] / 1e9
    return {
        "name": f"{dtype_name}, cached reference log-probs",
        "dtype": dtype_name,
        "precompute_ref": True,
        "step": step,
        "tokens_per_s": 2 * pairs_per_step * LENGTH / step["median_s"],
        "phase_s": phase_s,
        "phase_steps": common.PHASE_EPOCHS * common.PHASE_PAIRS // pairs_per_step,
        "compile_s": compile_s,
        "useful_gflop_per_step": useful / 1e9,
        "useful_gflops": achieved,
        "ceiling_gflops": ceilings[dtype_name],
        "fraction_of_ceiling": achieved / ceilings[dtype_name],
        "final_loss": float(metrics["loss"]),
        "profile": op_profile.for_json(profile),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--variants", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"]
    )
    parser.add_argument("--warmup", type=int, default=common.WARMUP_STEPS)
    parser.add_argument("--steps", type=int, default=common.TIMED_STEPS)
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS", help="also trace this many steps per variant"
    )
    args = parser.parse_args()
    import jax

    ceilings = {name: ceiling.matmul_gflops(name) for name in ("float32", "bfloat16")}
    variants = [
        bench_variant(name, args.warmup, args.steps, ceilings, args.profile) for name in args.variants
    ]
    print(f"coevo_jax {jax.__version__} on {jax.devices()[0].device_kind}; ceilings (GFLOP/s): {ceilings}")
    print(f"{'variant':40s} {'ms/step':>8} {'tokens/s':>9} {'phase s':>8} {'GFLOP/s':>8} {'of ceiling':>10}")
    for v in variants:
        print(
            f"{v['name']:40s} {v['step']['median_s'] * 1e3:8.1f} {v['tokens_per_s']:9.0f} {v['phase_s']:8.2f}"
            f" {v['useful_gflops']:8.0f} {v['fraction_of_ceiling']:10.0%}"
        )
    common.write_result(
        "dpo_coevo_jax",
        {
            "framework": "coevo_jax",
            "versions": {"jax": jax.__version__},
            "device": str(jax.devices()[0].device_kind),
            "ceilings_gflops": ceilings,
            "variants": variants,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
