"""Paired contrasts over seeds: the Student-t quantile and interval against SciPy on fresh random inputs, and
the per-seed differences and decision changes against a direct computation on synthetic results."""

import numpy as np
import pytest
import scipy.special
import scipy.stats
from seeds import fresh_seed

from coevo_jax.reporting import paired

SPLITS = ["test_seen", "test_unseen"]


def test_incomplete_beta_and_t_quantile_match_scipy():
    rng = np.random.default_rng(fresh_seed())
    for _ in range(200):
        a, b, x = rng.uniform(0.05, 30), rng.uniform(0.05, 30), rng.uniform()
        assert paired.incomplete_beta(a, b, x) == pytest.approx(scipy.special.betainc(a, b, x), abs=1e-12)
    for df in [1, 2, 3, 4, 9, 29, 200, *rng.uniform(0.5, 60, 20)]:
        p = rng.uniform(0.001, 0.999)
        for q in (p, 0.975, 0.5 + rng.uniform(0, 0.499)):
            assert paired.student_t_quantile(q, df) == pytest.approx(
                scipy.stats.t.ppf(q, df), rel=1e-9, abs=1e-9
            )
        t = rng.normal() * 5
        assert paired.student_t_cdf(t, df) == pytest.approx(scipy.stats.t.cdf(t, df), abs=1e-12)
    with pytest.raises(ValueError):
        paired.student_t_quantile(1.0, 3)


def test_mean_interval_matches_scipy():
    rng = np.random.default_rng(fresh_seed())
    for n in (2, 3, 5, 10):
        x = rng.normal(rng.normal() * 5, rng.uniform(0.1, 10), n)
        got = paired.mean_interval(x)
        low, high = scipy.stats.t.interval(0.95, n - 1, loc=np.mean(x), scale=scipy.stats.sem(x))
        assert got["low"] == pytest.approx(low, rel=1e-9) and got["high"] == pytest.approx(high, rel=1e-9)
        assert got["std"] == pytest.approx(np.std(x, ddof=1)) and got["n"] == n
    assert paired.mean_interval([2.5]) == {"mean": 2.5, "std": None, "n": 1, "low": None, "high": None}


def _run(rng, seed, methods, tasks):
    out = {"env": "builtin", "seed": seed, "splits": SPLITS, "methods": {}}
    for method in methods:
        evals = {}
        for split in SPLITS:
            rewards = {f"{split}/{t}": float(rng.choice([0.0, 0.25, 0.5, 1.0])) for t in range(tasks)}
            evals[split] = {
                "avg_reward": float(np.mean(list(rewards.values()))),
                "success_rate": float(np.mean([r == 1.0 for r in rewards.values()])),
                "task_rewards": rewards,
            }
        out["methods"][method] = {"iterations": [{"iteration": 0, "eval": evals}]}
    return out


def test_paired_contrast_is_the_per_seed_difference_with_its_interval_and_decisions():
    rng = np.random.default_rng(fresh_seed())
    runs = [_run(rng, seed, ["SFT", "ETO"], tasks=30) for seed in range(5)]
    got = paired.paired_contrast(runs, "ETO", "SFT")
    for split in SPLITS:
        evals = [
            (
                r["methods"]["ETO"]["iterations"][0]["eval"][split],
                r["methods"]["SFT"]["iterations"][0]["eval"][split],
            )
            for r in runs
        ]
        reward = [100 * (m["avg_reward"] - b["avg_reward"]) for m, b in evals]
        success = [100 * (m["success_rate"] - b["success_rate"]) for m, b in evals]
        cell = got["splits"][split]
        np.testing.assert_allclose(cell["reward"]["per_seed"], reward, atol=1e-9)
        np.testing.assert_allclose(cell["success"]["per_seed"], success, atol=1e-9)
        low, high = scipy.stats.t.interval(0.95, 4, loc=np.mean(reward), scale=scipy.stats.sem(reward))
        assert cell["reward"]["low"] == pytest.approx(low) and cell["reward"]["high"] == pytest.approx(high)
        for (m, b), changes in zip(evals, cell["changes"], strict=True):
            diffs = [m["task_rewards"][t] - b["task_rewards"][t] for t in b["task_rewards"]]
            assert changes == {
                "up": sum(d > 0 for d in diffs),
                "down": sum(d < 0 for d in diffs),
                "same": sum(d == 0 for d in diffs),
            }
    assert [c["method"] for c in paired.paired_contrasts(runs)] == ["ETO"]  # the others lack a method
    with pytest.raises(ValueError, match="'RFT' is missing"):
        paired.paired_contrast(runs, "RFT", "SFT")


def test_runs_without_task_rewards_show_no_decision_counts():
    rng = np.random.default_rng(fresh_seed())
    runs = [_run(rng, seed, ["SFT", "ETO"], tasks=4) for seed in range(2)]
    for run in runs:
        for split in SPLITS:
            del run["methods"]["SFT"]["iterations"][0]["eval"][split]["task_rewards"]
    assert paired.paired_contrast(runs, "ETO", "SFT")["splits"]["test_seen"]["changes"] == [None, None]
