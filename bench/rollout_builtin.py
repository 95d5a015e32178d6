"""Rollout throughput on the built-in environment: a tiny policy, SFT-ed briefly on expert data, then
batched greedy episodes on the test splits through the KV-cache actor.

    python bench/rollout_builtin.py                       # bf16 compute, 8 rows x 2 groups
    python bench/rollout_builtin.py --groups 1 --rows 16  # no env/device overlap
    python bench/rollout_builtin.py --epochs 0            # the untrained (random) policy
    python bench/rollout_builtin.py --epochs 0 --breakdown  # device time by call kind and cache window

Reports, per split: episodes/s, mean reward and success rate, generated tokens/s over the whole loop
(end to end: prefill, decode, detokenisation, environment steps) and the host's waits (on the device,
on the environments). A pure sampler measurement (batch 8, prompt 256, 128 new tokens, greedy, no stop)
gives the decode tokens/s of the compiled loop alone. `--breakdown` blocks on every prefill and decode call
and sums their time by cache window (`CallTimer`), with the turns' live lengths: where the device time
goes, at the cost of the overlap (its episodes/s are not the throughput). JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import common

WARMUP_STEPS = 10


def _sft(model_cfg, experts, tokenizer, fmt, epochs: int, batch_size: int, lr: float):
    import jax

    from coevo_jax import sharding
    from coevo_jax.data.batching import iter_sft_batches, tokenize_sft_examples
    from coevo_jax.models import abstract_model
    from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, phase_scalars
    from coevo_jax.train.state import init_train_state, state_shardings

    mesh = sharding.make_mesh(
        sharding.MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))), jax.devices()[:1]
    )
    rules = sharding.ShardingRules()
    examples, _ = tokenize_sft_examples(experts, tokenizer, fmt, max_length=1024)
    steps_per_epoch = -(-len(examples) // batch_size)
    opt = OptimizerConfig(
        learning_rate=lr,
        schedule="cosine",
        warmup_steps=WARMUP_STEPS,
        total_steps=max(
            epochs * steps_per_epoch, WARMUP_STEPS + 1
        ),  # the schedule needs one step past warm-up
    )
    tx, scalars = make_optimizer(opt.adamw_settings()), phase_scalars(opt, beta=0.0)
    graphdef, _ = abstract_model(model_cfg)
    shardings = state_shardings(model_cfg, tx, mesh, rules)
    steps = build_steps(graphdef, tx, shardings, mesh, rules, ObjectiveConfig())
    state = init_train_state(model_cfg, tx, shardings, jax.random.key(0))
    start, tokens, loss = time.perf_counter(), 0, float("nan")
    for epoch in range(epochs):
        for batch in iter_sft_batches(
            examples,
            batch_size=batch_size,
            pad_id=tokenizer.pad_token_id,
            buckets=(256, 512, 1024),
            seed=epoch,
        ):
            tokens += int(batch["attention_mask"].sum())
            placed = sharding.place_batch(sharding.device_layout(batch), mesh, rules)
            state, metrics = steps.sft(state, placed, scalars)
        loss = float(metrics["loss"])
        print(f"  SFT epoch {epoch + 1}/{epochs}: loss {loss:.3f}")
    seconds = time.perf_counter() - start
    return (
        state.params,
        {"sft_seconds": seconds, "sft_tokens_per_s": tokens / max(seconds, 1e-9), "sft_loss": loss},
    )


def _sampler_decode_rate(model_cfg, params) -> float:
    import jax
    import numpy as np

    from coevo_jax.sampling import Sampler, SamplingConfig

    sampler = Sampler(model_cfg, batch_size=8, cache_len=512, sampling=SamplingConfig(max_new_tokens=128))
    prompts = np.random.RandomState(0).randint(3, model_cfg.vocab_size, size=(8, 256)).tolist()
    times = []
    for repeat in range(4):
        cache = sampler.init_cache()
        logits, cache = sampler.prefill(params, cache, prompts, [0] * 8)
        jax.block_until_ready(logits)
        start = time.perf_counter()
        result, cache = sampler.decode(params, cache, logits, [True] * 8, jax.random.key(repeat))
        jax.block_until_ready(result.tokens_BxN)
        times.append(time.perf_counter() - start)
    return 8 * 128 / float(np.median(times[1:]))


class CallTimer:
    """Times a sampler's device work by call: `prefill` and `decode` wrapped on the instance so that each
    call blocks until its result is ready (the loop then loses its env/device overlap: a diagnostic, not
    a throughput measurement).

    `rows()` gives, per (call kind, cache window), the calls, their seconds and, for decode, the loop's
    steps (the most tokens any row generated in a call: the loop runs until its last row stops) and
    ms per step (window None: the call chose its own); `live` lists each turn's longest live row (the
    `window_for` argument)."""

    def __init__(self, sampler):
        import collections

        import jax
        import numpy as np

        self.calls = collections.Counter()
        self.seconds = collections.Counter()
        self.steps = collections.Counter()
        self.live: list[int] = []
        prefill, decode, window_for = sampler.prefill, sampler.decode, sampler.window_for

        def timed_prefill(weights, cache, chunks, start_lengths, window=None):
            start = time.perf_counter()
            logits, cache = prefill(weights, cache, chunks, start_lengths, window)
            jax.block_until_ready(logits)
            self._add(("prefill", window), time.perf_counter() - start, 0)
            return logits, cache

        def timed_decode(weights, cache, logits, active, key, window=None):
            start = time.perf_counter()
            result, cache = decode(weights, cache, logits, active, key, window)
            steps = int(np.max(np.asarray(result.counts_B)))  # blocks until the loop is done
            self._add(("decode", window), time.perf_counter() - start, steps)
            return result, cache

        def recorded_window_for(live_length: int) -> int:
            self.live.append(int(live_length))
            return window_for(live_length)

        sampler.prefill, sampler.decode, sampler.window_for = timed_prefill, timed_decode, recorded_window_for

    def _add(self, key, seconds: float, steps: int) -> None:
        self.calls[key] += 1
        self.seconds[key] += seconds
        self.steps[key] += steps

    def rows(self) -> list[dict]:
        total = sum(self.seconds.values()) or 1.0
        rows = []
        for (kind, window), seconds in self.seconds.most_common():
            steps = self.steps[(kind, window)]
            rows.append(
                {
                    "kind": kind,
                    "window": window,
                    "calls": self.calls[(kind, window)],
                    "seconds": seconds,
                    "share": seconds / total,
                    "decode_steps": steps,
                    "ms_per_step": seconds / steps * 1e3 if steps else None,
                }
            )
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--sample-dtype", choices=("bfloat16", "float32"), default="float32")
    parser.add_argument("--rows", type=int, default=8, help="cache rows per group")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--cache-len", type=int, default=2048)
    parser.add_argument("--tasks", type=int, default=50, help="tasks per test split")
    parser.add_argument("--out", default="bench/results/rollout_builtin.json")
    parser.add_argument("--keep", default=None, help="directory to keep the rollout JSONL files in")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="time each prefill and decode call blocked, by cache window (slower: no env/device overlap)",
    )
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from coevo_jax.data.chat_format import chat_format_for
    from coevo_jax.envs import make
    from coevo_jax.rollout import ModelActor, RolloutConfig, TurnCodec, run_rollouts
    from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig
    from coevo_jax.tokenization.training import train_tokenizer_for_trajectories

    env = make("builtin", num_test_seen=args.tasks, num_test_unseen=args.tasks)
    experts = env.expert_trajectories("train")
    tokenizer = train_tokenizer_for_trajectories(experts, vocab_size=1024)
    fmt = chat_format_for(tokenizer)
    model_cfg = common.anchor_config(
        jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32, len(tokenizer)
    )
    print(
        f"{jax.devices()[0].platform}: tiny policy, vocab {len(tokenizer)}, {args.dtype} compute, SFT {args.epochs} epochs"
    )
    params, sft = _sft(model_cfg, experts, tokenizer, fmt, args.epochs, batch_size=16, lr=1e-3)
    results = {"device": str(jax.devices()[0].device_kind), "args": vars(args), **sft}
    sample_cfg = model_cfg.replace(dtype=jnp.bfloat16 if args.sample_dtype == "bfloat16" else jnp.float32)
    results["sampler_decode_tokens_per_s"] = _sampler_decode_rate(sample_cfg, params)

    codec = TurnCodec(tokenizer, fmt)
    sampler = Sampler(
        sample_cfg,
        batch_size=args.rows,
        cache_len=args.cache_len,
        sampling=SamplingConfig(max_new_tokens=args.max_new_tokens),
        stops=StopConfig(stop_ids=codec.end_of_turn_ids),
    )
    timer = CallTimer(sampler) if args.breakdown else None
    actor = ModelActor(sampler, params, codec, num_groups=args.groups, stop_strings=("Observation:",))
    factory = lambda: make("builtin", num_test_seen=args.tasks, num_test_unseen=args.tasks)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or tmp
        run_rollouts(
            factory,
            actor,
            env.tasks("test_seen")[: args.rows * args.groups],
            os.path.join(workdir, "warm.jsonl"),
            RolloutConfig(show_progress=False),
        )
        for split in ("test_seen", "test_unseen"):
            before = actor.generated_tokens
            _, stats = run_rollouts(
                factory, actor, env.tasks(split), os.path.join(workdir, f"{split}.jsonl"), RolloutConfig()
            )
            tokens = actor.generated_tokens - before
            results[split] = {
                "episodes": stats.episodes,
                "episodes_per_s": stats.episodes_per_second,
                "mean_reward": stats.mean_reward,
                "success_rate": stats.successes / max(stats.episodes, 1),
                "steps": stats.steps,
                "generated_tokens_per_s": tokens / stats.wall_seconds,
                "wall_seconds": stats.wall_seconds,
                "host_wait_device_fraction": stats.wait_device_seconds / stats.wall_seconds,
                "host_wait_env_fraction": stats.wait_env_seconds / stats.wall_seconds,
                "terminations": dict(stats.terminations),
            }
    results["compilations"] = sampler.compilations
    print(
        f"\nsampler alone (batch 8, prompt 256, 128 new): {results['sampler_decode_tokens_per_s']:.0f} tokens/s"
    )
    print(
        f"{'split':12} {'episodes/s':>10} {'reward':>7} {'success':>8} {'gen tok/s':>10} {'wait dev':>9} {'wait env':>9}"
    )
    for split in ("test_seen", "test_unseen"):
        r = results[split]
        print(
            f"{split:12} {r['episodes_per_s']:10.2f} {r['mean_reward']:7.3f} {r['success_rate']:8.2f} "
            f"{r['generated_tokens_per_s']:10.0f} {r['host_wait_device_fraction']:9.2f} {r['host_wait_env_fraction']:9.2f}"
        )
    print(f"compiled sampler programs: {results['compilations']}")
    if timer is not None:
        results["breakdown"] = timer.rows()
        live = np.asarray(timer.live)
        results["live_tokens_percentiles"] = dict(
            zip((10, 50, 90, 100), np.percentile(live, [10, 50, 90, 100]).tolist(), strict=True)
        )
        print(
            f"\nblocked calls by window (warm-up turns included); longest live row per turn, p10/p50/p90/max: "
            f"{' / '.join(f'{v:.0f}' for v in results['live_tokens_percentiles'].values())}"
        )
        print(f"{'call':8} {'window':>6} {'calls':>6} {'s':>7} {'share':>6} {'steps':>6} {'ms/step':>8}")
        for row in results["breakdown"]:
            per_step = f"{row['ms_per_step']:8.2f}" if row["ms_per_step"] else f"{'':>8}"
            print(
                f"{row['kind']:8} {str(row['window']):>6} {row['calls']:6d} {row['seconds']:7.2f} {row['share']:6.1%} "
                f"{row['decode_steps']:6d} {per_step}"
            )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
