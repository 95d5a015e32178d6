"""The paper's Table 1 and the counts behind it, as Markdown, from one or several runs' results.

* `table_markdown`: Table 1, one row per method: average reward x100 per split, success rate (%) per
  split and "Avg." (mean of the reward columns), all from the method's last iteration.
* `table_markdown_mean_std`: the same table as "mean ± std" over several seeds (`results.aggregate_runs`).
* `details_markdown`: per method, iteration and agent, the counts behind the table (failures on the tasks
  SFT failed, pairs by kind, hard negatives, DPO accuracy and margin, context cut-offs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from coevo_jax.experiment.results import (
    agent_label,
    aggregate_runs,
    as_runs,
    final_scores,
    sample_stat,
    score_row,
    seeds_note,
    sorted_iterations,
    split_label,
)

MISSING = "—"
LEGEND = "Average reward ×100 per split, then success rate (SR, %); Avg. = mean of the reward columns."


def _columns(splits: Sequence[str]) -> list[tuple[str, Callable[[dict], object]]]:
    """(header, cell getter) in Table-1 order: rewards per split, success rates per split, Avg."""
    columns = [(split_label(s), lambda row, s=s: row["reward"][s]) for s in splits]
    columns += [(f"{split_label(s)} SR (%)", lambda row, s=s: row["success"][s]) for s in splits]
    return [*columns, ("Avg.", lambda row: row["avg"])]


def _markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def _escape(name: str) -> str:
    return name.replace("|", "\\|")


def _format_value(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def table_markdown(results: Mapping) -> str:
    """Table 1 for one run: a title naming the env, a legend line, then one row per method."""
    splits = results["splits"]
    columns = _columns(splits)
    rows = []
    for name, evals in final_scores(results).items():
        row = score_row(evals, splits)
        rows.append([_escape(name), *(_format_value(get(row)) for _, get in columns)])
    title = f"### Results on `{results.get('env', '?')}` (seed {results.get('seed', '?')})"
    table = _markdown(["Method", *(header for header, _ in columns)], rows)
    return f"{title}\n\n{LEGEND}\n\n{table}\n"


def _format_stat(stat: dict | None, digits: int = 1) -> str:
    """ "mean ± std" (just the mean for one value), MISSING for none."""
    if stat is None:
        return MISSING
    if stat["std"] is None:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def table_markdown_mean_std(runs: Sequence[Mapping], names: Sequence[str] | None = None) -> str:
    """Table 1 over several seeds: each cell "mean ± std" (sample std; just the mean with one run)."""
    aggregate = aggregate_runs(runs, names)
    columns = _columns(aggregate["splits"])
    rows = [
        [_escape(name), *(_format_stat(get(row)) for _, get in columns)]
        for name, row in aggregate["methods"].items()
    ]
    seeds = ", ".join(str(seed) for seed in aggregate["seeds"])
    count = len(aggregate["seeds"])
    title = f"### Results on `{aggregate['env']}`, mean ± std over {count} seed{'s' * (count != 1)}"
    note = f"Seeds: {seeds} ({count} run{'s' * (count != 1)}; std is the sample std, ddof=1)."
    table = _markdown(["Method", *(header for header, _ in columns)], rows)
    return f"{title}\n\n{note} {LEGEND}\n\n{table}\n"


DETAIL_HEADERS = (
    "Method",
    "It.",
    "Agent",
    "Failures*",
    "Failure reward*",
    "Pairs",
    "Hard neg.",
    "Pairs by kind",
    "DPO acc.",
    "DPO margin",
    "Eval cut-offs",
)


def details_markdown(results: Mapping | Sequence[Mapping]) -> str:
    """Per method, iteration and agent, the counts behind Table 1 (mean ± std over the runs given).

    Failures* and their mean reward (x100) are on the train tasks the SFT policy failed (Figure 2's scope);
    pairs, hard negatives (rejected reward >= the threshold) and pairs by kind are the agent's DPO dataset;
    DPO acc./margin are the last logged step's reward accuracy and margin; eval cut-offs are the target's
    evaluation episodes (all splits) that ended at the context limit.
    """
    runs = as_runs(results)
    rows = []
    for name in runs[0]["methods"]:
        iterations = sorted(
            {it["iteration"] for run in runs for it in sorted_iterations(run["methods"].get(name) or {})}
            - {0}
        )
        for k in iterations:
            records = [
                it
                for run in runs
                for it in sorted_iterations(run["methods"].get(name) or {})
                if it["iteration"] == k
            ]
            agents = sorted(
                {a for r in records for a in (r.get("explore") or {})},
                key=lambda a: (a != "target", a),
            )
            for agent in agents:
                explored = [
                    (r["explore"][agent] or {}).get("on_sft_failed_tasks", r["explore"][agent])
                    for r in records
                    if (r.get("explore") or {}).get(agent)
                ]
                pairs = [(r.get("pairs") or {}).get(agent) for r in records]
                pairs = [p for p in pairs if p]
                train = [(r.get("train") or {}).get(agent) for r in records]
                train = [t for t in train if t]
                kinds = sorted({kind for p in pairs for kind in p.get("by_kind", {})})
                by_kind = ", ".join(
                    f"{kind} {np.mean([p.get('by_kind', {}).get(kind, 0) for p in pairs]):.0f}"
                    for kind in kinds
                )
                cutoffs = [
                    sum(
                        (e.get("terminations") or {}).get("context_limit", 0)
                        for e in (r.get("eval") or {}).values()
                    )
                    for r in records
                ]

                def present(items, key, scale=1.0):
                    return [scale * item[key] for item in items if item.get(key) is not None]

                rows.append(
                    [
                        _escape(name),
                        str(k),
                        agent_label(name, agent).removeprefix(f"{name} "),
                        _format_stat(sample_stat(present(explored, "failures"))),
                        _format_stat(sample_stat(present(explored, "failure_avg_reward", 100.0))),
                        _format_stat(sample_stat(present(pairs, "pairs"))),
                        _format_stat(sample_stat(present(pairs, "hard_negatives"))),
                        by_kind or MISSING,
                        _format_stat(sample_stat(present(train, "final_reward_accuracy")), 2),
                        _format_stat(sample_stat(present(train, "final_reward_margin")), 2),
                        _format_stat(sample_stat(cutoffs)) if agent == "target" else MISSING,
                    ]
                )
    title = f"### What each iteration explored and trained on (`{runs[0].get('env', '?')}`{seeds_note(runs)})"
    return f"{title}\n\n{_markdown(DETAIL_HEADERS, rows)}\n"
