"""The paper's Table 1 and the counts behind it, as Markdown, from one or several runs' results.

* `table_markdown`: Table 1, one row per method: average reward x100 per split, success rate (%) per
  split and "Avg." (mean of the reward columns), all from the method's last iteration.
* `table_markdown_mean_std`: the same table as "mean ± std" over several seeds (`results.aggregate_runs`).
* `table_markdown_paired`: each method minus a baseline method in the same run, mean ± std over seeds
  (`results.paired_differences`).
* `table_markdown_contrasts`: the study's contrasts (ETO − SFT, CoEvolving − ETO, ...) per seed with the
  mean's 95 % t-interval and the tasks whose greedy reward went up / down (`paired.paired_contrasts`).
* `details_markdown`: per method, iteration and agent, the counts behind the table (failures on the tasks
  SFT failed, pairs by kind, hard negatives, DPO accuracy and margin, context cut-offs); for GRPO-trained
  methods their steps (sampled reward, all-equal groups, KL, clipping) and CoEvolve rounds (signals by kind,
  explored, verified, pool size) per iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from coevo_jax.reporting.paired import DEFAULT_CONTRASTS, failure_contrasts, paired_contrasts
from coevo_jax.reporting.results import (
    agent_label,
    aggregate_runs,
    as_runs,
    final_scores,
    paired_differences,
    sample_stat,
    score_row,
    seeds_note,
    sorted_iterations,
    split_label,
)

MISSING = "—"
LEGEND = "Average reward ×100 per split, then success rate (SR, %); Avg. = mean of the reward columns."


def table_columns(splits: Sequence[str]) -> list[tuple[str, Callable[[dict], object]]]:
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
    columns = table_columns(splits)
    rows = []
    for name, evals in final_scores(results).items():
        row = score_row(evals, splits)
        rows.append([_escape(name), *(_format_value(get(row)) for _, get in columns)])
    title = f"### Results on `{results.get('env', '?')}` (seed {results.get('seed', '?')})"
    table = _markdown(["Method", *(header for header, _ in columns)], rows)
    return f"{title}\n\n{LEGEND}\n\n{table}\n"


def _format_stat(stat: dict | None, digits: int = 1, signed: bool = False) -> str:
    """ "mean ± std" (just the mean for one value), MISSING for none; `signed` writes "+" on the mean."""
    if stat is None:
        return MISSING
    mean = f"{stat['mean']:+.{digits}f}" if signed else f"{stat['mean']:.{digits}f}"
    if stat["std"] is None:
        return mean
    return f"{mean} ± {stat['std']:.{digits}f}"


def table_markdown_mean_std(runs: Sequence[Mapping], names: Sequence[str] | None = None) -> str:
    """Table 1 over several seeds: each cell "mean ± std" (sample std; just the mean with one run)."""
    aggregate = aggregate_runs(runs, names)
    columns = table_columns(aggregate["splits"])
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


def table_markdown_paired(
    runs: Sequence[Mapping], baseline: str = "SFT", names: Sequence[str] | None = None
) -> str:
    """Table 1's cells as differences from `baseline` in the same run, "mean ± std" over the runs."""
    paired = paired_differences(runs, baseline, names)
    columns = table_columns(paired["splits"])
    rows = [
        [_escape(name), *(_format_stat(get(row), signed=True) for _, get in columns)]
        for name, row in paired["methods"].items()
    ]
    count = len(paired["seeds"])
    title = f"### Differences from {_escape(baseline)} in the same run, mean ± std over {count} seed{'s' * (count != 1)}"
    note = "Each cell: the method's Table-1 cell minus the baseline's of the same seed (points)."
    return f"{title}\n\n{note}\n\n{_markdown(['Method', *(header for header, _ in columns)], rows)}\n"


def interval_cell(stat: Mapping) -> str:
    if stat["low"] is None:
        return f"{stat['mean']:+.1f}"
    return f"{stat['mean']:+.1f} [{stat['low']:+.1f}, {stat['high']:+.1f}]"


