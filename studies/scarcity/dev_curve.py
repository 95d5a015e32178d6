"""The scarcity study's dev curve: what each expert count K's SFT base scores and leaves the co-evolution.

    python -m studies.scarcity.dev_curve studies/scarcity/dev/*.json

Each file is the `results.json` of one `configs/scarcity_study.py:K,dev` run (one co-evolution iteration
on the dev splits, every train task with an expert explored by each agent). One row per run: K, the
exploration temperature and episodes per task and agent, the SFT epochs, the SFT target's dev scores, then iteration 1's exploration
(failures per agent and their mean reward, tasks both failed), the pairs it made (D_fail for the failure
agent; the target's pairs and hard negatives) and the co-evolved target's dev reward against SFT's.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from coevo_jax.reporting.results import load_results

HEADER = (
    "| K | T | samples | SFT epochs | SFT dev | SFT dev_unseen | target failures | failure-agent failures | both failed "
    "| D_fail pairs | target pairs (hard neg.) | CoEvolving − SFT, dev / dev_unseen |"
)


def _score(evaluation: dict, split: str) -> str:
    return f"{100 * evaluation[split]['avg_reward']:.1f} / {100 * evaluation[split]['success_rate']:.0f} %"


def _failures(explore: dict) -> str:
    return (
        f"{explore['failures']} ({100 * explore['failure_avg_reward']:.1f})" if explore["failures"] else "0"
    )


def dev_curve_row(results: dict) -> str:
    """One run's row of the table (see the module docstring)."""
    config = results["config"]
    sft = results["methods"]["SFT"]["iterations"][0]["eval"]
    coevo = results["methods"]["CoEvolving"]["iterations"][1]
    explore, pairs = coevo["explore"], coevo["pairs"]
    moved = " / ".join(
        f"{100 * (coevo['eval'][s]['avg_reward'] - sft[s]['avg_reward']):+.1f}" for s in ("dev", "dev_unseen")
    )
    target_pairs = f"{pairs['target']['pairs']} ({pairs['target']['hard_negatives']})"
    cells = [
        str(config["env"]["expert_tasks"]),
        f"{config['rollout']['temperature']:g}",
        str(config["rollout"]["samples_per_task"]),
        str(config["sft"]["epochs"]),
        _score(sft, "dev"),
        _score(sft, "dev_unseen"),
        _failures(explore["target"]),
        _failures(explore["failure"]),
        str(coevo["failed_by_both"]),
        str(pairs.get("failure", {}).get("pairs", 0)),
        target_pairs,
        moved,
    ]
    return "| " + " | ".join(cells) + " |"


def dev_curve_rows(runs: Sequence[dict]) -> list[str]:
    """Rows by K, then temperature, then samples per task."""
    key = lambda r: (  # noqa: E731
        r["config"]["env"]["expert_tasks"],
        r["config"]["rollout"]["temperature"],
        r["config"]["rollout"]["samples_per_task"],
    )
    return [dev_curve_row(r) for r in sorted(runs, key=key)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="+", help="results.json files of scarcity_study.py:K,dev runs")
    args = parser.parse_args(argv)
    runs = [load_results(path) for path in args.results]
    print(HEADER)
    print("|" + "---:|" * HEADER.count(" | ") + "---:|")
    for row in dev_curve_rows(runs):
        print(row)


if __name__ == "__main__":
    main()
