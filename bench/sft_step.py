"""SFT train-step throughput of the tiny Llama shape on one device (random tokens, every token in the loss).

    python bench/sft_step.py                  # float32 compute
    python bench/sft_step.py --dtype bfloat16 --remat

For each (rows, length): one warm-up step (compilation), then the mean of three timed steps.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from shapes import anchor_config

from coevo_jax import sharding
from coevo_jax.models import abstract_model
from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, phase_scalars
from coevo_jax.train.state import init_train_state, state_shardings

VOCAB = 620  # the built-in environment's trained tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--remat", action="store_true")
    args = parser.parse_args()
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    cfg = anchor_config(dtype, VOCAB).replace(remat=args.remat)
    mesh = sharding.make_mesh(
        sharding.MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))), jax.devices()[:1]
    )
    rules = sharding.ShardingRules()
    opt = OptimizerConfig(learning_rate=1e-3)
    tx, scalars = make_optimizer(opt.adamw_settings()), phase_scalars(opt, beta=0.0)
    graphdef, _ = abstract_model(cfg)
    shardings = state_shardings(cfg, tx, mesh, rules)
    steps = build_steps(graphdef, tx, shardings, mesh, rules, ObjectiveConfig())
    state = init_train_state(cfg, tx, shardings, jax.random.key(0))
    print(f"{'rows':>5} {'length':>6} {'s/step':>7} {'tokens/s':>9}")
    for rows, length in ((16, 512), (16, 1024), (32, 256)):
        rng = np.random.RandomState(0)
        ones = np.ones((rows, length), np.int32)
        batch = dict(
            input_ids=rng.randint(0, VOCAB, (rows, length)).astype(np.int32),
            attention_mask=ones,
            targets=rng.randint(0, VOCAB, (rows, length)).astype(np.int32),
            loss_mask=ones,
            example_mask=np.ones((rows,), np.int32),
        )
        placed = sharding.place_batch(sharding.device_layout(batch), mesh, rules)
        state, metrics = steps.sft(state, placed, scalars)
        jax.block_until_ready(metrics["loss"])
        start = time.perf_counter()
        for _ in range(3):
            state, metrics = steps.sft(state, placed, scalars)
        jax.block_until_ready(metrics["loss"])
        seconds = (time.perf_counter() - start) / 3
        print(f"{rows:5d} {length:6d} {seconds:7.3f} {rows * length / seconds:9.0f}")


if __name__ == "__main__":
    main()