def _changes(changes: Sequence[Mapping | None]) -> str:
    if any(c is None for c in changes):
        return MISSING
    return ", ".join(f"{c['up']}/{c['down']}" for c in changes)


def table_markdown_contrasts(
    runs: Sequence[Mapping], contrasts: Sequence[tuple[str, str]] = DEFAULT_CONTRASTS
) -> str:
    """The study's paired contrasts: per split, the method's reward minus the baseline's in each seed, the
    mean difference of reward and of success rate with its 95 % Student-t interval over the seeds, and per
    seed the tasks whose greedy reward went up / down against the baseline's."""
    rows = []
    for contrast in paired_contrasts(runs, contrasts):
        for split, cell in contrast["splits"].items():
            rows.append(
                [
                    _escape(f"{contrast['method']} − {contrast['baseline']}"),
                    split_label(split),
                    ", ".join(f"{v:+.1f}" for v in cell["reward"]["per_seed"]),
                    interval_cell(cell["reward"]),
                    interval_cell(cell["success"]),
                    _changes(cell["changes"]),
                ]
            )
    count = len(runs)
    title = f"### Paired differences over {count} seed{'s' * (count != 1)} (method − baseline, same seed)"
    note = (
        "Reward ×100 and success rate (points) at the last iteration; the mean's 95 % Student-t interval "
        "over the seeds in brackets; tasks up / down: per seed, the tasks whose greedy reward beat / fell "
        "below the baseline's."
    )
    headers = [
        "Contrast",
        "Split",
        "Δ reward per seed",
        "Δ reward [95 % CI]",
        "Δ SR [95 % CI]",
        "Tasks up / down",
    ]
    return f"{title}\n\n{note}\n\n{_markdown(headers, rows)}\n"


def table_markdown_failure_contrasts(runs: Sequence[Mapping]) -> str:
    """Figure 2 paired by seed (`paired.failure_contrasts`): per iteration, the failure agent's failures on the
    SFT-failed train tasks and their mean reward minus the baseline's, each seed's and the mean's 95 % interval;
    "" when the runs lack the series."""
    rows = []
    for contrast in failure_contrasts(runs):
        for iteration, cell in contrast["iterations"].items():
            rows.append(
                [
                    _escape(f"{contrast['agent']} − {contrast['baseline']}"),
                    str(iteration),
                    ", ".join(f"{v:+.0f}" for v in cell["failures"]["per_seed"]),
                    interval_cell(cell["failures"]),
                    ", ".join(
                        MISSING if v is None else f"{v:+.1f}" for v in cell["failure_reward"]["per_seed"]
                    ),
                    MISSING
                    if cell["failure_reward"]["mean"] is None
                    else interval_cell(cell["failure_reward"]),
                ]
            )
    if not rows:
        return ""
    title = f"### Figure 2 paired over {len(runs)} seeds (agent − baseline, same seed)"
    note = (
        "Failures on the train tasks the SFT policy failed, and their mean reward ×100, at each iteration; "
        "the mean's 95 % Student-t interval over the seeds in brackets."
    )
    headers = ["Contrast", "It.", "Δ failures per seed", "Δ failures [95 % CI]", "Δ failure reward per seed"]
    headers.append("Δ failure reward [95 % CI]")
    return f"{title}\n\n{note}\n\n{_markdown(headers, rows)}\n"


GRPO_HEADERS = (
    "Method",
    "It.",
    "Steps",
    "Updates",
    "Sampled reward",
    "Sampled SR (%)",
    "All-equal groups (%)",
    "KL",
    "Clip frac.",
    "Rounds",
    "Signals",
    "Explored",
    "Synthesized",
    "Verified",
    "Pool",
)


def mean_std_cell(values: Sequence[float | None], digits: int = 1, scale: float = 1.0) -> str:
    """ "mean ± std" of `values` x `scale` (None entries skipped)."""
    return _format_stat(sample_stat([None if v is None else scale * v for v in values]), digits)


