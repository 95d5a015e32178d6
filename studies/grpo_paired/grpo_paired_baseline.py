"""GRPO's per-step reward against the SFT policy's on the same tasks, with the same sampling seeds.

A GRPO step's sampled reward moves with the tasks it drew as much as with the policy: a rising curve alone
does not say the policy improved. This replays every GRPO step of a finished run with the SFT target
policy (the run's KL reference) on that step's tasks, K episodes each, at `grpo.temperature` and with the
step's own sampling seed (so step 1, which samples the SFT policy itself, must come out identical: checked),
then compares the two step by step. It also reports each step's mean sampled-token entropy estimate
(the mean of -log p over the sampled reply tokens, at the sampling temperature) for both policies: a policy
that only grows more certain shows falling entropy with no paired reward gain.

    python -m studies.grpo_paired.grpo_paired_baseline --workdir WORKDIR [--method grpo] [--out DIR]

Writes `grpo_paired.json` and `grpo_paired.png` under `--out` (default: the workdir); the SFT policy's
episodes go to `<workdir>/paired_baseline/<method>_step<n>.jsonl` (a rerun resumes them).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

import numpy as np

from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.experiment import grpo, rollouts
from coevo_jax.experiment.finished_run import open_run
from coevo_jax.experiment.stages import SFT_TARGET
from coevo_jax.experiment.store import read_json
from coevo_jax.reporting.figures import STEP_WINDOW, moving_average


def step_entropy(logprobs: Sequence[Sequence[float]]) -> float | None:
    """Mean -log p over all the sampled tokens of a step's episodes (None when there are none)."""
    flat = [-float(x) for episode in logprobs for x in episode]
    return float(np.mean(flat)) if flat else None


def paired_stats(trained: Sequence[dict], baseline: Sequence[dict]) -> dict:
    """Step-by-step comparison of two policies' episodes on the same tasks.

    `trained` and `baseline`: one dict per step, {"rewards": {task_id: [reward, ...]}, "logprobs": [[...]]}.
    Returns per-step mean rewards, their differences, entropies, and over the steps the mean difference with
    its standard error, the steps won / lost / tied, and the mean per-task difference (each task's mean
    reward under the trained policy minus the baseline's, averaged over all (step, task) pairs)."""
    if len(trained) != len(baseline):
        raise ValueError(f"{len(trained)} trained steps against {len(baseline)} baseline steps")
    rows, task_diffs = [], []
    for step, (ours, theirs) in enumerate(zip(trained, baseline, strict=True), start=1):
        if set(ours["rewards"]) != set(theirs["rewards"]):
            raise ValueError(f"step {step}: the two policies played different tasks")
        mean = lambda rewards: float(np.mean([r for rs in rewards.values() for r in rs]))  # noqa: E731
        task_diffs += [
            float(np.mean(ours["rewards"][t]) - np.mean(theirs["rewards"][t]))
            for t in sorted(ours["rewards"])
        ]
        rows.append(
            {
                "step": step,
                "reward": mean(ours["rewards"]),
                "baseline_reward": mean(theirs["rewards"]),
                "entropy": step_entropy(ours["logprobs"]),
                "baseline_entropy": step_entropy(theirs["logprobs"]),
            }
        )
        rows[-1]["difference"] = rows[-1]["reward"] - rows[-1]["baseline_reward"]
    diffs = np.asarray([r["difference"] for r in rows], np.float64)
    return {
        "steps": rows,
        "mean_difference": float(diffs.mean()) if diffs.size else None,
        "difference_std_error": float(diffs.std(ddof=1) / np.sqrt(diffs.size)) if diffs.size > 1 else None,
        "steps_won": int(np.sum(diffs > 0)),
        "steps_lost": int(np.sum(diffs < 0)),
        "steps_tied": int(np.sum(diffs == 0)),
        "mean_task_difference": float(np.mean(task_diffs)) if task_diffs else None,
    }


def _step_view(trajectories) -> dict:
    rewards: dict[str, list[float]] = {}
    for t in trajectories:
        rewards.setdefault(t.task_id, []).append(float(t.reward))
    return {"rewards": rewards, "logprobs": [t.tokens.logprobs for t in trajectories if t.tokens is not None]}


