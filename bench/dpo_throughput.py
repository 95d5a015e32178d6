"""DPO throughput of coevo_jax on issue 8's anchor config: per step and per 3-epoch phase, float32 and bf16.

    python bench/dpo_throughput.py                    # both variants, prints a table, writes JSON
    python bench/dpo_throughput.py --variants float32 --steps 4 --warmup 1

The model, pairs and hyper-parameters come from `bench/anchor.py` (the peers' scripts read the same).
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
"""

from __future__ import annotations

import argparse
import time

import anchor
import ceiling
import flops
import numpy as np

LENGTH = anchor.DPO["prompt_length"] + anchor.DPO["response_length"]


def _pairs():
    """The anchor pairs as TokenizedPairs (prompt + response ids; response tokens are the actions)."""
    from coevo_jax.data.batching import TokenizedPair
    from coevo_jax.data.chat_format import TokenizedTrajectory

    data = anchor.dpo_pairs(anchor.PHASE_PAIRS)
    mask = np.zeros(LENGTH, bool)
    mask[anchor.DPO["prompt_length"] :] = True
    side = lambda name, i: TokenizedTrajectory(np.concatenate([data["prompt"][i], data[name][i]]), mask)
    return [
        TokenizedPair(side("chosen", i), side("rejected", i), 1.0, 0.0) for i in range(len(data["prompt"]))
    ]


def build_dpo_steps(cfg, learning_rate: float, beta: float, objective=None, device=None):
    """(steps, phase scalars, optimizer, state shardings, mesh, rules) of model `cfg` on one device (default
    the first): the main job's steps built for a constant-lr AdamW phase without weight decay.
    `objective`: an ObjectiveConfig (default the main job's)."""
    import jax

    from coevo_jax import sharding
    from coevo_jax.models import abstract_model
    from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, phase_scalars
    from coevo_jax.train.state import state_shardings

    mesh = sharding.make_mesh(
        sharding.MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))), [device or jax.devices()[0]]
    )
    rules = sharding.ShardingRules()
    opt = OptimizerConfig(learning_rate=learning_rate, warmup_steps=0, weight_decay=0.0)
    tx, scalars = make_optimizer(opt.adamw_settings()), phase_scalars(opt, beta)
    graphdef, _ = abstract_model(cfg)
    shardings = state_shardings(cfg, tx, mesh, rules)
    steps = build_steps(graphdef, tx, shardings, mesh, rules, objective or ObjectiveConfig())
    return steps, scalars, tx, shardings, mesh, rules


def setup_steps(cfg, learning_rate: float, beta: float, objective=None):
    """(steps, phase scalars, train state, mesh, rules): `build_dpo_steps` on the first device, the state
    randomly initialised."""
    import jax

    from coevo_jax.train.state import init_train_state

    steps, scalars, tx, shardings, mesh, rules = build_dpo_steps(cfg, learning_rate, beta, objective)
    state = init_train_state(cfg, tx, shardings, jax.random.key(0))
    return steps, scalars, state, mesh, rules


def _setup(dtype_name: str):
    from shapes import anchor_config

    return setup_steps(anchor_config(dtype_name), anchor.DPO["learning_rate"], anchor.DPO["beta"])


def time_steps(step, state, batch, scalars, warmup: int, timed: int):
    """(state, last metrics, seconds of the first call, seconds of each of `timed` calls) of `step` on one
    batch: the first call (it compiles), `warmup - 1` more untimed, then `timed`; each blocked until its
    metrics are ready."""
    import jax

    start = time.perf_counter()
    state, metrics = step(state, batch, scalars)
    jax.block_until_ready(metrics)
    first_s = time.perf_counter() - start
    for _ in range(max(warmup - 1, 0)):
        state, metrics = step(state, batch, scalars)
        jax.block_until_ready(metrics)
    times = []
    for _ in range(timed):
        start = time.perf_counter()
        state, metrics = step(state, batch, scalars)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return state, metrics, first_s, times