def _round_total(rounds: Sequence[Sequence[Mapping]], key: str) -> str:
    """ "mean ± std" over runs of `key` summed over each run's rounds."""
    return mean_std_cell([sum(r.get(key, 0) for r in rs) for rs in rounds], 0)


def grpo_details_markdown(results: Mapping | Sequence[Mapping]) -> str:
    """Per GRPO-trained method and iteration (mean ± std over the runs given): its steps' sampled reward
    (x100) and success, the share of all-equal groups, the last update's KL and clip fraction, and the
    CoEvolve rounds that ran after those steps (signals detected by kind, explorations, tasks synthesized
    and verified, summed over the rounds; the pool's size after the last). "" when no method trained by GRPO."""
    runs = as_runs(results)
    rows = []
    for name in runs[0]["methods"]:
        records_by_iteration: dict[int, list[Mapping]] = {}
        for run in runs:
            for it in sorted_iterations(run["methods"].get(name) or {}):
                target = (it.get("train") or {}).get("target") or {}
                if "equal_reward_fraction" in target:
                    records_by_iteration.setdefault(it["iteration"], []).append(it)
        for k, records in sorted(records_by_iteration.items()):
            train = [r["train"]["target"] for r in records]
            rounds = [r.get("coevolve") or [] for r in records]

            kinds = sorted({kind for rs in rounds for r in rs for kind in r.get("signals") or {}})
            signals = ", ".join(
                f"{kind} {np.mean([sum(r['signals'].get(kind, 0) for r in rs) for rs in rounds]):.0f}"
                for kind in kinds
            )

            if any(rounds):
                coevolve = [
                    mean_std_cell([len(rs) for rs in rounds], 0),
                    signals or "none",
                    _round_total(rounds, "explored"),
                    _round_total(rounds, "synthesized"),
                    _round_total(rounds, "verified"),
                    mean_std_cell([rs[-1]["pool_size"] if rs else None for rs in rounds], 0),
                ]
            else:
                coevolve = [MISSING] * 6
            rows.append(
                [
                    _escape(name),
                    str(k),
                    mean_std_cell([t.get("steps") for t in train], 0),
                    mean_std_cell([t.get("updates") for t in train], 0),
                    mean_std_cell([t.get("avg_reward") for t in train], scale=100.0),
                    mean_std_cell([t.get("success_rate") for t in train], scale=100.0),
                    mean_std_cell([t.get("equal_reward_fraction") for t in train], scale=100.0),
                    mean_std_cell([t.get("final_kl") for t in train], 3),
                    mean_std_cell([t.get("final_clip_fraction") for t in train], 3),
                    *coevolve,
                ]
            )
    if not rows:
        return ""
    title = (
        f"### GRPO steps and CoEvolve rounds per iteration (`{runs[0].get('env', '?')}`{seeds_note(runs)})"
    )
    return f"{title}\n\n{_markdown(GRPO_HEADERS, rows)}\n"


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

                rows.append(
                    [
                        _escape(name),
                        str(k),
                        agent_label(name, agent).removeprefix(f"{name} "),
                        mean_std_cell([e.get("failures") for e in explored]),
                        mean_std_cell([e.get("failure_avg_reward") for e in explored], scale=100.0),
                        mean_std_cell([p.get("pairs") for p in pairs]),
                        mean_std_cell([p.get("hard_negatives") for p in pairs]),
                        by_kind or MISSING,
                        mean_std_cell([t.get("final_reward_accuracy") for t in train], 2),
                        mean_std_cell([t.get("final_reward_margin") for t in train], 2),
                        mean_std_cell(cutoffs) if agent == "target" else MISSING,
                    ]
                )
    title = f"### What each iteration explored and trained on (`{runs[0].get('env', '?')}`{seeds_note(runs)})"
    grpo = grpo_details_markdown(runs)
    if grpo and not rows:  # GRPO-trained methods only: no DPO table
        return grpo
    return f"{title}\n\n{_markdown(DETAIL_HEADERS, rows)}\n" + (f"\n{grpo}" if grpo else "")
