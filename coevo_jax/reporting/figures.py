"""The paper's Figure 2 and Figure 3 from one or several runs' results, as matplotlib figures and PNGs.

* `reward_curves_figure` / `plot_reward_curves` (Figure 3): average reward across iterations, one panel
  per split.
* `failure_analysis_figure` / `plot_failure_analysis` (Figure 2): failures produced per iteration and
  their mean reward.
* `pool_makeup_figure` / `plot_pool_makeup` (CoEvolve): each CoEvolve method's task pool after each round,
  stacked by provenance (one run).
* `grpo_steps_figure` / `plot_grpo_steps` (GRPO-trained methods): the sampled episodes' mean reward at every
  GRPO step, and its moving average over `STEP_WINDOW` steps.

With several runs (seeds) every point or bar is their mean, its error bar the 95 % Student-t interval of the
mean over the seeds (`paired.mean_interval`). PNGs are written atomically.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from coevo_jax.atomic_files import atomic_path
from coevo_jax.coevolve.pool import PROVENANCES
from coevo_jax.reporting.paired import mean_interval
from coevo_jax.reporting.results import (
    as_runs,
    coevolve_rounds,
    failure_series,
    percent,
    seeds_note,
    sorted_iterations,
    split_label,
)

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
STEP_WINDOW = 5  # GRPO steps in the moving average of the steps figure


def png_bytes(figure: Figure) -> bytes:
    """`figure` as PNG bytes, as the PNG files have it (for pages that embed it)."""
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()


def _save_png(figure: Figure, path: str | os.PathLike) -> Path:
    data = png_bytes(figure)
    with atomic_path(path) as tmp, open(tmp, "wb") as file:
        file.write(data)
    return Path(path)


def _no_data(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval over the runs (0 for a single value)."""
    stat = mean_interval(values)
    return stat["mean"], 0.0 if stat["high"] is None else stat["high"] - stat["mean"]


