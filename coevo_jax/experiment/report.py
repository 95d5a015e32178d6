"""The paper's outputs from a run's `results.json`: Table 1 (Markdown), Figure 2 and Figure 3 (PNG).

`results.json` (written by `coevo_jax.main`) holds, per method, one record per iteration with the
evaluation per split and, from iteration 1, what each agent's exploration produced. From it:

* `table_markdown`: Table 1, one row per method: average reward x100 per split, success rate (%) per
  split and "Avg." (mean of the reward columns), all from the method's last iteration.
* `aggregate_runs` / `table_markdown_mean_std`: the same table as "mean ± std" over several seeds.
* `plot_reward_curves` (Figure 3): average reward across iterations, one panel per split.
* `plot_failure_analysis` (Figure 2): failures produced per iteration and their mean reward.
* `details_markdown`: per method, iteration and agent, the counts behind the table (failures on the tasks
  SFT failed, pairs by kind, hard negatives, DPO accuracy and margin, context cut-offs).
* `write_reports`: all three files into a workdir, each written atomically; `write_study_reports`: the
  figures (mean ± std over seeds) and the details for several runs.

CLI: `python -m coevo_jax.experiment.report WORKDIR [WORKDIR ...] [--out FILE] [--figures DIR]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from coevo_jax.experiment.atomic import atomic_path

RESULTS_FILE = "results.json"
SPLIT_LABELS = {"test_seen": "Seen", "test_unseen": "Unseen"}
MISSING = "—"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LEGEND = "Average reward ×100 per split, then success rate (SR, %); Avg. = mean of the reward columns."


def split_label(split: str) -> str:
    """The paper's column name for an evaluation split ("Seen", "Unseen"); other names as given."""
    return SPLIT_LABELS.get(split, split)


def load_results(path: str | os.PathLike) -> dict:
    """Read and minimally validate a results.json; every error message names the file."""
    path = Path(path)
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise FileNotFoundError(f"results file not found: {path}") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read results file {path}: {err}") from err
    if not isinstance(results, dict):
        raise ValueError(f"malformed results file {path}: top level is not a JSON object")
    if not isinstance(results.get("methods"), dict) or not isinstance(results.get("splits"), list):
        raise ValueError(f"malformed results file {path}: needs a 'methods' object and a 'splits' list")
    for name, method in results["methods"].items():
        if not isinstance(method, dict) or not isinstance(method.get("iterations"), list):
            raise ValueError(f"malformed results file {path}: method {name!r} has no 'iterations' list")
    return results


def _iterations(method: Mapping) -> list[Mapping]:
    return sorted(method.get("iterations") or [], key=lambda record: record["iteration"])


def final_scores(results: Mapping) -> dict[str, dict[str, dict]]:
    """Each method's evaluation (split -> metrics) at its last iteration; {} for a method with none."""
    scores = {}
    for name, method in results["methods"].items():
        iterations = _iterations(method)
        scores[name] = dict(iterations[-1].get("eval") or {}) if iterations else {}
    return scores


def _metric(evals: Mapping, split: str, key: str) -> float | None:
    value = (evals.get(split) or {}).get(key)
    return None if value is None else 100.0 * float(value)


def score_row(evals: Mapping, splits: Sequence[str]) -> dict:
    """One Table-1 row in percent: reward and success per split (None where missing) and their "avg".

    "avg" is the mean of the reward columns that are present (None if none is).
    """
    reward = {split: _metric(evals, split, "avg_reward") for split in splits}
    success = {split: _metric(evals, split, "success_rate") for split in splits}
    present = [value for value in reward.values() if value is not None]
    return {"reward": reward, "success": success, "avg": float(np.mean(present)) if present else None}


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


def _check_runs(runs: Sequence[Mapping], names: Sequence[str]) -> None:
    """Raise ValueError unless all runs share env, method set and splits (runs are named in the message)."""
    if not runs:
        raise ValueError("no runs to aggregate")
    first = runs[0]
    for name, run in zip(names[1:], runs[1:], strict=True):
        if run.get("env") != first.get("env"):
            raise ValueError(
                f"runs have different envs: {names[0]} is {first.get('env')!r}, {name} is {run.get('env')!r}"
            )
        if set(run["methods"]) != set(first["methods"]):
            missing = sorted(set(first["methods"]) - set(run["methods"]))
            extra = sorted(set(run["methods"]) - set(first["methods"]))
            raise ValueError(
                f"runs have different method sets: {name} lacks {missing} and adds {extra} "
                f"compared with {names[0]}"
            )
        if list(run["splits"]) != list(first["splits"]):
            raise ValueError(
                f"runs have different splits: {names[0]} has {first['splits']}, {name} has {run['splits']}"
            )


