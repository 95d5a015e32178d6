"""The paper's outputs from a run's `results.json`: Table 1 (Markdown), Figure 2 and Figure 3 (PNG).

`results.json` (written by `coevo_jax.main`) holds, per method, one record per iteration with the
evaluation per split and, from iteration 1, what each agent's exploration produced. From it:

* `table_markdown`: Table 1, one row per method: average reward x100 per split, success rate (%) per
  split and "Avg." (mean of the reward columns), all from the method's last iteration.
* `aggregate_runs` / `table_markdown_mean_std`: the same table as "mean ± std" over several seeds.
* `plot_reward_curves` (Figure 3): average reward across iterations, one panel per split.
* `plot_failure_analysis` (Figure 2): failures produced per iteration and their mean reward.
* `write_reports`: all three files into a workdir, each written atomically.

CLI: `python -m coevo_jax.experiment.report WORKDIR [WORKDIR ...] [--out FILE]`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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


def _format_stat(stat: dict | None) -> str:
    if stat is None:
        return MISSING
    if stat["std"] is None:
        return f"{stat['mean']:.1f}"
    return f"{stat['mean']:.1f} ± {stat['std']:.1f}"


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


def _atomic_write(path: str | os.PathLike, write: Callable[[object], None], mode: str = "w") -> Path:
    """Call `write(file)` on a temporary file next to `path`, then rename it over `path`."""
    path = Path(path)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, mode) as file:
            write(file)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _save_png(figure: Figure, path: str | os.PathLike) -> Path:
    FigureCanvasAgg(figure)
    return _atomic_write(path, lambda file: figure.savefig(file, format="png", dpi=120), mode="wb")


def _no_data(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def reward_curves_figure(results: Mapping) -> Figure:
    """Figure 3: average reward x100 per iteration, one panel per split with data, one line per method.

    A method evaluated only at iteration 0 (SFT) is a horizontal dashed line.
    """
    methods = list(results["methods"].items())
    splits = [
        s
        for s in results["splits"]
        if any(s in (it.get("eval") or {}) for _, m in methods for it in _iterations(m))
    ]
    figure = Figure(figsize=(5.0 * max(len(splits), 1), 4.0), layout="constrained")
    axes = figure.subplots(1, max(len(splits), 1), squeeze=False)[0]
    if not splits:
        _no_data(axes[0], "no evaluation data")
        return figure
    for ax, split in zip(axes, splits, strict=True):
        for index, (name, method) in enumerate(methods):
            points = [
                (it["iteration"], _metric(it["eval"], split, "avg_reward"))
                for it in _iterations(method)
                if split in (it.get("eval") or {})
            ]
            style = {"color": f"C{index % 10}", "label": name}
            if points and all(iteration == 0 for iteration, _ in points):
                ax.axhline(points[-1][1], linestyle="--", **style)
            elif points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker=MARKERS[index % len(MARKERS)], **style)
        ax.set_title(split_label(split))
        ax.set_xlabel("iteration")
        ax.set_ylabel("average reward (×100)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize="small")
    figure.suptitle(f"Average reward across iterations ({results.get('env', '?')})")
    return figure


def plot_reward_curves(results: Mapping, path: str | os.PathLike) -> Path:
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


def failure_analysis_figure(results: Mapping) -> Figure:
    """Figure 2: (a) failure trajectories per iteration, (b) their mean reward x100, bars per series."""
    series = failure_series(results)
    figure = Figure(figsize=(11.0, 4.0), layout="constrained")
    count_ax, reward_ax = figure.subplots(1, 2)
    if not series:
        _no_data(count_ax, "no exploration data")
        _no_data(reward_ax, "no exploration data")
        return figure
    iterations = sorted({iteration for _, stats in series for iteration in stats})
    width = 0.8 / len(series)
    for index, (label, stats) in enumerate(series):
        offset = (index - (len(series) - 1) / 2) * width
        style = {"width": width, "color": f"C{index % 10}", "label": label}
        counts = [(i + offset, stats[i].get("failures")) for i in iterations if i in stats]
        rewards = [(i + offset, stats[i].get("failure_avg_reward")) for i in iterations if i in stats]
        counts = [(x, y) for x, y in counts if y is not None]
        rewards = [(x, 100.0 * y) for x, y in rewards if y is not None]
        for ax, bars in ((count_ax, counts), (reward_ax, rewards)):
            if bars:
                ax.bar(*zip(*bars, strict=True), **style)
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
    scope = "on the train tasks the SFT policy failed" if _has_sft_failed_scope(results) else "in exploration"
    figure.suptitle(f"Failures produced {scope} ({results.get('env', '?')})")
    return figure


def plot_failure_analysis(results: Mapping, path: str | os.PathLike) -> Path:
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


def _results_path(arg: str) -> Path:
    """A workdir argument names its results.json; a file argument is taken as the results file itself."""
    path = Path(arg)
    return path if path.is_file() else path / RESULTS_FILE


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: one workdir rewrites its reports and prints Table 1; several print the mean ± std table."""
    parser = argparse.ArgumentParser(prog="python -m coevo_jax.experiment.report", description=__doc__)
    parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="run directory with results.json")
    parser.add_argument("--out", help="also write the printed table to this file")
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
        if args.out:
            write_text(args.out, table)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