def reward_curves_figure(results: Mapping | Sequence[Mapping]) -> Figure:
    """Figure 3: average reward x100 per iteration, one panel per split with data, one line per method.

    With several runs (seeds) each point is their mean, with its 95 % t-interval as error bars. A method
    evaluated only at iteration 0 (SFT) is a horizontal dashed line (its interval a shaded band).
    """
    runs = as_runs(results)
    first = runs[0]
    names = list(first["methods"])
    splits = [
        s
        for s in first["splits"]
        if any(
            s in (it.get("eval") or {})
            for run in runs
            for m in run["methods"].values()
            for it in sorted_iterations(m)
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
                for it in sorted_iterations(run["methods"].get(name) or {}):
                    value = percent(it.get("eval") or {}, split, "avg_reward")
                    if value is not None:
                        per_iteration.setdefault(it["iteration"], []).append(value)
            points = [(i, *_mean_interval(v)) for i, v in sorted(per_iteration.items())]
            style = {"color": f"C{index % 10}", "label": name}
            if points and all(iteration == 0 for iteration, _, _ in points):
                _, mean, half = points[-1]
                ax.axhline(mean, linestyle="--", **style)
                if half > 0:
                    ax.axhspan(mean - half, mean + half, color=style["color"], alpha=0.1)
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
    figure.suptitle(f"Average reward across iterations ({first.get('env', '?')}{seeds_note(runs)})")
    return figure


def plot_reward_curves(results: Mapping | Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Write Figure 3 (reward curves) as a PNG at `path`."""
    return _save_png(reward_curves_figure(results), path)


def _has_sft_failed_scope(results: Mapping) -> bool:
    return any(
        "on_sft_failed_tasks" in (stats or {})
        for method in results["methods"].values()
        for it in sorted_iterations(method)
        for stats in (it.get("explore") or {}).values()
    )


def failure_analysis_figure(results: Mapping | Sequence[Mapping]) -> Figure:
    """Figure 2: (a) failure trajectories per iteration, (b) their mean reward x100, bars per series.

    With several runs (seeds) each bar is their mean with its 95 % t-interval as an error bar.
    """
    runs = as_runs(results)
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
                    bars.append((i + offset, *_mean_interval(values)))
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
    figure.suptitle(f"Failures produced {scope} ({runs[0].get('env', '?')}{seeds_note(runs)})")
    return figure


def plot_failure_analysis(results: Mapping | Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Write Figure 2 (failure counts and rewards) as a PNG at `path`."""
    return _save_png(failure_analysis_figure(results), path)


def pool_makeup_figure(results: Mapping) -> Figure:
    """The CoEvolve pool's make-up over rounds: per method with rounds, one bar per round (at the GRPO step
    it ran after) stacked by provenance (forgetting, boundary, rare, unguided)."""
    methods = [(name, coevolve_rounds(m)) for name, m in results["methods"].items() if coevolve_rounds(m)]
    figure = Figure(figsize=(5.0 * max(len(methods), 1), 4.0), layout="constrained")
    axes = figure.subplots(1, max(len(methods), 1), squeeze=False, sharey=True)[0]
    if not methods:
        _no_data(axes[0], "no CoEvolve rounds")
        return figure
    for ax, (name, rounds) in zip(axes, methods, strict=True):
        steps = [entry["step"] for entry in rounds]
        bottom = [0] * len(rounds)
        for index, provenance in enumerate(PROVENANCES):
            counts = [entry["pool_makeup"].get(provenance, 0) for entry in rounds]
            if any(counts):
                ax.bar(steps, counts, bottom=bottom, color=f"C{index}", label=provenance)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        ax.set_title(name)
        ax.set_xlabel("GRPO step (round after it)")
        ax.set_xticks(steps)
        ax.grid(alpha=0.3, axis="y")
        if ax.get_legend_handles_labels()[0]:  # an empty pool has no bars
            ax.legend(fontsize="small")
    axes[0].set_ylabel("tasks in the pool")
    figure.suptitle(f"CoEvolve task pool by provenance ({results.get('env', '?')})")
    return figure


def plot_pool_makeup(results: Mapping, path: str | os.PathLike) -> Path:
    """Write the CoEvolve pool make-up figure as a PNG at `path`."""
    return _save_png(pool_makeup_figure(results), path)


def grpo_step_rewards(method: Mapping) -> list[float]:
    """A GRPO-trained method's sampled mean reward at each GRPO step, over all its iterations ([] for others)."""
    return [
        reward
        for it in sorted_iterations(method)
        for reward in ((it.get("train") or {}).get("target") or {}).get("step_rewards") or []
    ]


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the up to `window - 1` values before it."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def grpo_steps_figure(results: Mapping | Sequence[Mapping]) -> Figure:
    """Reward ×100 of the episodes each GRPO step sampled (its train tasks, at `grpo.temperature`), one colour
    per GRPO-trained method: every step thin, the moving average over `STEP_WINDOW` steps bold. With several
    runs (seeds) each point is their mean over the runs that reached that step, the band its 95 % t-interval."""
    runs = as_runs(results)
    names = [
        name
        for name in runs[0]["methods"]
        if any(grpo_step_rewards(r["methods"].get(name) or {}) for r in runs)
    ]
    figure = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = figure.subplots()
    if not names:
        _no_data(ax, "no GRPO steps")
        return figure
    for index, name in enumerate(names):
        series = [grpo_step_rewards(r["methods"].get(name) or {}) for r in runs]
        steps = max(len(s) for s in series)
        stats = [_mean_interval([100.0 * s[i] for s in series if len(s) > i]) for i in range(steps)]
        means = [m for m, _ in stats]
        xs = list(range(1, steps + 1))
        color = f"C{index % 10}"
        ax.plot(xs, means, color=color, alpha=0.35, linewidth=1, marker=".")
        ax.plot(
            xs,
            moving_average(means, STEP_WINDOW),
            color=color,
            linewidth=2.2,
            label=f"{name} ({STEP_WINDOW}-step mean)",
        )
        if len(runs) > 1:
            ax.fill_between(xs, [m - e for m, e in stats], [m + e for m, e in stats], color=color, alpha=0.1)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("sampled episodes' average reward (×100)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(f"Reward of each GRPO step's episodes ({runs[0].get('env', '?')}{seeds_note(runs)})")
    return figure


def plot_grpo_steps(results: Mapping | Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Write the GRPO steps figure as a PNG at `path`."""
    return _save_png(grpo_steps_figure(results), path)
