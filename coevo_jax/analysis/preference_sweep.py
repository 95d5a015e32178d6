"""What each preference-phase setting did to the policy: one row per run and pair-trained method of a sweep.

    python -m coevo_jax.analysis.preference_sweep WORKDIR [WORKDIR ...] [--baseline SFT]

A sweep is several workdirs of the same config but for the DPO settings (`--reuse_from` makes them share the
SFT stages), evaluated on the dev splits. For each run and method the row gives the setting (learning rate,
beta, updates of the last phase), the DPO accuracy and margin at the end of the last phase, the evaluation's
reward and success per split, the tasks whose greedy reward went up / down against the baseline policy's in
the same run, and the invalid actions per episode (well-formed actions the world refused, and replies with
no parsable action) beside the baseline's. A phase that does not change decisions shows 0 / 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from coevo_jax.reporting.paired import decision_changes
from coevo_jax.reporting.results import (
    final_scores,
    load_results,
    results_path,
    sorted_iterations,
    split_label,
)


def _invalid(evals: Mapping, split: str) -> tuple[float | None, float | None]:
    """Invalid actions and invalid-format replies per episode in `split` (None where not recorded)."""
    record = evals.get(split) or {}
    episodes = max(int(record.get("episodes", 0)), 1)
    actions = (record.get("metrics") or {}).get("invalid_actions")
    formats = record.get("invalid_format")
    return actions, None if formats is None else formats / episodes


def sweep_rows(results: Mapping, baseline: str = "SFT") -> list[dict]:
    """One row per pair-trained method of a run: its last phase's setting and end metrics, and per split its
    evaluation, decision changes and invalid actions against `baseline`'s evaluation."""
    scores = final_scores(results)
    if baseline not in scores:
        raise ValueError(f"baseline {baseline!r} is not among the run's methods {sorted(scores)}")
    rows = []
    for method, record in results["methods"].items():
        iterations = sorted_iterations(record)
        train = (iterations[-1].get("train") or {}).get("target") if iterations else None
        if method == baseline or not train or "beta" not in train:
            continue
        row = {
            "method": method,
            "seed": results.get("seed"),
            "iterations": iterations[-1]["iteration"],
            "learning_rate": train["learning_rate"],
            "beta": train["beta"],
            "steps": train["steps"],
            "pairs": train.get("pairs"),
            "accuracy": train.get("final_reward_accuracy"),
            "margin": train.get("final_reward_margin"),
            "splits": {},
        }
        for split in results["splits"]:
            mine, base = scores[method].get(split) or {}, scores[baseline].get(split) or {}
            row["splits"][split] = {
                "reward": 100 * mine["avg_reward"] if "avg_reward" in mine else None,
                "success": 100 * mine["success_rate"] if "success_rate" in mine else None,
                "delta_reward": 100 * (mine["avg_reward"] - base["avg_reward"]) if mine and base else None,
                "changes": decision_changes(scores[method], scores[baseline], split),
                "invalid": _invalid(scores[method], split),
                "baseline_invalid": _invalid(scores[baseline], split),
            }
        rows.append(row)
    return rows


def _number(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def sweep_markdown(runs: Sequence[Mapping], names: Sequence[str], baseline: str = "SFT") -> str:
    """The sweep as one Markdown table, a row per run and method."""
    splits = list(runs[0]["splits"])
    headers = ["Run", "Method", "Seed", "It.", "lr", "β", "Updates", "DPO acc.", "Margin"]
    for split in splits:
        label = split_label(split)
        headers += [f"{label} reward / SR", f"{label} Δ reward", f"{label} up / down", f"{label} invalid"]
    lines = ["| " + " | ".join(headers) + " |", "|---|---|" + "---:|" * (len(headers) - 2)]
    for name, results in zip(names, runs, strict=True):
        for row in sweep_rows(results, baseline):
            cells = [
                name,
                row["method"],
                str(row["seed"]),
                str(row["iterations"]),
                f"{row['learning_rate']:.0e}",
                f"{row['beta']:g}",
                str(row["steps"]),
                _number(row["accuracy"], ".2f"),
                _number(row["margin"], ".2f"),
            ]
            for split in splits:
                cell = row["splits"][split]
                changes = cell["changes"]
                actions, _ = cell["invalid"]
                base_actions, _ = cell["baseline_invalid"]
                cells += [
                    f"{_number(cell['reward'], '.1f')} / {_number(cell['success'], '.0f')}",
                    _number(cell["delta_reward"], "+.1f"),
                    "—" if changes is None else f"{changes['up']} / {changes['down']}",
                    f"{_number(actions, '.2f')} ({_number(base_actions, '.2f')})",
                ]
            lines.append("| " + " | ".join(cells) + " |")
    note = (
        f"Δ and up / down against {baseline} in the same run; invalid: refused actions per episode "
        f"({baseline}'s in brackets); DPO acc. and margin at the end of the last phase."
    )
    return note + "\n\n" + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coevo_jax.analysis.preference_sweep", description=__doc__
    )
    parser.add_argument("workdirs", nargs="+", metavar="WORKDIR")
    parser.add_argument("--baseline", default="SFT", help="the method the others are compared with")
    args = parser.parse_args(argv)
    try:
        runs = [load_results(results_path(w)) for w in args.workdirs]
        print(
            sweep_markdown(
                runs,
                [Path(w).stem if Path(w).is_file() else Path(w).name for w in args.workdirs],
                args.baseline,
            ),
            end="",
        )
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
