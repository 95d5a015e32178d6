"""Per-device memory and step time of the SFT / target train steps on 1 vs 8 (fake CPU) devices.

    python bench/train_step_devices.py                 # runs 1 and 8 devices, each in a subprocess
    python bench/train_step_devices.py --devices 8 --mesh fsdp
    python bench/train_step_devices.py --devices 8 --preset llama2_7b --compile-only --rows 8 --length 4096
    python bench/train_step_devices.py --devices 1 --preset llama2_7b --compile-only --rows 1 --length 4096 \
        --lora-rank 16 --step dpo

`--compile-only` lowers the step on abstract inputs (nothing is allocated) and prints XLA's per-device memory
analysis: how the numbers of docs/memory_plan.md were checked for a Llama-2-7B-shaped policy, trained in
full or (`--lora-rank`) as LoRA adapters on a frozen base; `--step dpo` compiles the DPO step (eq. 7) on
`--rows` / 2 pairs instead of the SFT step.

Memory figures are per device: the train state's bytes actually resident on device 0 (from the arrays'
addressable shards) and XLA's compiled memory analysis of the step (arguments, outputs, temporaries).
On fake CPU devices the step time measures partitioning overhead, not accelerator speed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

MESHES = {
    "single": (("data", 1), ("fsdp", 1), ("tensor", 1)),
    "data": (("data", -1), ("fsdp", 1), ("tensor", 1)),
    "fsdp": (("data", 1), ("fsdp", -1), ("tensor", 1)),
    "fsdp_tensor": (("data", 1), ("fsdp", -1), ("tensor", 2)),
}


def _mib(n: float) -> str:
    return f"{n / 2**20:8.3f} MiB"


def model_config(args):
    """The `--preset` model (Llama-2-7B's shape, or a tiny one)."""
    from coevo_jax.models import ModelConfig

    if args.preset == "llama2_7b":
        return ModelConfig(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=11008,
            num_layers=args.layers or 32,
            num_heads=32,
            num_kv_heads=32,
            head_dim=128,
            dtype="bfloat16",
            param_dtype=args.param_dtype,
            remat=not args.no_remat,
            lora_rank=args.lora_rank,
            lora_alpha=2.0 * max(args.lora_rank, 1),
        )
    return ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_layers=args.layers or 2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=args.hidden // 4,
    )


def build(args, cfg):
    """(mesh, rules, optimizer, phase scalars, state shardings, steps) of `cfg` on the `--mesh` mesh."""
    from coevo_jax import sharding
    from coevo_jax.models import abstract_model
    from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, phase_scalars
    from coevo_jax.train.state import policy_shardings, state_shardings

    mesh = sharding.make_mesh(sharding.MeshConfig(axes=MESHES[args.mesh]))
    rules = sharding.ShardingRules()
    opt = OptimizerConfig(learning_rate=1e-4)
    tx, scalars = make_optimizer(opt.adamw_settings()), phase_scalars(opt, beta=0.1)
    graphdef, _ = abstract_model(cfg)
    shardings = state_shardings(cfg, tx, mesh, rules)
    steps = build_steps(
        graphdef,
        tx,
        shardings,
        mesh,
        rules,
        ObjectiveConfig(),
        param_shardings=policy_shardings(cfg, mesh, rules),
    )
    return mesh, rules, tx, scalars, shardings, steps


def run(args) -> None:
    import jax
    import numpy as np

    from coevo_jax import sharding
    from coevo_jax.train.state import init_train_state

    cfg = model_config(args)
    mesh, rules, tx, scalars, shardings, steps = build(args, cfg)
    if args.compile_only:
        compile_only(args, cfg, tx, shardings, steps, scalars, mesh, rules)
        return
    state = init_train_state(cfg, tx, shardings, jax.random.key(0))

    rng = np.random.RandomState(0)
    rows, length = args.rows, args.length
    ids = rng.randint(1, cfg.vocab_size, size=(rows, length)).astype(np.int32)
    loss_mask = np.zeros((rows, length), np.float32)
    loss_mask[:, length // 2 : -1] = 1.0
    batch = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "targets": np.roll(ids, -1, axis=1),
        "loss_mask": loss_mask,
        "example_mask": np.ones((rows,), np.float32),
    }
    placed = sharding.place_batch(sharding.device_layout(batch), mesh, rules)

    device0 = jax.devices()[0]
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    resident = sum(
        s.data.nbytes
        for leaf in jax.tree.leaves(state)
        for s in leaf.addressable_shards
        if s.device == device0
    )
    compiled = steps.sft.lower(state, placed, scalars).compile()
    memory = compiled.memory_analysis()

    state, metrics = steps.sft(state, placed, scalars)  # warm-up (compile)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        state, metrics = steps.sft(state, placed, scalars)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    tokens = float(metrics["tokens"])
    median = float(np.median(times))
    print(
        f"== {jax.device_count()} device(s), mesh {dict(mesh.shape)}, model {cfg.hidden_size}x{cfg.num_layers}L"
    )
    print(f"  train state, whole          {_mib(total)}")
    print(f"  train state on device 0     {_mib(resident)}  ({resident / total:.3f} of whole)")
    if memory is not None:
        print(f"  step arguments / device     {_mib(memory.argument_size_in_bytes)}")
        print(f"  step outputs / device       {_mib(memory.output_size_in_bytes)}")
        print(f"  step temporaries / device   {_mib(memory.temp_size_in_bytes)}")
    print(
        f"  SFT step time (median of {args.iters})  {median * 1e3:8.2f} ms   {tokens / median:10.0f} tokens/s"
    )


