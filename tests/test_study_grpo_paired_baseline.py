"""`studies.grpo_paired.grpo_paired_baseline`'s step-by-step comparison against a direct float64 NumPy count."""

import numpy as np
import pytest
from seeds import fresh_seed

from studies.grpo_paired import grpo_paired_baseline as paired


def _steps(rng, rewards):
    """rewards: [steps, tasks, K] -> the per-step views the comparison takes (random log-probs)."""
    return [
        {
            "rewards": {f"t{j}": [float(r) for r in step[j]] for j in range(step.shape[0])},
            "logprobs": [list(-rng.exponential(size=rng.integers(1, 6))) for _ in range(step.size)],
        }
        for step in rewards
    ]


def test_paired_stats_against_numpy():
    rng = np.random.default_rng(fresh_seed())
    steps, tasks, k = 7, 4, 3
    ours_r = rng.integers(0, 5, size=(steps, tasks, k)) / 4
    theirs_r = rng.integers(0, 5, size=(steps, tasks, k)) / 4
    ours_r[2] = theirs_r[2]  # one tied step
    ours, theirs = _steps(rng, ours_r), _steps(rng, theirs_r)
    stats = paired.paired_stats(ours, theirs)
    diffs = ours_r.reshape(steps, -1).mean(1) - theirs_r.reshape(steps, -1).mean(1)
    assert [r["difference"] for r in stats["steps"]] == pytest.approx(diffs, abs=1e-12)
    assert stats["mean_difference"] == pytest.approx(diffs.mean(), abs=1e-12)
    assert stats["difference_std_error"] == pytest.approx(diffs.std(ddof=1) / np.sqrt(steps), abs=1e-12)
    assert (stats["steps_won"], stats["steps_lost"], stats["steps_tied"]) == (
        int((diffs > 0).sum()),
        int((diffs < 0).sum()),
        int((diffs == 0).sum()),
    )
    assert stats["mean_task_difference"] == pytest.approx(
        (ours_r.mean(2) - theirs_r.mean(2)).mean(), abs=1e-12
    )
    for row, view in zip(stats["steps"], ours, strict=True):
        flat = np.concatenate([np.asarray(x, np.float64) for x in view["logprobs"]])
        assert row["entropy"] == pytest.approx(-flat.mean(), abs=1e-12)


def test_paired_stats_refuse_steps_on_different_tasks():
    one = {"rewards": {"a": [1.0, 0.0]}, "logprobs": [[-0.5]]}
    other = {"rewards": {"b": [1.0, 0.0]}, "logprobs": [[-0.5]]}
    with pytest.raises(ValueError, match="step 1: the two policies played different tasks"):
        paired.paired_stats([one], [other])
    with pytest.raises(ValueError, match="1 trained steps against 2 baseline steps"):
        paired.paired_stats([one], [one, one])
    assert paired.step_entropy([[], []]) is None
    assert paired.moving_average([1.0, 3.0, 5.0], window=2) == [1.0, 2.0, 4.0]