def _figure(stats: dict, title: str, path: str) -> None:
    from matplotlib.figure import Figure

    steps = [r["step"] for r in stats["steps"]]
    figure = Figure(figsize=(11.0, 4.0), layout="constrained")
    left, right = figure.subplots(1, 2)
    for key, label, color in (
        ("reward", "GRPO", "C0"),
        ("baseline_reward", "SFT policy, same tasks and seeds", "C1"),
    ):
        values = [100.0 * r[key] for r in stats["steps"]]
        left.plot(steps, values, color=color, alpha=0.35, linewidth=1, marker=".")
        left.plot(
            steps,
            moving_average(values, STEP_WINDOW),
            color=color,
            linewidth=2.2,
            label=f"{label} ({STEP_WINDOW}-step mean)",
        )
    left.set_xlabel("GRPO step")
    left.set_ylabel("sampled episodes' average reward (×100)")
    left.legend(fontsize="small")
    left.grid(alpha=0.3)
    for key, label, color in (("entropy", "GRPO", "C0"), ("baseline_entropy", "SFT policy", "C1")):
        right.plot(steps, [r[key] for r in stats["steps"]], color=color, marker=".", label=label)
    right.set_xlabel("GRPO step")
    right.set_ylabel("mean -log p of the sampled reply tokens (nats)")
    right.legend(fontsize="small")
    right.grid(alpha=0.3)
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)
    figure.suptitle(title)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    """Replays every GRPO step with the SFT policy; returns the comparison it writes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--method", default="grpo", help="the GRPO run's name: grpo, or a CoEvolve method")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    workdir, out = os.path.abspath(args.workdir), os.path.abspath(args.out or args.workdir)

    run = open_run(workdir)
    cfg, setup, env_factory = run.config, run.setup, run.make_env
    history = read_json(os.path.join(workdir, args.method, "history.json"))
    params = run.policy(SFT_TARGET)
    os.makedirs(os.path.join(workdir, "paired_baseline"), exist_ok=True)
    trained, baseline = [], []
    for record in history:
        step = int(record["step"])
        ours = read_trajectories(run.store.path("rollouts", grpo.rollout_file(args.method, step)))
        tasks = sorted({t.task_id for t in ours})
        theirs = rollouts.play(
            setup,
            params,
            env_factory,
            tasks,
            os.path.join(workdir, "paired_baseline", f"{args.method}_step{step}.jsonl"),
            greedy=False,
            samples_per_task=cfg.grpo.samples_per_task,
            seed=rollouts.stage_seed(cfg.seed, f"grpo/step{step}"),
            agent="target",
            iteration=None,
            temperature=cfg.grpo.temperature,
        )
        if step == 1:  # token ids and rewards exactly; log-probs to their last bits (batch composition)
            key = lambda t: (t.task_id, t.traj_id.rsplit("/", 1)[-1])  # noqa: E731
            pairs = list(zip(sorted(ours, key=key), sorted(theirs, key=key), strict=True))
            same = [a.tokens.ids == b.tokens.ids and a.reward == b.reward for a, b in pairs]
            gap = max(
                float(np.max(np.abs(np.subtract(a.tokens.logprobs, b.tokens.logprobs)), initial=0.0))
                for a, b in pairs
                if a.tokens.ids == b.tokens.ids
            )
            print(
                f"step 1 (GRPO sampled the SFT policy itself): {sum(same)} of {len(same)} episodes with the same "
                f"tokens and reward; sampled log-probs within {gap:.1e}"
            )
        trained.append(_step_view(ours))
        baseline.append(_step_view(theirs))
    run.close()
    stats = paired_stats(trained, baseline)
    stats.update(workdir=workdir, method=args.method, temperature=cfg.grpo.temperature)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "grpo_paired.json"), "w") as f:
        json.dump(stats, f, indent=1)
    title = f"GRPO vs the SFT policy on each step's tasks ({cfg.env.name}, seed {cfg.seed})"
    _figure(stats, title, os.path.join(out, "grpo_paired.png"))
    print("| step | GRPO reward | SFT reward | difference | GRPO entropy | SFT entropy |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in stats["steps"]:
        print(
            f"| {r['step']} | {r['reward']:.3f} | {r['baseline_reward']:.3f} | {r['difference']:+.3f} | "
            f"{r['entropy']:.3f} | {r['baseline_entropy']:.3f} |"
        )
    print(
        f"mean difference {stats['mean_difference']:+.4f} ± {stats['difference_std_error'] or 0:.4f} (s.e.); "
        f"steps won / lost / tied {stats['steps_won']} / {stats['steps_lost']} / {stats['steps_tied']}"
    )
    return stats


if __name__ == "__main__":
    main()
