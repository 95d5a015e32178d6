"""`coevo_jax.analysis.sampled_eval`'s paired per-task summary against a direct float64 NumPy count."""

import dataclasses

import numpy as np
import pytest
from seeds import fresh_seed
from test_data_export import episode

from coevo_jax.analysis import sampled_eval
from coevo_jax.envs.base import GRADED_SCORE


def test_paired_summary_against_numpy():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    tasks, k = 9, 4
    ours = rng.integers(0, 5, size=(tasks, k)) / 4  # rewards in quarters, 1.0 = success
    theirs = rng.integers(0, 5, size=(tasks, k)) / 4
    theirs[3] = ours[3]  # one tied task
    as_map = lambda r: {f"t{j}": [float(x) for x in r[j]] for j in range(tasks)}  # noqa: E731
    summary = sampled_eval.paired_summary(as_map(ours), as_map(theirs))
    diffs = ours.mean(axis=1) - theirs.mean(axis=1)
    assert summary["tasks"] == tasks and summary["episodes"] == tasks * k
    np.testing.assert_allclose(summary["reward"], ours.mean(), err_msg=f"seed {seed}")
    np.testing.assert_allclose(summary["success_rate"], np.mean(ours == 1.0), err_msg=f"seed {seed}")
    np.testing.assert_allclose(summary["difference"], diffs.mean(), err_msg=f"seed {seed}")
    np.testing.assert_allclose(
        summary["difference_std_error"], diffs.std(ddof=1) / np.sqrt(tasks), err_msg=f"seed {seed}"
    )
    assert summary["tasks_won"] == np.sum(diffs > 0) and summary["tasks_lost"] == np.sum(diffs < 0)
    assert summary["tasks_tied"] == np.sum(diffs == 0) >= 1


def test_paired_summary_refuses_different_task_sets():
    with pytest.raises(ValueError, match="different tasks"):
        sampled_eval.paired_summary({"a": [1.0]}, {"b": [0.0]})


def test_graded_scores_by_task_only_when_every_episode_has_one():
    def graded(traj_id, task, score):
        made = episode(traj_id, task, 0.0, "target", None)
        return dataclasses.replace(made, extra={**made.extra, "metrics": {GRADED_SCORE: score}})

    episodes = [graded("a0", "a", 0.25), graded("b0", "b", 0.0), graded("a1", "a", 0.5)]
    assert sampled_eval.graded_by_task(episodes) == {"a": [0.25, 0.5], "b": [0.0]}
    assert sampled_eval.graded_by_task([*episodes, episode("c0", "c", 1.0, "target", None)]) is None