def _stat(values: Sequence[float | None]) -> dict | None:
    """Mean and sample std (ddof=1, None for a single value) over the values present."""
    present = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if present.size == 0:
        return None
    std = float(np.std(present, ddof=1)) if present.size > 1 else None
    return {"mean": float(np.mean(present)), "std": std, "n": int(present.size)}


def aggregate_runs(runs: Sequence[Mapping], names: Sequence[str] | None = None) -> dict:
    """Table-1 cells as mean ± std over several runs (seeds) of the same env, methods and splits.

    Returns {"env", "seeds", "splits", "methods": {method: {"reward": {split: stat}, "success": {split:
    stat}, "avg": stat}}} with stat = {"mean", "std", "n"} or None where no run has the value. `names`
    (e.g. the files) label the runs in error messages.
    """
    names = list(names) if names is not None else [f"run {i}" for i in range(len(runs))]
    _check_runs(runs, names)
    splits = list(runs[0]["splits"])
    rows_per_run = [
        {name: score_row(evals, splits) for name, evals in final_scores(run).items()} for run in runs
    ]
    methods = {}
    for method in runs[0]["methods"]:
        rows = [per_run[method] for per_run in rows_per_run]
        methods[method] = {
            "reward": {s: _stat([row["reward"][s] for row in rows]) for s in splits},
            "success": {s: _stat([row["success"][s] for row in rows]) for s in splits},
            "avg": _stat([row["avg"] for row in rows]),
        }
    seeds = [run.get("seed") for run in runs]
    return {"env": runs[0].get("env"), "seeds": seeds, "splits": splits, "methods": methods}


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
    runs = _as_runs(results)
    rows = []
    for name in runs[0]["methods"]:
        iterations = sorted(
            {it["iteration"] for run in runs for it in _iterations(run["methods"].get(name) or {})} - {0}
        )
        for k in iterations:
            records = [
                it
                for run in runs
                for it in _iterations(run["methods"].get(name) or {})
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
                        _agent_label(name, agent).removeprefix(f"{name} "),
                        _format_stat(_stat(present(explored, "failures"))),
                        _format_stat(_stat(present(explored, "failure_avg_reward", 100.0))),
                        _format_stat(_stat(present(pairs, "pairs"))),
                        _format_stat(_stat(present(pairs, "hard_negatives"))),
                        by_kind or MISSING,
                        _format_stat(_stat(present(train, "final_reward_accuracy")), 2),
                        _format_stat(_stat(present(train, "final_reward_margin")), 2),
                        _format_stat(_stat(cutoffs)) if agent == "target" else MISSING,
                    ]
                )
    title = (
        f"### What each iteration explored and trained on (`{runs[0].get('env', '?')}`{_seeds_note(runs)})"
    )
    return f"{title}\n\n{_markdown(DETAIL_HEADERS, rows)}\n"


def _atomic_write(path: str | os.PathLike, write: Callable[[object], None], mode: str = "w") -> Path:
    """Call `write(file)` on a file opened in `mode` whose content replaces `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, mode) as file:
        write(file)
    return Path(path)


def _save_png(figure: Figure, path: str | os.PathLike) -> Path:
    FigureCanvasAgg(figure)
    return _atomic_write(path, lambda file: figure.savefig(file, format="png", dpi=120), mode="wb")


def _no_data(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _as_runs(results: Mapping | Sequence[Mapping]) -> list[Mapping]:
    """One run's results, or several seeds' (figures then show the mean and ± 1 std across them)."""
    return [results] if isinstance(results, Mapping) else list(results)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (0 for a single value): error bars from `_stat`."""
    stat = _stat(values)
    return stat["mean"], stat["std"] or 0.0


