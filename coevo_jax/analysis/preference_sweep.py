"""What each preference-phase setting did to the policy: one row per run and pair-trained method of a sweep.

    python -m coevo_jax.analysis preference_sweep WORKDIR [WORKDIR ...] [--baseline SFT]

A sweep is several workdirs of the same config but for the DPO settings (`--reuse_from` makes them share the
SFT stages), evaluated on the dev splits. For each run and method the row gives the setting (learning rate,
beta, updates of the last phase), the DPO accuracy and margin at the end of the last phase, the evaluation's
reward and success per split, the tasks whose greedy reward went up / down against the baseline policy's in
the same run, and the invalid actions per episode (well-formed actions the world refused, and replies with
no parsable action) beside the baseline's. A phase that does not change decisions shows 0 / 0.

A second table pools the runs of one setting (method, iterations, learning rate, β) over their seeds: the
mean reward difference against the baseline paired by seed with its 95 % Student-t interval, and the tasks
moved up / down summed over the seeds: whether a setting beats the baseline, not just in one seed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from coevo_jax.reporting.paired import decision_changes, mean_interval
from coevo_jax.reporting.results import (
    final_scores,
    load_results,
    results_path,
    sample_stat,
    sorted_iterations,
    split_label,
)
from coevo_jax.reporting.tables import interval_cell


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


def _mean(values: Sequence[float | None]) -> float | None:
    """Mean of the recorded values (`sample_stat`'s; None where none is)."""
    stat = sample_stat(values)
    return None if stat is None else stat["mean"]


def setting_summaries(rows: Sequence[Mapping]) -> list[dict]:
    """Rows of one setting (method, iterations, learning rate, β) pooled over their seeds, in first-seen order:
    the mean DPO accuracy and margin at the phase's end and, per split, the paired reward differences, their
    mean with 95 % t-interval, up / down summed, and the mean invalid actions per episode beside the
    baseline's."""
    groups: dict[tuple, list[Mapping]] = {}
    for row in rows:
        key = (row["method"], row["iterations"], row["learning_rate"], row["beta"])
        groups.setdefault(key, []).append(row)
    summaries = []
    for (method, iterations, lr, beta), members in groups.items():
        seeds = [row["seed"] for row in members]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"setting {method} lr {lr:g} beta {beta:g} has two runs of one seed: {seeds}")
        splits = {}
        for split in members[0]["splits"]:
            cells = [row["splits"][split] for row in members]
            deltas = [cell["delta_reward"] for cell in cells]
            changes = [cell["changes"] for cell in cells]
            splits[split] = {
                "deltas": deltas,
                "interval": None if None in deltas else mean_interval(deltas),
                "up": None if None in changes else sum(c["up"] for c in changes),
                "down": None if None in changes else sum(c["down"] for c in changes),
                "invalid": _mean([cell["invalid"][0] for cell in cells]),
                "baseline_invalid": _mean([cell["baseline_invalid"][0] for cell in cells]),
            }
        summaries.append(
            {
                "method": method,
                "iterations": iterations,
                "learning_rate": lr,
                "beta": beta,
                "seeds": seeds,
                "accuracy": _mean([row["accuracy"] for row in members]),
                "margin": _mean([row["margin"] for row in members]),
                "splits": splits,
            }
        )
    return summaries


def summary_markdown(runs: Sequence[Mapping], baseline: str = "SFT") -> str:
    """The sweep pooled per setting over seeds (`setting_summaries`) as one Markdown table."""
    rows = [row for results in runs for row in sweep_rows(results, baseline)]
    splits = list(runs[0]["splits"])
    headers = ["Method", "It.", "lr", "β", "Seeds", "DPO acc.", "Margin"]
    for split in splits:
        label = split_label(split)
        headers += [
            f"{label} Δ reward per seed",
            f"{label} Δ reward [95 % CI]",
            f"{label} up / down",
            f"{label} invalid",
        ]
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    for summary in setting_summaries(rows):
        cells = [
            summary["method"],
            str(summary["iterations"]),
            f"{summary['learning_rate']:.0e}",
            f"{summary['beta']:g}",
            ", ".join(str(seed) for seed in summary["seeds"]),
            _number(summary["accuracy"], ".2f"),
            _number(summary["margin"], ".2f"),
        ]
        for split in splits:
            cell = summary["splits"][split]
            cells += [
                ", ".join(_number(d, "+.1f") for d in cell["deltas"]),
                "—" if cell["interval"] is None else interval_cell(cell["interval"]),
                "—" if cell["up"] is None else f"{cell['up']} / {cell['down']}",
                f"{_number(cell['invalid'], '.2f')} ({_number(cell['baseline_invalid'], '.2f')})",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        f"Per setting, paired by seed against {baseline} in the same run: reward ×100 differences, their mean "
        "with its 95 % Student-t interval over the seeds, tasks up / down summed over the seeds; DPO acc., "
        f"margin and invalid actions per episode ({baseline}'s in brackets) are means over the seeds."
    )
    return note + "\n\n" + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coevo_jax.analysis preference_sweep", description=__doc__
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
            )
            + "\n"
            + summary_markdown(runs, args.baseline),
            end="",
        )
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
