"""Rollout speed-ups A/B on a trained policy: exploration episodes with attention over the whole KV cache
and every prompt prefilled whole (as before), against the window the batch needs (`coevo_jax.sampling`),
and against the window plus the shared prompt prefix copied into new episodes' cache (`ModelActor`).

    python bench/rollout_window.py WORKDIR [--policy sft_target] [--tasks 160] [--rounds 2]

WORKDIR is a finished (or partly finished) main-job workdir: its `config.json`, tokenizer and saved policy are
used, and its train tasks are played as its exploration stage plays them (sampled, `rollout.*` of the config,
the same seed). Variants alternate within each round, so both see the same machine load; the episodes of
every variant must be identical (same messages and rewards), which the script checks. JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workdir")
    parser.add_argument("--policy", default="sft_target")
    parser.add_argument("--tasks", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-len", type=int, default=None, help="default: the config's")
    parser.add_argument("--greedy", action="store_true", help="greedy, as evaluation plays")
    parser.add_argument("--out", default="bench/results/rollout_window.json")
    args = parser.parse_args()

    import jax

    from coevo_jax import envs
    from coevo_jax.data.records import read_trajectories
    from coevo_jax.experiment import rollouts
    from coevo_jax.experiment.config import ExperimentConfig
    from coevo_jax.experiment.policy import build_setup
    from coevo_jax.experiment.store import RunStore
    from coevo_jax.rollout import ModelActor, RolloutConfig, run_rollouts
    from coevo_jax.sampling import Sampler

    with open(os.path.join(args.workdir, "config.json")) as f:
        cfg = ExperimentConfig.from_mapping(json.load(f))
    rollout = {**cfg.to_json()["rollout"], "cache_len": args.cache_len or cfg.rollout.cache_len}
    cfg = ExperimentConfig.from_mapping({**cfg.to_json(), "show_progress": False, "rollout": rollout})
    experts = read_trajectories(os.path.join(args.workdir, "experts.jsonl"))
    setup = build_setup(cfg, args.workdir, experts)
    params = RunStore(args.workdir).load_policy(args.policy, setup.abstract_params)
    env_factory = lambda: envs.make(cfg.env.name, **dict(cfg.env.kwargs))  # noqa: E731
    env = env_factory()
    tasks = env.tasks(cfg.env.train_split)[: args.tasks]
    env.close()

    base = setup.programs.sampler(args.greedy)
    cache_len = cfg.rollout.cache_len
    variants = {  # name: (window buckets, share the prompt prefix)
        "whole cache": ((cache_len,), False),
        "windows": (None, False),
        "windows + shared prefix": (None, True),
    }
    samplers = {
        name: Sampler(
            base.model_config,
            batch_size=base.batch_size,
            cache_len=cache_len,
            sampling=base.sampling,
            stops=base.stops,
            mesh=base.mesh,
            rules=base.rules,
            param_shardings=setup.param_shardings,
            window_buckets=variants[name][0],
        )
        for name in variants
    }
    seconds = {name: [] for name in variants}
    episodes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, sampler in samplers.items():
                path = os.path.join(tmp, f"{round_}_{name.replace(' ', '_')}.jsonl")
                actor = ModelActor(
                    sampler,
                    params,
                    setup.codec,
                    num_groups=cfg.rollout.groups,
                    stop_strings=cfg.rollout.stop_strings,
                    seed=rollouts.stage_seed(cfg.seed, f"explore/{args.policy}/it1"),
                    share_prompt_prefix=variants[name][1],
                )
                start = time.perf_counter()
                trajectories, _ = run_rollouts(
                    env_factory,
                    actor,
                    tasks,
                    path,
                    RolloutConfig(agent=args.policy.rsplit("_", 1)[-1], iteration=1, show_progress=False),
                )
                seconds[name].append(time.perf_counter() - start)
                episodes[name] = [
                    (t.task_id, t.reward, [m.content for m in t.messages]) for t in trajectories
                ]
                print(f"round {round_ + 1}, {name}: {seconds[name][-1]:.1f} s", flush=True)
    identical = all(e == episodes["whole cache"] for e in episodes.values())
    rewards = [r for _, r, _ in episodes["whole cache"]]
    result = {
        "device": str(jax.devices()[0].device_kind),
        "workdir": args.workdir,
        "policy": args.policy,
        "episodes": len(rewards),
        "avg_reward": sum(rewards) / max(len(rewards), 1),
        "cache_len": cache_len,
        "window_buckets": {name: list(s.window_buckets) for name, s in samplers.items()},
        "shared_prefix": {name: v[1] for name, v in variants.items()},
        "compilations": {name: s.compilations for name, s in samplers.items()},
        "seconds": seconds,
        "identical_episodes": identical,
    }
    print(json.dumps(result, indent=1))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if not identical:
        raise SystemExit("the variants played different episodes")


if __name__ == "__main__":
    main()
