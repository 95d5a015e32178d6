"""A run's `results.json`: its name, a validating reader, and the per-method views and statistics of it.

`results.json` (written by `coevo_jax.experiment.run`) holds, per method, one record per iteration with the
evaluation per split and, from iteration 1, what each agent's exploration produced. The tables
(`reporting.tables`) and figures (`reporting.figures`) read it through these functions:

* `final_scores` / `score_row`: each method's last-iteration evaluation as Table-1 cells in percent.
* `aggregate_runs`: those cells as mean, sample std and count over several runs (seeds), via `sample_stat`.
* `paired_differences`: each method's cells minus a baseline method's in the same run, over runs: seeds
  that move every method together (SFT's success swings with the seed) cancel out of the comparison.
* `failure_series`: Figure 2's per-agent exploration stats by iteration;
* `sorted_iterations`, `percent`, `as_runs`, `agent_label`, `split_label`, `seeds_note`: the small views
  both tables and figures use.
* `coevolve_rounds`: a CoEvolve method's rounds (the `coevolve` lists of its iterations), for the pool figure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

RESULTS_FILE = "results.json"
SPLIT_LABELS = {"test_seen": "Seen", "test_unseen": "Unseen"}


def split_label(split: str) -> str:
    """The paper's column name for an evaluation split ("Seen", "Unseen"); other names as given."""
    return SPLIT_LABELS.get(split, split)


def results_path(arg: str | os.PathLike) -> Path:
    """A workdir argument names its results.json; a file argument is taken as the results file itself."""
    path = Path(arg)
    return path if path.is_file() else path / RESULTS_FILE


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


def sorted_iterations(method: Mapping) -> list[Mapping]:
    """A method's iteration records in iteration order."""
    return sorted(method.get("iterations") or [], key=lambda record: record["iteration"])


def coevolve_rounds(method: Mapping) -> list[Mapping]:
    """A CoEvolve method's round entries over all its iterations, in round order ([] for other methods)."""
    rounds = [r for it in sorted_iterations(method) for r in it.get("coevolve") or []]
    return sorted(rounds, key=lambda r: r["round"])


def final_scores(results: Mapping) -> dict[str, dict[str, dict]]:
    """Each method's evaluation (split -> metrics) at its last iteration; {} for a method with none."""
    scores = {}
    for name, method in results["methods"].items():
        iterations = sorted_iterations(method)
        scores[name] = dict(iterations[-1].get("eval") or {}) if iterations else {}
    return scores


def percent(evals: Mapping, split: str, key: str) -> float | None:
    """Metric `key` of `split` in an evaluation record, x100; None where the split or metric is missing."""
    value = (evals.get(split) or {}).get(key)
    return None if value is None else 100.0 * float(value)


def score_row(evals: Mapping, splits: Sequence[str]) -> dict:
    """One Table-1 row in percent: reward and success per split (None where missing) and their "avg".

    "avg" is the mean of the reward columns that are present (None if none is).
    """
    reward = {split: percent(evals, split, "avg_reward") for split in splits}
    success = {split: percent(evals, split, "success_rate") for split in splits}
    present = [value for value in reward.values() if value is not None]
    return {"reward": reward, "success": success, "avg": float(np.mean(present)) if present else None}


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


def sample_stat(values: Sequence[float | None]) -> dict | None:
    """Mean and sample std (ddof=1, None for a single value) over the values present."""
    present = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if present.size == 0:
        return None
    std = float(np.std(present, ddof=1)) if present.size > 1 else None
    return {"mean": float(np.mean(present)), "std": std, "n": int(present.size)}


def _score_rows(runs: Sequence[Mapping], names: Sequence[str] | None) -> list[dict[str, dict]]:
    """Each run's `score_row` per method, after checking the runs agree (`names` label them in errors)."""
    names = list(names) if names is not None else [f"run {i}" for i in range(len(runs))]
    _check_runs(runs, names)
    splits = list(runs[0]["splits"])
    return [{name: score_row(evals, splits) for name, evals in final_scores(run).items()} for run in runs]


