"""SmolLM2-135M train steps on the CPU: full fine-tuning vs LoRA, SFT (eq. 3/5) and DPO (eq. 7).

    python bench/lora_step.py                          # {sft, dpo} x {full, lora r=16}, one subprocess each
    python bench/lora_step.py --steps 5 --rows 8 --length 512
    python bench/lora_step.py --only lora:dpo --layers 2 --steps 1     # one case, a quick check

SmolLM2-135M's architecture (`shapes.smollm2_config`, from the bundled GGUF's metadata) with random
weights, on one device, with the SmolLM2 configs' dtype policy by default (bfloat16 compute, float32
parameters, remat). LoRA: rank `--rank` (alpha 2 x rank) on all seven projections, the base frozen.
Batches: SFT `--rows` sequences of `--length` random tokens, every token in the loss; DPO `--rows` / 2 pairs
of such sequences (reference log-probs from the reference pass, not timed).

Each case runs in its own process, so that its peak resident memory (`ru_maxrss`: model, train state,
compiled step and its buffers) is its own. Per case: XLA's memory analysis of the compiled step (arguments =
train state + frozen base + batch; temporaries), one warm-up step, then `--steps` timed steps; tokens/s
counts every (non-padding) token of the batch. Run it on an otherwise idle machine for numbers to quote.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = ("full:sft", "lora:sft", "full:dpo", "lora:dpo")


def run_case(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from shapes import smollm2_config

    from coevo_jax import sharding
    from coevo_jax.models import abstract_model, combine_trainable, partition_trainable
    from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, phase_scalars
    from coevo_jax.train.state import init_params, policy_shardings, state_shardings, train_state_from_params

    mode, kind = args.only.split(":")
    lora = dict(lora_rank=args.rank, lora_alpha=2.0 * args.rank) if mode == "lora" else {}
    layers = {} if args.layers is None else {"num_layers": args.layers}
    cfg = smollm2_config(args.dtype, remat=not args.no_remat, **lora, **layers)
    mesh = sharding.make_mesh(
        sharding.MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))), jax.devices()[:1]
    )
    rules = sharding.ShardingRules()
    opt = OptimizerConfig(learning_rate=1e-5)
    tx, scalars = make_optimizer(opt.adamw_settings()), phase_scalars(opt, beta=0.1)
    shardings = state_shardings(cfg, tx, mesh, rules)
    params_sh = policy_shardings(cfg, mesh, rules)
    steps = build_steps(
        abstract_model(cfg)[0],
        tx,
        shardings,
        mesh,
        rules,
        ObjectiveConfig(),
        param_shardings=params_sh,
    )
    trainable, frozen = partition_trainable(init_params(cfg, params_sh, jax.random.key(0)), cfg)
    state = train_state_from_params(trainable, tx, shardings)

    rng = np.random.RandomState(0)
    rows, length = args.rows, args.length
    ids = rng.randint(3, cfg.vocab_size, (rows, length)).astype(np.int32)
    batch = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "targets": np.roll(ids, -1, axis=1),
        "loss_mask": np.ones((rows, length), np.float32),
    }
    if kind == "sft":
        batch["example_mask"] = np.ones((rows,), np.float32)
    else:
        pairs = rows // 2
        batch.update(
            lambda_dpo=np.ones((pairs,), np.float32),
            lambda_sft=np.zeros((pairs,), np.float32),
            pair_mask=np.ones((pairs,), np.float32),
            ref_chosen_logps=np.zeros((pairs,), np.float32),
            ref_rejected_logps=np.zeros((pairs,), np.float32),
        )
    placed = sharding.place_batch(sharding.device_layout(batch), mesh, rules)
    if kind == "dpo":
        chosen, rejected = steps.reference(combine_trainable(state.params, frozen), placed)
        placed = {**placed, "ref_chosen_logps": chosen, "ref_rejected_logps": rejected}
    step = steps.sft if kind == "sft" else steps.dpo
    own = {k: placed[k] for k in step.keys}

    start = time.perf_counter()
    compiled = step.lower(state, placed, scalars, frozen).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    state, metrics = compiled(state, own, scalars, frozen)  # warm-up
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(args.steps):
        state, metrics = compiled(state, own, scalars, frozen)
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - start) / args.steps
    nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
    return {
        "case": args.only,
        "layers": cfg.num_layers,
        "rows": rows,
        "length": length,
        "dtype": str(jnp.dtype(cfg.dtype)),
        "remat": cfg.remat,
        "trainable_params": sum(x.size for x in jax.tree.leaves(state.params)),
        "frozen_params": sum(x.size for x in jax.tree.leaves(frozen)),
        "train_state_mib": nbytes(state) / 2**20,
        "frozen_mib": nbytes(frozen) / 2**20,
        "xla_arguments_mib": memory.argument_size_in_bytes / 2**20,
        "xla_temporaries_mib": memory.temp_size_in_bytes / 2**20,
        "compile_s": compile_s,
        "xla_gflop_per_step": cost.get("flops", float("nan")) / 1e9,
        "s_per_step": seconds,
        "tokens_per_s": float(np.sum(batch["attention_mask"])) / seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "loss": float(metrics["loss"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=CASES, default=None, help="one case, in this process")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rows", type=int, default=8, help="sequences per step (DPO: 2 per pair)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--no-remat", action="store_true")
    parser.add_argument(
        "--layers", type=int, default=None, help="fewer layers than SmolLM2's 30 (a quick check)"
    )
    args = parser.parse_args()
    if args.only is not None:
        print(json.dumps(run_case(args)))
        return
    results = []
    for case in CASES:
        argv = [arg for arg in sys.argv[1:] if not arg.startswith("--only")]
        out = subprocess.run(
            [sys.executable, __file__, "--only", case, *argv], check=True, capture_output=True, text=True
        ).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    first = results[0]
    print(
        f"SmolLM2-135M shape ({first['layers']} layers), {first['rows']} x {first['length']} tokens per step, "
        f"{first['dtype']} compute, remat {first['remat']}, LoRA r={args.rank}"
    )
    print(
        f"{'case':9s} {'trainable':>11} {'state MiB':>9} {'base MiB':>8} {'XLA args':>8} {'XLA temp':>8}"
        f" {'s/step':>7} {'tokens/s':>8} {'peak RSS MiB':>12}"
    )
    for r in results:
        print(
            f"{r['case']:9s} {r['trainable_params']:11,d} {r['train_state_mib']:9.1f} {r['frozen_mib']:8.1f}"
            f" {r['xla_arguments_mib']:8.1f} {r['xla_temporaries_mib']:8.1f} {r['s_per_step']:7.2f}"
            f" {r['tokens_per_s']:8.0f} {r['peak_rss_mib']:12.0f}"
        )


if __name__ == "__main__":
    main()
