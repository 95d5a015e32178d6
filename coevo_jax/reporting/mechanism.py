"""What the co-evolution had to work with, per method and iteration, and a warning when it had too little.

The paper's mechanism needs failures of both agents on the same tasks: eq. 6 pairs them for the failure
agent, and its near-success failures become the target's hard negatives. A run can explore too few tasks, or
sample too few episodes a task, for that to happen; these rows say so from results.json alone:

* each agent's failures on the explored train tasks and their mean reward (`explore`);
* the explored tasks both agents failed (`failed_by_both`; missing in runs from before it was recorded);
* the failure agent's D_fail pairs (`pairs.failure` where it trained on eq. 6; none for the positive agent,
  a frozen one, or a single-agent method) and the target's hard negatives (`pairs.target.hard_negatives`:
  pairs whose rejected side is a failure with reward at or above the builders' threshold).

`warnings` names every method whose failure agent trained on fewer D_fail pairs in a phase than the run's
`warn_failure_pairs_below` (30 where the run's config predates it), with the knobs that give more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coevo_jax.data.pair_pool import DEFAULT_HARD_NEGATIVE_THRESHOLD
from coevo_jax.reporting.results import as_runs, seeds_note, sorted_iterations
from coevo_jax.reporting.tables import mean_std_cell

DEFAULT_MIN_FAILURE_PAIRS = 30
HEADERS = (
    "Method",
    "It.",
    "Target failures",
    "Target failure reward",
    "Failure-agent failures",
    "Failure-agent failure reward",
    "Tasks both failed",
    "D_fail pairs",
    "Target pairs",
    "Target hard neg.",
)


def _trains_on_failure_pairs(title: str, iteration: Mapping) -> bool:
    """Whether the iteration's failure agent trained on D_fail (the positive agent trains on expert pairs)."""
    return "failure" in (iteration.get("pairs") or {}) and "positive" not in title.lower()


def mechanism_rows(results: Mapping) -> list[dict]:
    """Per method and iteration >= 1 whose target trained on pairs: the counts of the module docstring
    (None where the run has no such number: one agent, no D_fail phase, an older results file)."""
    rows = []
    for title, method in results["methods"].items():
        for it in sorted_iterations(method):
            pairs = it.get("pairs") or {}
            if it["iteration"] < 1 or "target" not in pairs:
                continue
            explore = it.get("explore") or {}
            target, failure = explore.get("target") or {}, explore.get("failure") or {}
            rows.append(
                {
                    "method": title,
                    "iteration": it["iteration"],
                    "target_failures": target.get("failures"),
                    "target_failure_reward": target.get("failure_avg_reward"),
                    "failure_failures": failure.get("failures"),
                    "failure_failure_reward": failure.get("failure_avg_reward"),
                    "failed_by_both": it.get("failed_by_both"),
                    "failure_pairs": pairs["failure"]["pairs"]
                    if _trains_on_failure_pairs(title, it)
                    else None,
                    "target_pairs": pairs["target"].get("pairs"),
                    "target_hard_negatives": pairs["target"].get("hard_negatives"),
                }
            )
    return rows


def min_failure_pairs(results: Mapping) -> int:
    """The run's warning threshold (`warn_failure_pairs_below`; the default for older results files)."""
    return int((results.get("config") or {}).get("warn_failure_pairs_below", DEFAULT_MIN_FAILURE_PAIRS))


def _knobs(results: Mapping) -> str:
    config = results.get("config") or {}
    explored = (results.get("counts") or {}).get("train_tasks", "?")
    samples = (config.get("rollout") or {}).get("samples_per_task", "?")
    return (
        f"More explored train tasks (env.explore_tasks; {explored} explored now) or more samples per task "
        f"(rollout.samples_per_task: {samples} now) give both agents more failures on the same tasks"
    )


