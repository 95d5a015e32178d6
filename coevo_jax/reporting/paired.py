"""Paired comparisons of two methods over the seeds of a study: the per-seed difference of each Table-1 cell,
its mean with a 95 % Student-t interval, and the decisions behind it (tasks whose greedy reward went up or
down against the other method's in the same seed).

Seeds are the unit of replication: both methods of a contrast start from the same SFT policies and are
evaluated on the same tasks, so the per-seed difference removes the seed's own luck (a good or bad SFT base)
that a difference of means would keep. The t quantile is computed here (no SciPy at run time) and tested
against SciPy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from coevo_jax.reporting.results import failure_series, final_scores, score_row

# The study's questions: does each step of the method add something?
DEFAULT_CONTRASTS = (
    ("ETO", "SFT"),
    ("CoEvolving", "ETO"),
    ("CoEvolving (expert–failure pairs)", "ETO"),  # the authors' latest pairing
    ("CoEvolving (expert–failure pairs)", "CoEvolving"),
    ("Best-of-4", "ETO"),  # the latest version's sampling control
    ("CoEvolving", "CoEvolving (frozen failure agent)"),
    ("CoEvolving", "CoEvolving (frozen after iteration 1)"),
    ("CoEvolving", "CoEvolving (positive agent)"),
    ("RFT", "SFT"),
)
# Figure 2's question, paired: does the trained failure agent fail more often, and closer to success, than
# the frozen one (the same SFT policy never trained), and than ETO's target (the paper's comparison)?
FAILURE_CONTRASTS = (
    ("CoEvolving failure agent", "CoEvolving (frozen failure agent) failure agent"),
    ("CoEvolving failure agent", "CoEvolving (frozen after iteration 1) failure agent"),
    ("CoEvolving failure agent", "ETO target"),
)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta({a}, {b}, {x}) did not converge")


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete_beta: x={x} is outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on the CDF to float64 precision)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"student_t_quantile: need 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if student_t_cdf(mid, df) < p else (low, mid)
    return 0.5 * (low + high)


def mean_interval(values: Sequence[float], level: float = 0.95) -> dict:
    """Mean, sample std (ddof=1), n and the two-sided Student-t interval of the mean (None bounds for n < 2)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_interval: no values")
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "std": None, "n": 1, "low": None, "high": None}
    std = float(x.std(ddof=1))
    half = student_t_quantile(0.5 + level / 2.0, x.size - 1) * std / math.sqrt(x.size)
    return {"mean": mean, "std": std, "n": int(x.size), "low": mean - half, "high": mean + half}


def decision_changes(evals: Mapping, base_evals: Mapping, split: str) -> dict | None:
    """Tasks of `split` whose greedy reward went up, down or stayed against the base policy's (same tasks);
    None when either evaluation lacks per-task rewards (runs from before they were recorded)."""
    mine = (evals.get(split) or {}).get("task_rewards")
    base = (base_evals.get(split) or {}).get("task_rewards")
    if mine is None or base is None:
        return None
    if set(mine) != set(base):
        raise ValueError(f"{split}: the two evaluations played different tasks")
    diffs = np.asarray([mine[task] - base[task] for task in base], dtype=np.float64)
    return {
        "up": int(np.sum(diffs > 1e-9)),
        "down": int(np.sum(diffs < -1e-9)),
        "same": int(np.sum(np.abs(diffs) <= 1e-9)),
    }


def paired_contrast(runs: Sequence[Mapping], method: str, baseline: str) -> dict:
    """`method` minus `baseline` per seed, per split: reward and success (points) with `mean_interval`, and
    the per-seed decision changes. Raises ValueError naming a method no run has."""
    for name in (method, baseline):
        missing = [i for i, run in enumerate(runs) if name not in run["methods"]]
        if missing:
            raise ValueError(f"method {name!r} is missing from runs {missing}")
    splits = list(runs[0]["splits"])
    out = {"method": method, "baseline": baseline, "seeds": [run.get("seed") for run in runs], "splits": {}}
    per_run = [final_scores(run) for run in runs]
    rows = [(score_row(s[method], splits), score_row(s[baseline], splits)) for s in per_run]
    for split in splits:
        reward, success, changes = [], [], []
        for scores, (mine, base) in zip(per_run, rows, strict=True):
            reward.append(mine["reward"][split] - base["reward"][split])
            success.append(mine["success"][split] - base["success"][split])
            changes.append(decision_changes(scores[method], scores[baseline], split))
        out["splits"][split] = {
            "reward": {"per_seed": reward, **mean_interval(reward)},
            "success": {"per_seed": success, **mean_interval(success)},
            "changes": changes,
        }
    return out


def paired_contrasts(
    runs: Sequence[Mapping], contrasts: Sequence[tuple[str, str]] = DEFAULT_CONTRASTS
) -> list:
    """`paired_contrast` for each of `contrasts` whose two methods the runs have."""
    present = set(runs[0]["methods"])
    return [paired_contrast(runs, a, b) for a, b in contrasts if a in present and b in present]


_NO_STAT = {"mean": None, "std": None, "n": 0, "low": None, "high": None}


def failure_contrast(runs: Sequence[Mapping], agent: str, baseline: str) -> dict:
    """`agent` minus `baseline` (Figure 2's series, `failure_series` labels) per seed at each iteration both
    explored in every run: the failures on the train tasks the SFT policy failed, and their mean reward ×100
    (None in a seed where either had no failure), each with `mean_interval`. Raises ValueError naming a series some run lacks."""
    per_run = [dict(failure_series(run)) for run in runs]
    for name in (agent, baseline):
        missing = [i for i, series in enumerate(per_run) if name not in series]
        if missing:
            raise ValueError(f"series {name!r} is missing from runs {missing}")
    iterations = sorted(set.intersection(*(set(s[agent]) & set(s[baseline]) for s in per_run)))
    out = {"agent": agent, "baseline": baseline, "iterations": {}}
    for iteration in iterations:
        failures, reward = [], []
        for series in per_run:
            mine, base = series[agent][iteration], series[baseline][iteration]
            failures.append(float(mine["failures"] - base["failures"]))
            rewards = (mine["failure_avg_reward"], base["failure_avg_reward"])  # None: no failure to average
            reward.append(None if None in rewards else 100.0 * (rewards[0] - rewards[1]))
        present = [r for r in reward if r is not None]
        out["iterations"][iteration] = {
            "failures": {"per_seed": failures, **mean_interval(failures)},
            # over the seeds where both agents failed at least once
            "failure_reward": {"per_seed": reward, **(mean_interval(present) if present else _NO_STAT)},
        }
    return out


def failure_contrasts(
    runs: Sequence[Mapping], contrasts: Sequence[tuple[str, str]] = FAILURE_CONTRASTS
) -> list:
    """`failure_contrast` for each of `contrasts` whose two series every run has."""
    series = [dict(failure_series(run)) for run in runs]
    return [failure_contrast(runs, a, b) for a, b in contrasts if all(a in s and b in s for s in series)]
