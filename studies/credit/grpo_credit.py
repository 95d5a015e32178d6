"""GRPO's credit variants side by side: where each found a gradient, and what it did to the policy.

    python -m studies.credit.grpo_credit WORKDIR [WORKDIR ...] [--baseline episode]

The workdirs are runs of `configs/grpo_credit_study.py:<variant>` (or `bfcl_credit_study.py`), any seeds; the
variant is read from each run's config (`grpo.advantage`, `grpo.dead_groups`). Per variant, over its seeds:
- the share of sampled episodes that carried a gradient: a nonzero advantage on some token (the job's
  `signal_episodes`), and, with dead-group pairs, the episodes on a side of one (recomputed from each step's
  saved episodes with the job's own `dead_groups.dead_group_pairs`, as the step built them);
- dead groups per step (every variant's: a task whose K episodes all failed with one reward) and the
  dead-group pairs trained per step; the sampled reward per step (mean over steps);
- greedy evaluation after the last iteration, reward and success per split, against the run's SFT policy;
- where the run has one (`python -m coevo_jax.analysis.sampled_eval --workdir W --policies sft_target
  grpo_it<N>_target`), the sampled evaluation of the last iteration's policy and of the SFT policy, with the
  per-task difference between them.
Then, paired by seed against `--baseline`: each seed's difference in final greedy reward per split, the mean's
95 % t-interval, and the tasks whose reward moved up / down.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence

from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.experiment import dead_groups, rollouts
from coevo_jax.experiment.grpo import rollout_file
from coevo_jax.experiment.run_data import read_run
from coevo_jax.experiment.stages import SFT_TARGET
from coevo_jax.experiment.store import read_json
from coevo_jax.reporting.paired import decision_changes, mean_interval
from coevo_jax.reporting.results import load_results, sorted_iterations
from coevo_jax.reporting.tables import interval_cell, mean_std_cell

VARIANT_NAMES = {
    ("episode", "none"): "episode",
    ("gigpo", "none"): "gigpo",
    ("episode", "pairs"): "pairs",
    ("gigpo", "pairs"): "both",
}
METHOD = "GRPO"


def dead_pairs(trajectories, max_pairs: int) -> dead_groups.DeadGroupPairs:
    """A step's dead groups and dead-group pairs, made from its saved episodes as the job's step made them."""
    usable = [t for t in trajectories if rollouts.is_usable(t)]
    return dead_groups.dead_group_pairs(dead_groups.task_groups(usable), max_pairs=max_pairs)


def run_summary(workdir: str) -> dict:
    """One credit run: its variant and seed, per-step gradient counts, and final greedy evaluations."""
    config, _ = read_run(workdir)
    grpo = config.grpo
    history = read_json(os.path.join(workdir, "grpo", "history.json"))
    if not history:
        raise ValueError(f"{workdir}: no GRPO step in grpo/history.json")
    steps = []
    for record in history:
        row = {
            "episodes": record["episodes"],
            "signal": record["signal_episodes"],
            "reward": record["reward"],
            "dead_pairs": 0,
            "dead_pair_episodes": 0,
        }
        path = os.path.join(workdir, "rollouts", rollout_file("grpo", record["step"]))
        made = dead_pairs(read_trajectories(path), grpo.dead_group_max_pairs)
        row["dead_groups"] = made.dead_groups  # every variant's dead groups; only "pairs" trains on them
        if grpo.dead_groups == "pairs":
            row["dead_pairs"] = len(made.pairs)
            row["dead_pair_episodes"] = len({t.traj_id for p in made.pairs for t in (p.chosen, p.rejected)})
        steps.append(row)
    results = load_results(os.path.join(workdir, "results.json"))
    grpo_iterations = sorted_iterations(results["methods"][METHOD])
    sft = results["methods"]["SFT"]["iterations"][0]["eval"]
    iteration = grpo_iterations[-1]["iteration"]
    return {
        "workdir": workdir,
        "variant": VARIANT_NAMES[(grpo.advantage, grpo.dead_groups)],
        "seed": config.seed,
        "steps": steps,
        "iteration": iteration,
        "eval": grpo_iterations[-1]["eval"],
        "sft_eval": sft,
        "sampled": sampled_summary(workdir, f"grpo_it{iteration}_target"),
        "splits": list(results["splits"]),
    }


def sampled_summary(workdir: str, policy: str) -> dict | None:
    """The run's sampled evaluation of `policy` beside the SFT policy's (`analysis.sampled_eval`), if made."""
    path = os.path.join(workdir, "sampled_eval", "sampled_eval.json")
    if not os.path.exists(path):
        return None
    data = read_json(path)
    policies = data.get("policies", {})
    if data.get("baseline") != SFT_TARGET or policy not in policies:
        return None
    return {
        "samples": data["samples"],
        "temperature": data["temperature"],
        "policy": policies[policy],
        "sft": policies[SFT_TARGET],
    }


def _share(steps: Sequence[Mapping], key: str) -> float:
    return 100.0 * sum(s[key] for s in steps) / max(sum(s["episodes"] for s in steps), 1)


def _by_variant(runs: Sequence[Mapping]) -> list[tuple[str, list[Mapping]]]:
    """The runs grouped by variant, variants in `VARIANT_NAMES` order."""
    groups = defaultdict(list)
    for run in runs:
        groups[run["variant"]].append(run)
    return [(variant, groups[variant]) for variant in VARIANT_NAMES.values() if variant in groups]


def variant_table(runs: Sequence[Mapping]) -> str:
    """Per variant, mean ± std over its seeds."""
    splits = runs[0]["splits"]
    head = ["variant", "seeds", "episodes with an advantage (%)", "episodes in dead-group pairs (%)"]
    head += ["dead groups / step", "dead-group pairs / step", "sampled reward / step"]
    head += [f"{s} reward / SR (SFT)" for s in splits]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for variant, group in _by_variant(runs):
        cells = [variant, ", ".join(str(r["seed"]) for r in group)]
        cells.append(mean_std_cell([_share(r["steps"], "signal") for r in group]))
        cells.append(mean_std_cell([_share(r["steps"], "dead_pair_episodes") for r in group]))
        for key in ("dead_groups", "dead_pairs"):
            cells.append(mean_std_cell([statistics.fmean(s[key] for s in r["steps"]) for r in group]))
        cells.append(mean_std_cell([100 * statistics.fmean(s["reward"] for s in r["steps"]) for r in group]))
        for split in splits:
            reward = mean_std_cell([100 * r["eval"][split]["avg_reward"] for r in group])
            success = mean_std_cell([100 * r["eval"][split]["success_rate"] for r in group], 0)
            sft = mean_std_cell([100 * r["sft_eval"][split]["avg_reward"] for r in group])
            cells.append(f"{reward} / {success} ({sft})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sampled_table(runs: Sequence[Mapping]) -> str:
    """Per variant, over its seeds with a sampled evaluation: the last policy's sampled reward and success
    per split, the SFT policy's, and the mean per-task difference between them."""
    sampled = [r for r in runs if r["sampled"] is not None]
    if not sampled:
        return ""
    splits = sampled[0]["splits"]
    head = ["variant", "seeds", "samples × T"]
    head += [f"{s}: sampled reward / SR (SFT)" for s in splits] + [f"{s}: Δ vs SFT" for s in splits]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for variant, group in _by_variant(sampled):
        draws = sorted({f"{r['sampled']['samples']} × {r['sampled']['temperature']:g}" for r in group})
        cells = [variant, ", ".join(str(r["seed"]) for r in group), ", ".join(draws)]
        for split in splits:
            reward = mean_std_cell([100 * r["sampled"]["policy"][split]["reward"] for r in group])
            success = mean_std_cell([100 * r["sampled"]["policy"][split]["success_rate"] for r in group], 0)
            sft = mean_std_cell([100 * r["sampled"]["sft"][split]["reward"] for r in group])
            cells.append(f"{reward} / {success} ({sft})")
        for split in splits:
            cells.append(mean_std_cell([100 * r["sampled"]["policy"][split]["difference"] for r in group]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table(runs: Sequence[Mapping], baseline: str) -> str:
    """Each variant against `baseline` on the same seeds: final greedy reward differences per split, and the
    sampled evaluations' where both runs of a seed have one (the same tasks and sampling seeds)."""
    base = {r["seed"]: r for r in runs if r["variant"] == baseline}
    if not base:
        raise ValueError(f"no run of the baseline variant {baseline!r}")
    head = ["contrast", "split", "Δ reward per seed", "Δ reward [95 % CI]", "tasks up / down per seed"]
    head += ["sampled Δ per seed", "sampled Δ [95 % CI]"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for variant in VARIANT_NAMES.values():
        mine = sorted(
            (r for r in runs if r["variant"] == variant and r["seed"] in base), key=lambda r: r["seed"]
        )
        if variant == baseline or not mine:
            continue
        for split in mine[0]["splits"]:
            deltas = [
                100 * (r["eval"][split]["avg_reward"] - base[r["seed"]]["eval"][split]["avg_reward"])
                for r in mine
            ]
            stat = interval_cell(mean_interval(deltas))
            moved = [decision_changes(r["eval"], base[r["seed"]]["eval"], split) for r in mine]
            moves = ", ".join("—" if m is None else f"{m['up']}/{m['down']}" for m in moved)
            per_seed = ", ".join(f"{d:+.1f}" for d in deltas)
            sampled = [
                100
                * (
                    r["sampled"]["policy"][split]["reward"]
                    - base[r["seed"]]["sampled"]["policy"][split]["reward"]
                )
                for r in mine
                if r["sampled"] is not None and base[r["seed"]]["sampled"] is not None
            ]
            sampled_seeds = ", ".join(f"{d:+.1f}" for d in sampled) or "—"
            sampled_stat = interval_cell(mean_interval(sampled)) if sampled else "—"
            lines.append(
                f"| {variant} − {baseline} | {split} | {per_seed} | {stat} | {moves} | {sampled_seeds} | "
                f"{sampled_stat} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m studies.credit.grpo_credit", description=__doc__.split("\n")[0]
    )
    parser.add_argument("workdirs", nargs="+", help="credit-study runs (any variants and seeds)")
    parser.add_argument("--baseline", default="episode", choices=list(VARIANT_NAMES.values()))
    args = parser.parse_args(argv)
    try:
        runs = [run_summary(workdir) for workdir in args.workdirs]
        print(variant_table(runs))
        sampled = sampled_table(runs)
        if sampled:
            print()
            print(sampled)
        if any(r["variant"] == args.baseline for r in runs) and len({r["variant"] for r in runs}) > 1:
            print()
            print(paired_table(runs, args.baseline))
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