def _collate(pairs, indices, mesh, rules, reference=None):
    """One placed DPO batch of `pairs[indices]`, with reference log-probs picked per pair if given."""
    from coevo_jax import sharding
    from coevo_jax.data.batching import collate_dpo

    batch = collate_dpo(
        [pairs[i] for i in indices], length=LENGTH, pairs_per_batch=len(indices), pad_id=anchor.PAD_ID
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

    per_step = anchor.DPO["pairs_per_step"]
    chosen = np.zeros(len(pairs), np.float32)
    rejected = np.zeros(len(pairs), np.float32)
    for start in range(0, len(pairs), per_step):
        indices = list(range(start, start + per_step))
        batch = _collate(pairs, indices, mesh, rules)
        c, r = jax.device_get(steps.reference(state.params, batch))
        chosen[indices], rejected[indices] = np.ravel(c), np.ravel(r)
    for epoch in range(anchor.PHASE_EPOCHS):
        for _, indices in plan_batches([LENGTH] * len(pairs), per_step, (LENGTH,), seed=epoch):
            state, metrics = steps.dpo(
                state, _collate(pairs, indices, mesh, rules, (chosen, rejected)), scalars
            )
        jax.device_get(metrics["loss"])
    return state


def bench_variant(dtype_name: str, warmup: int, timed: int, ceilings: dict) -> dict:
    import jax

    steps, scalars, state, mesh, rules = _setup(dtype_name)
    pairs = _pairs()
    first = list(range(anchor.DPO["pairs_per_step"]))
    chosen, rejected = jax.device_get(steps.reference(state.params, _collate(pairs, first, mesh, rules)))
    batch = _collate(pairs, first, mesh, rules, (np.ravel(chosen), np.ravel(rejected)))

    state, metrics, compile_s, times = time_steps(steps.dpo, state, batch, scalars, warmup, timed)
    step = anchor.summarize(times)

    state = run_phase(
        steps, scalars, state, pairs[: anchor.DPO["pairs_per_step"] * 2], mesh, rules
    )  # warm the phase path
    start = time.perf_counter()
    run_phase(steps, scalars, state, pairs, mesh, rules)
    phase_s = time.perf_counter() - start

    pairs_per_step = anchor.DPO["pairs_per_step"]
    useful = flops.dpo_step_flops(anchor.MODEL, pairs_per_step, LENGTH, reference_forward=False)
    achieved = useful / step["median_s"] / 1e9
    return {
        "name": f"{dtype_name}, cached reference log-probs",
        "dtype": dtype_name,
        "precompute_ref": True,
        "step": step,
        "tokens_per_s": 2 * pairs_per_step * LENGTH / step["median_s"],
        "phase_s": phase_s,
        "phase_steps": anchor.PHASE_EPOCHS * anchor.PHASE_PAIRS // pairs_per_step,
        "compile_s": compile_s,
        "useful_gflop_per_step": useful / 1e9,
        "useful_gflops": achieved,
        "ceiling_gflops": ceilings[dtype_name],
        "fraction_of_ceiling": achieved / ceilings[dtype_name],
        "final_loss": float(metrics["loss"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--variants", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"]
    )
    parser.add_argument("--warmup", type=int, default=anchor.WARMUP_STEPS)
    parser.add_argument("--steps", type=int, default=anchor.TIMED_STEPS)
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    args = parser.parse_args()
    import jax

    ceilings = {name: ceiling.matmul_gflops(name) for name in ("float32", "bfloat16")}
    variants = [bench_variant(name, args.warmup, args.steps, ceilings) for name in args.variants]
    print(f"coevo_jax {jax.__version__} on {jax.devices()[0].device_kind}; ceilings (GFLOP/s): {ceilings}")
    print(f"{'variant':40s} {'ms/step':>8} {'tokens/s':>9} {'phase s':>8} {'GFLOP/s':>8} {'of ceiling':>10}")
    for v in variants:
        print(
            f"{v['name']:40s} {v['step']['median_s'] * 1e3:8.1f} {v['tokens_per_s']:9.0f} {v['phase_s']:8.2f}"
            f" {v['useful_gflops']:8.0f} {v['fraction_of_ceiling']:10.0%}"
        )
    anchor.write_result(
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
