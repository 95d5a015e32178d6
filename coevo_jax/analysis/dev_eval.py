"""A finished run's saved policies played greedily on held-out train tasks: a check of its test table off the test splits.

    python -m coevo_jax.analysis dev_eval --workdir WORKDIR --dev 8 \
        [--policies sft_target rft_it1_target eto_it1_target coevo_it1_target]

The dev tasks are the train-split tasks that follow the run's expert tasks: the run never trained on them
(SFT took the experts' tasks, exploration the first `env.explore_tasks` of those), and they are no test task,
so a comparison here may choose a config without touching the test splits. Every policy plays the same tasks
greedily, as the main job evaluates. Episodes go to `<workdir>/dev_eval/<policy>.jsonl` (a rerun resumes
them); the summary to `<workdir>/dev_eval/dev_eval.json` and stdout.
"""

from __future__ import annotations

import argparse
import json
import os

from coevo_jax.experiment import rollouts
from coevo_jax.experiment.finished_run import open_run


def dev_tasks(train_tasks: list[str], expert_tasks: list[str], count: int) -> list[str]:
    """The first `count` train tasks after the last expert task, in split order (none of them an expert's)."""
    last = max(train_tasks.index(task) for task in expert_tasks)
    tasks = train_tasks[last + 1 : last + 1 + count]
    if len(tasks) < count:
        raise ValueError(f"only {len(tasks)} train tasks follow the experts' tasks; asked for {count}")
    return tasks


def main(argv: list[str] | None = None) -> dict:
    """Plays every policy on the dev tasks; returns the summary it writes."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument(
        "--policies",
        nargs="+",
        default=["sft_target", "rft_it1_target", "eto_it1_target", "coevo_it1_target"],
    )
    parser.add_argument("--dev", type=int, default=8, help="held-out train-split tasks played greedily")
    args = parser.parse_args(argv)

    run = open_run(args.workdir)
    env = run.make_env()
    train_tasks = env.tasks(run.config.env.train_split)
    env.close()
    tasks = dev_tasks(train_tasks, [t.task_id for t in run.experts], args.dev)
    out_dir = os.path.join(run.workdir, "dev_eval")
    os.makedirs(out_dir, exist_ok=True)
    summary = {"dev_tasks": tasks, "policies": {}}
    for name in args.policies:
        episodes = rollouts.play(
            run.setup,
            run.policy(name),
            run.make_env,
            tasks,
            os.path.join(out_dir, f"{name}.jsonl"),
            greedy=True,
            samples_per_task=1,
            seed=0,
            agent="target",
            iteration=None,
        )
        result = rollouts.summarize(episodes)
        result["rewards"] = {e.task_id: e.reward for e in episodes}
        summary["policies"][name] = result
        print(
            f"{name:20s} avg reward {result['avg_reward']:.3f} success {result['success_rate']:.2f}",
            flush=True,
        )
        with open(os.path.join(out_dir, "dev_eval.json"), "w") as f:
            json.dump(summary, f, indent=1)
    run.close()
    return summary
