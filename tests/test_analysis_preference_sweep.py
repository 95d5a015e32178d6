"""The preference sweep's rows against a direct count on synthetic results, and its command line."""

import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
from seeds import fresh_seed

from coevo_jax.analysis import preference_sweep

SPLITS = ["dev", "dev_unseen"]


def _eval(rng, tasks):
    out = {}
    for split in SPLITS:
        rewards = {f"{split}/{t}": float(rng.choice([0.0, 0.5, 1.0])) for t in range(tasks)}
        out[split] = {
            "episodes": tasks,
            "avg_reward": float(np.mean(list(rewards.values()))),
            "success_rate": float(np.mean([r == 1.0 for r in rewards.values()])),
            "invalid_format": int(rng.integers(0, 5)),
            "metrics": {"invalid_actions": float(rng.uniform(0, 3))},
            "task_rewards": rewards,
        }
    return out


def _results(rng, lr, beta, tasks=20):
    train = {"steps": 48, "learning_rate": lr, "beta": beta, "pairs": 120}
    train.update(final_reward_accuracy=float(rng.uniform()), final_reward_margin=float(rng.normal()))
    return {
        "env": "builtin",
        "seed": 0,
        "splits": SPLITS,
        "methods": {
            "SFT": {"iterations": [{"iteration": 0, "eval": _eval(rng, tasks)}]},
            "ETO": {"iterations": [{"iteration": 1, "eval": _eval(rng, tasks), "train": {"target": train}}]},
        },
    }


def test_rows_count_the_decisions_each_setting_changed():
    rng = np.random.default_rng(fresh_seed())
    results = _results(rng, 1e-5, 0.5)
    (row,) = preference_sweep.sweep_rows(results)
    assert (row["method"], row["learning_rate"], row["beta"], row["steps"]) == ("ETO", 1e-5, 0.5, 48)
    for split in SPLITS:
        mine = results["methods"]["ETO"]["iterations"][0]["eval"][split]
        base = results["methods"]["SFT"]["iterations"][0]["eval"][split]
        diffs = [mine["task_rewards"][t] - base["task_rewards"][t] for t in base["task_rewards"]]
        cell = row["splits"][split]
        assert cell["changes"]["up"] == sum(d > 0 for d in diffs)
        assert cell["changes"]["down"] == sum(d < 0 for d in diffs)
        assert cell["delta_reward"] == pytest.approx(100 * (mine["avg_reward"] - base["avg_reward"]))
        assert cell["invalid"] == (mine["metrics"]["invalid_actions"], mine["invalid_format"] / 20)
    with pytest.raises(ValueError, match="baseline 'RFT'"):
        preference_sweep.sweep_rows(results, baseline="RFT")


def test_cli_prints_a_row_per_run(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    for name, lr in (("a", 1e-5), ("b", 3e-5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(_results(rng, lr, 0.1)))
    proc = subprocess.run(
        [sys.executable, "-m", "coevo_jax.analysis", "preference_sweep", tmp_path / "a", tmp_path / "b"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| a ") or line.startswith("| b ")]
    assert len(rows) == 2 and "| 1e-05 |" in rows[0] and "| 3e-05 |" in rows[1]
    pooled = [line for line in proc.stdout.splitlines() if line.startswith("| ETO | 1 |")]
    assert len(pooled) == 2 and "| 1e-05 | 0.1 | 0 |" in pooled[0]
    bad = subprocess.run(
        [sys.executable, "-m", "coevo_jax.analysis", "preference_sweep", tmp_path / "missing"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "missing" in bad.stderr


def test_settings_pool_their_seeds_with_a_paired_t_interval():
    seed = fresh_seed()
    print("seed", seed)
    rng = np.random.default_rng(seed)
    runs = []
    for lr in (1e-5, 3e-5):
        for run_seed in range(4):
            results = _results(rng, lr, 0.1)
            results["seed"] = run_seed
            runs.append(results)
    rows = [row for results in runs for row in preference_sweep.sweep_rows(results)]
    summaries = preference_sweep.setting_summaries(rows)
    assert [(s["learning_rate"], s["seeds"]) for s in summaries] == [
        (1e-5, [0, 1, 2, 3]),
        (3e-5, [0, 1, 2, 3]),
    ]
    for summary, members in zip(summaries, (runs[:4], runs[4:]), strict=True):
        for split in SPLITS:
            deltas, ups, downs = [], 0, 0
            for results in members:
                mine = results["methods"]["ETO"]["iterations"][0]["eval"][split]["task_rewards"]
                base = results["methods"]["SFT"]["iterations"][0]["eval"][split]["task_rewards"]
                diffs = np.array([mine[t] - base[t] for t in base], dtype=np.float64)
                deltas.append(100 * diffs.mean())
                ups += int((diffs > 0).sum())
                downs += int((diffs < 0).sum())
            low, high = scipy.stats.t.interval(
                0.95, len(deltas) - 1, loc=np.mean(deltas), scale=scipy.stats.sem(deltas)
            )
            cell = summary["splits"][split]
            assert cell["interval"]["mean"] == pytest.approx(np.mean(deltas), abs=1e-9)
            assert (cell["interval"]["low"], cell["interval"]["high"]) == pytest.approx((low, high), abs=1e-6)
            assert (cell["up"], cell["down"]) == (ups, downs)
            invalid = [
                r["methods"]["ETO"]["iterations"][0]["eval"][split]["metrics"]["invalid_actions"]
                for r in members
            ]
            assert cell["invalid"] == pytest.approx(np.mean(invalid))
        accuracy = [
            r["methods"]["ETO"]["iterations"][0]["train"]["target"]["final_reward_accuracy"] for r in members
        ]
        assert summary["accuracy"] == pytest.approx(np.mean(accuracy))
    table = preference_sweep.summary_markdown(runs)
    assert table.count("| ETO | 1 |") == 2
    runs[1]["seed"] = 0
    with pytest.raises(ValueError, match="two runs of one seed"):
        preference_sweep.setting_summaries([r for res in runs[:4] for r in preference_sweep.sweep_rows(res)])
