"""DPO throughput of tunix's `DPOTrainer` on the anchor config (issue 8), for comparison with coevo_jax.

    bench/.venvs/tunix/bin/python bench/peers/tunix_dpo.py              # float32 and bfloat16
    bench/.venvs/tunix/bin/python bench/peers/tunix_dpo.py --steps 2 --warmup 1 --phase-epochs 1 --variants fp32_ref

`tunix.sft.dpo.dpo_trainer.DPOTrainer` on tunix's Llama3 at the anchor shape (see tunix_llama.py), with a
separate reference model of the same weights; 8 pairs per step, prompt 256 + response 256, beta 0.1,
sigmoid loss, global-norm clipping at 1 then AdamW (lr 1e-5, no weight decay). The pairs are
`common.dpo_pairs(64)`, fed pre-tokenized (`prompt_ids`/`prompt_mask`, `chosen_ids`/`chosen_mask`,
`rejected_ids`/`rejected_mask`, no padding), which tunix takes as they are.

tunix has no reference-log-prob cache: its trainer runs the reference forward in every step.
Variants, each with a fresh policy, reference and trainer:
    fp32_ref   float32 parameters and compute
    bf16_ref   every parameter cast to bfloat16 (tunix's Llama3 has no mixed-precision setting), so
               activations, gradients and AdamW moments are bfloat16 too

One trainer per variant runs warm-up + timed steps and then the phase, fed from one generator.
Per step: the interval between consecutive step starts, each start waiting (in a training hook) until
the previous step's parameters are computed: the data batch, tunix's input preparation (masks,
positions, the reference forward) and the jitted train step. The first steps, which compile, are the
warm-up and are dropped. Phase: 3 epochs of the 64 pairs (24 steps, shuffled per epoch) on the same,
already compiled trainer, from a point where all earlier work has finished to the return of
`trainer.train()`, tunix's own pipelining (two steps in flight) left on.
"""

from __future__ import annotations

import argparse
import os
import time
from importlib.metadata import version

import jax
import numpy as np
import optax
from tunix.sft import hooks
from tunix.sft.dpo import dpo_trainer
from tunix_llama import block, build_model, check_device, common

VARIANTS = {"fp32_ref": "float32", "bf16_ref": "bfloat16"}  # name: dtype
TOKENS_PER_STEP = (
    common.DPO["pairs_per_step"] * 2 * (common.DPO["prompt_length"] + common.DPO["response_length"])
)


class StepClock(hooks.TrainingHooks):
    """Step-start timestamps; while `sync` is on, each start first waits for the previous step."""

    def __init__(self):
        self.starts: list[float] = []
        self.sync = True

    def on_train_step_start(self, train_ctx):
        if self.sync:
            block(train_ctx.model)
            self.starts.append(time.perf_counter())

    def on_train_start(self, train_ctx):
        pass

    def on_train_end(self, train_ctx):
        pass

    def on_train_step_end(self, train_ctx, train_step, train_loss):
        pass

    def on_eval_step_start(self, train_ctx):
        pass

    def on_eval_step_end(self, train_ctx, eval_loss):
        pass