def reward_curves_figure(results: Mapping | Sequence[Mapping]) -> Figure:
    """Figure 3: average reward x100 per iteration, one panel per split with data, one line per method.

    With several runs (seeds) each point is their mean, with ± 1 std as error bars. A method evaluated only
    at iteration 0 (SFT) is a horizontal dashed line (its std a shaded band).
    """
    runs = _as_runs(results)
    first = runs[0]
    names = list(first["methods"])
    splits = [
        s
        for s in first["splits"]
        if any(
            s in (it.get("eval") or {})
            for run in runs
            for m in run["methods"].values()
            for it in _iterations(m)
        )
    ]
    figure = Figure(figsize=(5.0 * max(len(splits), 1), 4.0), layout="constrained")
    axes = figure.subplots(1, max(len(splits), 1), squeeze=False)[0]
    if not splits:
        _no_data(axes[0], "no evaluation data")
        return figure
    for ax, split in zip(axes, splits, strict=True):
        for index, name in enumerate(names):
            per_iteration: dict[int, list[float]] = {}
            for run in runs:
                for it in _iterations(run["methods"].get(name) or {}):
                    value = _metric(it.get("eval") or {}, split, "avg_reward")
                    if value is not None:
                        per_iteration.setdefault(it["iteration"], []).append(value)
            points = [(i, *_mean_std(v)) for i, v in sorted(per_iteration.items())]
            style = {"color": f"C{index % 10}", "label": name}
            if points and all(iteration == 0 for iteration, _, _ in points):
                _, mean, std = points[-1]
                ax.axhline(mean, linestyle="--", **style)
                if std > 0:
                    ax.axhspan(mean - std, mean + std, color=style["color"], alpha=0.1)
            elif points:
                xs, ys, errs = zip(*points, strict=True)
                marker = MARKERS[index % len(MARKERS)]
                if len(runs) > 1:
                    ax.errorbar(xs, ys, yerr=errs, marker=marker, capsize=3, **style)
                else:
                    ax.plot(xs, ys, marker=marker, **style)
        ax.set_title(split_label(split))
        ax.set_xlabel("iteration")
        ax.set_ylabel("average reward (×100)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize="small")
    figure.suptitle(f"Average reward across iterations ({first.get('env', '?')}{_seeds_note(runs)})")
    return figure


def _seeds_note(runs: Sequence[Mapping]) -> str:
    return f"; mean ± std over {len(runs)} seeds" if len(runs) > 1 else ""


def plot_reward_curves(results: Mapping | Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Write Figure 3 (reward curves) as a PNG at `path`."""
    return _save_png(reward_curves_figure(results), path)


def _agent_label(method: str, agent: str) -> str:
    if agent == "failure":
        return f"{method} {'positive agent' if 'positive' in method.lower() else 'failure agent'}"
    return f"{method} {agent}"


def failure_series(results: Mapping) -> list[tuple[str, dict[int, Mapping]]]:
    """(label, {iteration: explore stats}) per (method, agent) that explored at some iteration >= 1.

    The stats are those on the train tasks the SFT policy failed (`on_sft_failed_tasks`, the paper's Figure
    2) where the run recorded them, else those on every explored task.
    """
    series = []
    for name, method in results["methods"].items():
        agents: dict[str, dict[int, Mapping]] = {}
        for it in _iterations(method):
            if it["iteration"] >= 1:
                for agent, stats in (it.get("explore") or {}).items():
                    if stats:
                        stats = stats.get("on_sft_failed_tasks", stats)
                        agents.setdefault(agent, {})[it["iteration"]] = stats
        order = sorted(agents, key=lambda agent: (agent != "target", agent != "failure", agent))
        series += [(_agent_label(name, agent), agents[agent]) for agent in order]
    return series


def _has_sft_failed_scope(results: Mapping) -> bool:
    return any(
        "on_sft_failed_tasks" in (stats or {})
        for method in results["methods"].values()
        for it in _iterations(method)
        for stats in (it.get("explore") or {}).values()
    )


def failure_analysis_figure(results: Mapping | Sequence[Mapping]) -> Figure:
    """Figure 2: (a) failure trajectories per iteration, (b) their mean reward x100, bars per series.

    With several runs (seeds) each bar is their mean with ± 1 std as an error bar.
    """
    runs = _as_runs(results)
    per_run = [dict(failure_series(run)) for run in runs]
    labels = [label for label, _ in failure_series(runs[0])]
    figure = Figure(figsize=(11.0, 4.0), layout="constrained")
    count_ax, reward_ax = figure.subplots(1, 2)
    if not labels:
        _no_data(count_ax, "no exploration data")
        _no_data(reward_ax, "no exploration data")
        return figure
    iterations = sorted({i for series in per_run for stats in series.values() for i in stats})
    width = 0.8 / len(labels)
    for index, label in enumerate(labels):
        offset = (index - (len(labels) - 1) / 2) * width
        style = {"width": width, "color": f"C{index % 10}", "label": label}
        for ax, key, scale in ((count_ax, "failures", 1.0), (reward_ax, "failure_avg_reward", 100.0)):
            bars = []
            for i in iterations:
                values = [
                    scale * series[label][i][key]
                    for series in per_run
                    if i in series.get(label, {}) and series[label][i].get(key) is not None
                ]
                if values:
                    bars.append((i + offset, *_mean_std(values)))
            if bars:
                xs, ys, errs = zip(*bars, strict=True)
                errors = {"yerr": errs, "capsize": 2} if len(runs) > 1 else {}
                ax.bar(xs, ys, **errors, **style)
    for ax, title, ylabel in (
        (count_ax, "(a) failure trajectories", "failures per iteration"),
        (reward_ax, "(b) mean reward of failures", "mean failure reward (×100)"),
    ):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.set_xticks(iterations)
        ax.grid(alpha=0.3, axis="y")
    figure.legend(
        *count_ax.get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize="small"
    )
    scoped = all(_has_sft_failed_scope(run) for run in runs)
    scope = "on the train tasks the SFT policy failed" if scoped else "in exploration"
    figure.suptitle(f"Failures produced {scope} ({runs[0].get('env', '?')}{_seeds_note(runs)})")
    return figure


def plot_failure_analysis(results: Mapping | Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Write Figure 2 (failure counts and rewards) as a PNG at `path`."""
    return _save_png(failure_analysis_figure(results), path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically."""
    return _atomic_write(path, lambda file: file.write(text))


def write_reports(results: Mapping, workdir: str | os.PathLike) -> dict[str, Path]:
    """Write table.md, reward_curves.png and failure_analysis.png into `workdir` (each atomically)."""
    workdir = Path(workdir)
    return {
        "table": write_text(workdir / "table.md", table_markdown(results)),
        "reward_curves": plot_reward_curves(results, workdir / "reward_curves.png"),
        "failure_analysis": plot_failure_analysis(results, workdir / "failure_analysis.png"),
    }


def write_study_reports(runs: Sequence[Mapping], directory: str | os.PathLike) -> dict[str, Path]:
    """Write reward_curves.png, failure_analysis.png (mean ± std over `runs`) and details.md into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "reward_curves": plot_reward_curves(runs, directory / "reward_curves.png"),
        "failure_analysis": plot_failure_analysis(runs, directory / "failure_analysis.png"),
        "details": write_text(directory / "details.md", details_markdown(runs)),
    }


def _results_path(arg: str) -> Path:
    """A workdir argument names its results.json; a file argument is taken as the results file itself."""
    path = Path(arg)
    return path if path.is_file() else path / RESULTS_FILE


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: one workdir rewrites its reports and prints Table 1; several print the mean ± std table."""
    parser = argparse.ArgumentParser(prog="python -m coevo_jax.experiment.report", description=__doc__)
    parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="run directory with results.json")
    parser.add_argument("--out", help="also write the printed table to this file")
    parser.add_argument(
        "--figures",
        metavar="DIR",
        help="with several workdirs: write Figures 2 and 3 (mean ± std over them) and details.md into DIR",
    )
    args = parser.parse_args(argv)
    paths = [_results_path(arg) for arg in args.workdirs]
    try:
        runs = [load_results(path) for path in paths]
        if len(runs) == 1:
            written = write_reports(runs[0], paths[0].parent)
            table = table_markdown(runs[0])
            print("\n".join(f"wrote {path}" for path in written.values()), file=sys.stderr)
        else:
            table = table_markdown_mean_std(runs, names=[str(path) for path in paths])
            if args.figures:
                written = write_study_reports(runs, args.figures)
                print("\n".join(f"wrote {path}" for path in written.values()), file=sys.stderr)
        if args.out:
            write_text(args.out, table)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