def compile_only(args, cfg, tx, shardings, steps, scalars, mesh, rules) -> dict:
    """Per-device memory analysis of the SFT (or DPO) step compiled on abstract (never allocated) inputs."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from coevo_jax import sharding
    from coevo_jax.models import abstract_model, partition_trainable
    from coevo_jax.train.state import abstract_state, policy_shardings

    state = abstract_state(cfg, tx, shardings)
    _, abstract_frozen = partition_trainable(nnx.to_pure_dict(abstract_model(cfg)[1]), cfg)
    _, frozen_shardings = partition_trainable(policy_shardings(cfg, mesh, rules), cfg)
    frozen = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract_frozen, frozen_shardings
    )
    rows_sharding = jax.sharding.NamedSharding(mesh, sharding.batch_spec(3, rules))
    per_row = jax.sharding.NamedSharding(mesh, sharding.batch_spec(2, rules))
    shapes = {
        "input_ids": jnp.int32,
        "attention_mask": jnp.int32,
        "targets": jnp.int32,
        "loss_mask": jnp.float32,
    }
    batch = {
        key: jax.ShapeDtypeStruct((1, args.rows, args.length), dtype, sharding=rows_sharding)
        for key, dtype in shapes.items()
    }
    if args.step == "sft":
        batch["example_mask"] = jax.ShapeDtypeStruct((1, args.rows), jnp.float32, sharding=per_row)
    else:
        for key in sharding.PAIR_KEYS:
            batch[key] = jax.ShapeDtypeStruct((1, args.rows // 2), jnp.float32, sharding=per_row)
    step = steps.sft if args.step == "sft" else steps.dpo
    start = time.perf_counter()
    lowered = step.lower(state, batch, scalars, frozen)
    lowered_at = time.perf_counter()
    memory = lowered.compile().memory_analysis()
    compiled_at = time.perf_counter()
    total = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(state))
    frozen_total = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(frozen))
    print(
        f"== {jax.device_count()} device(s), mesh {dict(mesh.shape)}, {cfg.num_layers} layers x {cfg.hidden_size}"
        f", {args.step} step" + (f", LoRA r={cfg.lora_rank}" if cfg.lora_rank else "")
    )
    print(
        f"  lowered in {lowered_at - start:.0f} s, compiled in {compiled_at - lowered_at:.0f} s; rows {args.rows} x length {args.length}, remat {cfg.remat}"
    )
    print(f"  train state, whole          {total / 2**30:8.2f} GiB")
    print(f"  frozen base, whole          {frozen_total / 2**30:8.2f} GiB")
    print(f"  step arguments / device     {memory.argument_size_in_bytes / 2**30:8.2f} GiB")
    print(f"  step outputs / device       {memory.output_size_in_bytes / 2**30:8.2f} GiB")
    print(f"  step temporaries / device   {memory.temp_size_in_bytes / 2**30:8.2f} GiB")
    peak = (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes
    )
    print(f"  peak / device (arg + out - alias + temp)  {peak / 2**30:8.2f} GiB")
    return {
        "lower_s": lowered_at - start,
        "compile_s": compiled_at - lowered_at,
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "peak_bytes": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", type=int, default=None, help="fake CPU devices (default: run 1 and 8)")
    parser.add_argument("--mesh", choices=sorted(MESHES), default=None)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=None, help="default: 2 (tiny) / 32 (llama2_7b)")
    parser.add_argument("--preset", choices=["tiny", "llama2_7b"], default="tiny")
    parser.add_argument("--no-remat", action="store_true", help="llama2_7b preset without rematerialisation")
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="llama2_7b preset: LoRA adapters of this rank"
    )
    parser.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32", help="llama2_7b")
    parser.add_argument("--step", choices=("sft", "dpo"), default="sft", help="with --compile-only")
    parser.add_argument("--compile-only", action="store_true", help="memory analysis on abstract inputs")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if args.devices is None:
        for devices, mesh in ((1, "single"), (8, "fsdp"), (8, "data")):
            cmd = [sys.executable, __file__, "--devices", str(devices), "--mesh", mesh, *sys.argv[1:]]
            subprocess.run(cmd, check=True)
        return
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    args.mesh = args.mesh or ("single" if args.devices == 1 else "fsdp")
    run(args)


if __name__ == "__main__":
    main()