def batch(pairs: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """One tunix `TrainingInput` as a dict: ids and all-ones masks for the given pairs."""
    out = {}
    for key in ("prompt", "chosen", "rejected"):
        ids = pairs[key][rows]
        out[f"{key}_ids"], out[f"{key}_mask"] = ids, np.ones_like(ids)
    return out


def feed(pairs, args, trainer, clock: StepClock, marks: dict):
    """Warm-up + timed steps (batches in order), then the phase (epochs of shuffled batches)."""
    n, size = len(pairs["prompt"]), common.DPO["pairs_per_step"]
    for k in range(args.warmup + args.steps):
        start = (k * size) % n
        yield batch(pairs, np.arange(start, start + size) % n)
    block(trainer.model)
    marks["steps_end"] = time.perf_counter()
    clock.sync = False
    marks["phase_start"] = time.perf_counter()
    rng = np.random.RandomState(0)
    for _ in range(args.phase_epochs):
        order = rng.permutation(n)
        for b in range(n // size):
            yield batch(pairs, order[b * size : (b + 1) * size])


def make_trainer(dtype: str) -> dpo_trainer.DPOTrainer:
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(common.DPO["learning_rate"], weight_decay=0.0)
    )
    config = dpo_trainer.DPOTrainingConfig(
        eval_every_n_steps=10**9, beta=common.DPO["beta"], pbar_description=None
    )
    policy, reference = build_model(dtype), build_model(dtype)
    return dpo_trainer.DPOTrainer(policy, reference, optimizer, config)


def run_variant(args, name: str, pairs) -> dict:
    dtype = VARIANTS[name]
    trainer = make_trainer(dtype)
    clock, marks = StepClock(), {}
    trainer.with_training_hooks(clock)
    trainer.train(feed(pairs, args, trainer, clock, marks))
    block(trainer.model)
    phase_s = time.perf_counter() - marks["phase_start"] if args.phase_epochs else None
    durations = np.diff(clock.starts + [marks["steps_end"]]).tolist()
    print(
        f"{name}: warm-up steps (compile included) {', '.join(f'{d:.2f}' for d in durations[: args.warmup])} s"
    )
    step = common.summarize(durations[args.warmup :])
    return {
        "name": name,
        "dtype": dtype,
        "precompute_ref": False,
        "step": step,
        "tokens_per_s": TOKENS_PER_STEP / step["median_s"],
        "phase_s": phase_s,
        "phase_steps": trainer.train_steps - args.warmup - args.steps,
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(variants: list[dict]) -> None:
    print(
        f"{'variant':<10} {'dtype':<9} {'median s':>9} {'min s':>7} {'max s':>7} {'tokens/s':>9} "
        f"{'phase s':>8} {'steps':>5}"
    )
    for v in variants:
        s = v["step"]
        print(
            f"{v['name']:<10} {v['dtype']:<9} {s['median_s']:>9.3f} {s['min_s']:>7.3f} {s['max_s']:>7.3f} "
            f"{v['tokens_per_s']:>9.0f} {_seconds(v['phase_s']):>8} {v['phase_steps']:>5}"
        )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=common.TIMED_STEPS, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=common.WARMUP_STEPS, help="untimed steps before them (>= 1)")
    p.add_argument("--phase-epochs", type=int, default=common.PHASE_EPOCHS, help="0 skips the phase timing")
    p.add_argument(
        "--pairs", type=int, default=common.PHASE_PAIRS, help="pairs in the data set (quick checks)"
    )
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS)
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (JAX's default backend must match)")
    p.add_argument("--out", default=None, help="results folder (default bench/results)")
    args = p.parse_args()
    if args.warmup < 1:
        p.error("--warmup must be at least 1: the first step compiles")
    return args


def main() -> None:
    args = parse_args()
    check_device(args.device)
    names = [n for n in args.variants.split(",") if n]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants: {sorted(unknown)}")
    pairs = common.dpo_pairs(args.pairs)
    variants = [run_variant(args, name, pairs) for name in names]
    versions = {name: version(name) for name in ("google-tunix", "jax", "jaxlib", "flax", "optax")}
    device = str(jax.devices()[0])
    print(f"\ntunix DPO, {device}, {versions}")
    print_table(variants)
    payload = {
        "framework": "tunix",
        "versions": versions,
        "threads": os.cpu_count() if jax.default_backend() == "cpu" else 0,  # XLA:CPU uses every core
        "device": device,
        "attn_implementation": "tunix llama3 einsum attention (full mask)",
        "variants": variants,
    }
    print("wrote", common.write_result("dpo_tunix", payload, out_dir=args.out))


if __name__ == "__main__":
    main()
