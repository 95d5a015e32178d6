"""Saved policies of a finished run evaluated by sampling instead of greedily, paired on the same tasks and seeds.

The main job evaluates greedily (as CoEvolve does). GRPO trains on sampled episodes, so a gain it makes can
show under sampling and not under greedy decoding: this tells the two apart. Each policy plays every
evaluation task of the run K times at the given temperature with the same sampling seed per split (so the
first policy listed, usually `sft_target`, is the baseline of paired, per-task differences).

    python -m coevo_jax.analysis sampled_eval --workdir WORKDIR [--policies sft_target grpo_it2_target ...]
        [--samples 4] [--temperature 0.9]

Episodes go to `<workdir>/sampled_eval/<policy>_<split>.jsonl` (a rerun resumes them); the summary to
`<workdir>/sampled_eval/sampled_eval.json` and stdout. Where the environment grades its episodes
(`envs.base.GRADED_SCORE`: BFCL's per-turn accuracy, the built-in environment's sub-goal progress), the same
paired summary is made of the graded score too (`graded_score`, its `reward` the mean graded score): on BFCL, where no policy solves a task, it is
the only number that moves.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from coevo_jax.envs.base import GRADED_SCORE
from coevo_jax.experiment import rollouts
from coevo_jax.experiment.finished_run import open_run
from coevo_jax.experiment.task_subsets import pick_tasks


def per_task_means(rewards: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each task's mean reward over its samples."""
    return {task: float(np.mean(values)) for task, values in rewards.items()}


def graded_by_task(episodes) -> dict[str, list[float]] | None:
    """Each task's graded scores (`GRADED_SCORE` in the episodes' metrics); None if an episode has none."""
    by_task: dict[str, list[float]] = {}
    for episode in episodes:
        score = episode.extra.get("metrics", {}).get(GRADED_SCORE)
        if score is None:
            return None
        by_task.setdefault(episode.task_id, []).append(float(score))
    return by_task


def paired_summary(policy: Mapping[str, Sequence[float]], baseline: Mapping[str, Sequence[float]]) -> dict:
    """A policy's sampled reward and success against the baseline's on the same tasks.

    Both map task id -> the rewards of its samples. Returns the policy's mean reward and success rate over
    all samples, and the per-task mean reward difference (policy - baseline) with its standard error over
    tasks, and the tasks won / lost / tied on that mean."""
    if set(policy) != set(baseline):
        raise ValueError("the two policies played different tasks")
    tasks = sorted(policy)
    diffs = np.array([np.mean(policy[t]) - np.mean(baseline[t]) for t in tasks], dtype=np.float64)
    flat = np.array([r for t in tasks for r in policy[t]], dtype=np.float64)
    return {
        "tasks": len(tasks),
        "episodes": int(flat.size),
        "reward": float(flat.mean()),
        "success_rate": float(np.mean(flat == 1.0)),
        "difference": float(diffs.mean()),
        "difference_std_error": float(diffs.std(ddof=1) / np.sqrt(diffs.size)) if diffs.size > 1 else None,
        "tasks_won": int(np.sum(diffs > 0)),
        "tasks_lost": int(np.sum(diffs < 0)),
        "tasks_tied": int(np.sum(diffs == 0)),
    }


def main(argv: list[str] | None = None) -> dict:
    """Samples every policy on the run's evaluation splits; returns the summary it writes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument(
        "--policies", nargs="+", default=["sft_target"], help="saved policies; first = baseline"
    )
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.9)
    args = parser.parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    out = os.path.join(workdir, "sampled_eval")
    os.makedirs(out, exist_ok=True)

    run = open_run(workdir)
    cfg, setup, env_factory = run.config, run.setup, run.make_env
    env = env_factory()
    splits = {
        split: pick_tasks(env.tasks(split), cfg.env.eval_tasks, cfg.env.eval_task_subset)
        for split in cfg.env.eval_splits
    }
    env.close()
    rewards: dict[str, dict[str, dict[str, list[float]]]] = {}
    graded: dict[str, dict[str, dict[str, list[float]] | None]] = {}
    for name in args.policies:
        params = run.policy(name)
        rewards[name], graded[name] = {}, {}
        for split, tasks in splits.items():
            episodes = rollouts.play(
                setup,
                params,
                env_factory,
                tasks,
                os.path.join(out, f"{name}_{split}.jsonl"),
                greedy=False,
                samples_per_task=args.samples,
                seed=rollouts.stage_seed(cfg.seed, f"sampled_eval/{split}"),
                agent="target",
                iteration=None,
                temperature=args.temperature,
            )
            by_task: dict[str, list[float]] = {}
            for episode in episodes:
                by_task.setdefault(episode.task_id, []).append(float(episode.reward))
            rewards[name][split] = by_task
            graded[name][split] = graded_by_task(episodes)
    run.close()
    baseline = args.policies[0]
    summary = {
        "workdir": workdir,
        "seed": cfg.seed,
        "samples": args.samples,
        "temperature": args.temperature,
        "baseline": baseline,
        "policies": {
            name: {split: paired_summary(rewards[name][split], rewards[baseline][split]) for split in splits}
            for name in args.policies
        },
    }
    for name in args.policies:
        for split in splits:
            mine, base = graded[name][split], graded[baseline][split]
            if mine is not None and base is not None:
                summary["policies"][name][split][GRADED_SCORE] = paired_summary(mine, base)
    with open(os.path.join(out, "sampled_eval.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"seed {cfg.seed}, {args.samples} samples per task at T = {args.temperature}; baseline {baseline}")
    print("| policy | split | reward | success | per-task diff vs baseline (s.e.) | won / lost / tied |")
    print("|---|---|---:|---:|---:|---|")
    for name, per_split in summary["policies"].items():
        for split, s in per_split.items():
            for label, row in ((split, s), (f"{split}, graded score", s.get(GRADED_SCORE))):
                if row is None:
                    continue
                se = row["difference_std_error"]
                success = "" if label != split else f"{100 * row['success_rate']:.1f} %"
                print(
                    f"| {name} | {label} | {row['reward']:.3f} | {success} | {row['difference']:+.3f} "
                    f"({se or 0:.3f}) | {row['tasks_won']} / {row['tasks_lost']} / {row['tasks_tied']} |"
                )
    return summary