def _row_stats(rows: Sequence[dict], splits: Sequence[str]) -> dict:
    """Each Table-1 cell of `rows` (one per run) as `sample_stat` over the runs."""
    return {
        "reward": {s: sample_stat([row["reward"][s] for row in rows]) for s in splits},
        "success": {s: sample_stat([row["success"][s] for row in rows]) for s in splits},
        "avg": sample_stat([row["avg"] for row in rows]),
    }


def _row_difference(row: dict, base: dict, splits: Sequence[str]) -> dict:
    """Cell-wise `row - base` of two score rows (None where either cell is missing)."""

    def minus(value, other):
        return None if value is None or other is None else value - other

    return {
        "reward": {s: minus(row["reward"][s], base["reward"][s]) for s in splits},
        "success": {s: minus(row["success"][s], base["success"][s]) for s in splits},
        "avg": minus(row["avg"], base["avg"]),
    }


def aggregate_runs(runs: Sequence[Mapping], names: Sequence[str] | None = None) -> dict:
    """Table-1 cells as mean ± std over several runs (seeds) of the same env, methods and splits.

    Returns {"env", "seeds", "splits", "methods": {method: {"reward": {split: stat}, "success": {split:
    stat}, "avg": stat}}} with stat = {"mean", "std", "n"} or None where no run has the value. `names`
    (e.g. the files) label the runs in error messages.
    """
    rows_per_run = _score_rows(runs, names)
    splits = list(runs[0]["splits"])
    methods = {
        method: _row_stats([per_run[method] for per_run in rows_per_run], splits)
        for method in runs[0]["methods"]
    }
    seeds = [run.get("seed") for run in runs]
    return {"env": runs[0].get("env"), "seeds": seeds, "splits": splits, "methods": methods}


def paired_differences(runs: Sequence[Mapping], baseline: str, names: Sequence[str] | None = None) -> dict:
    """Table-1 cells of each method minus `baseline`'s in the same run, as mean ± std over the runs.

    Same shape as `aggregate_runs` (without the baseline's own row), plus "baseline". A cell is missing
    (None) where no run has both values. Unknown `baseline` is a ValueError naming the methods.
    """
    rows_per_run = _score_rows(runs, names)
    if baseline not in runs[0]["methods"]:
        raise ValueError(f"baseline method {baseline!r} is not among {sorted(runs[0]['methods'])}")
    splits = list(runs[0]["splits"])
    methods = {
        method: _row_stats(
            [_row_difference(per_run[method], per_run[baseline], splits) for per_run in rows_per_run], splits
        )
        for method in runs[0]["methods"]
        if method != baseline
    }
    seeds = [run.get("seed") for run in runs]
    return {
        "env": runs[0].get("env"),
        "seeds": seeds,
        "splits": splits,
        "baseline": baseline,
        "methods": methods,
    }


def as_runs(results: Mapping | Sequence[Mapping]) -> list[Mapping]:
    """One run's results, or several seeds' (figures then show the mean and ± 1 std across them)."""
    return [results] if isinstance(results, Mapping) else list(results)


def seeds_note(runs: Sequence[Mapping]) -> str:
    """The "; mean ± std over N seeds" suffix of a title for several runs ("" for one)."""
    return f"; mean ± std over {len(runs)} seeds" if len(runs) > 1 else ""


def agent_label(method: str, agent: str) -> str:
    """A method's agent as tables and legends name it ("CoEvolving failure agent", "ETO target")."""
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
        for it in sorted_iterations(method):
            if it["iteration"] >= 1:
                for agent, stats in (it.get("explore") or {}).items():
                    if stats:
                        stats = stats.get("on_sft_failed_tasks", stats)
                        agents.setdefault(agent, {})[it["iteration"]] = stats
        order = sorted(agents, key=lambda agent: (agent != "target", agent != "failure", agent))
        series += [(agent_label(name, agent), agents[agent]) for agent in order]
    return series