def warnings(results: Mapping | Sequence[Mapping]) -> list[str]:
    """One line per method whose failure agent trained on fewer D_fail pairs than the threshold in some
    phase of some run, with every phase's count (per iteration, the runs in order) and the knobs; [] when
    none did."""
    runs = as_runs(results)
    counts: dict[str, dict[int, list[int]]] = {}
    low: dict[str, int] = {}
    for run in runs:
        limit = min_failure_pairs(run)
        for row in mechanism_rows(run):
            if row["failure_pairs"] is not None:
                counts.setdefault(row["method"], {}).setdefault(row["iteration"], []).append(
                    row["failure_pairs"]
                )
                low[row["method"]] = low.get(row["method"], 0) + (row["failure_pairs"] < limit)
    limits = sorted({min_failure_pairs(run) for run in runs})
    seeds = ", ".join(str(run.get("seed", "?")) for run in runs)
    lines = []
    for title, by_iteration in counts.items():
        if not low[title]:
            continue
        phases = sum(len(values) for values in by_iteration.values())
        listed = "; ".join(
            f"iteration {k}: {', '.join(map(str, v))}" for k, v in sorted(by_iteration.items())
        )
        lines.append(
            f"warning: {title}: the failure agent trained on fewer than {' / '.join(map(str, limits))} "
            f"failure–failure pairs (D_fail) in {low[title]} of {phases} phases ({listed}"
            f"{f'; seeds {seeds}' if len(runs) > 1 else ''}): the co-evolution had little to learn from. "
            f"{_knobs(runs[0])}."
        )
    return lines


NOTE = (
    "Failures on the explored train tasks and their mean reward ×100, per agent; tasks both agents failed; "
    "the failure agent's D_fail pairs (eq. 6) where it trained on them; the target's pairs and its hard "
    f"negatives (rejected side a failure with reward ≥ {DEFAULT_HARD_NEGATIVE_THRESHOLD})."
)


def mechanism_cells(results: Mapping | Sequence[Mapping]) -> list[list[str]]:
    """The rows' cells under `HEADERS`, in method and iteration order: counts and rewards as mean ± sample
    std over the runs given (the number itself for one run), MISSING where no run has the value."""
    per_key: dict[tuple[str, int], list[dict]] = {}
    for run in as_runs(results):
        for row in mechanism_rows(run):
            per_key.setdefault((row["method"], row["iteration"]), []).append(row)
    cells = []
    for (title, iteration), rows in per_key.items():
        column = lambda key, rows=rows: [row[key] for row in rows]  # noqa: E731
        cells.append(
            [
                title,
                str(iteration),
                mean_std_cell(column("target_failures"), 0),
                mean_std_cell(column("target_failure_reward"), scale=100.0),
                mean_std_cell(column("failure_failures"), 0),
                mean_std_cell(column("failure_failure_reward"), scale=100.0),
                mean_std_cell(column("failed_by_both"), 0),
                mean_std_cell(column("failure_pairs"), 0),
                mean_std_cell(column("target_pairs"), 0),
                mean_std_cell(column("target_hard_negatives"), 0),
            ]
        )
    return cells


def mechanism_markdown(results: Mapping | Sequence[Mapping], *, with_warnings: bool = True) -> str:
    """`mechanism_cells` as a Markdown table under a title and `NOTE`, then (`with_warnings`) the warnings;
    "" when no method trained a target on pairs."""
    runs = as_runs(results)
    cells = mechanism_cells(runs)
    if not cells:
        return ""
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|" + "---:|" * (len(HEADERS) - 1)]
    lines += ["| " + " | ".join([row[0].replace("|", "\\|"), *row[1:]]) + " |" for row in cells]
    title = f"### What the co-evolution had to work with (`{runs[0].get('env', '?')}`{seeds_note(runs)})"
    found = warnings(runs) if with_warnings else []
    tail = ("\n" + "\n\n".join(found) + "\n") if found else ""
    return f"{title}\n\n{NOTE}\n\n" + "\n".join(lines) + "\n" + tail
