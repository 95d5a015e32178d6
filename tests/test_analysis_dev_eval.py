"""`coevo_jax.analysis.dev_eval`'s choice of held-out train tasks."""

import pytest

from coevo_jax.analysis import dev_eval


def test_dev_tasks_follow_the_last_expert_task():
    train = [f"t{i}" for i in range(10)]
    # experts on t0..t3, one task (t2) without an expert: the dev tasks start after t3 all the same
    assert dev_eval.dev_tasks(train, ["t0", "t1", "t3"], 3) == ["t4", "t5", "t6"]


def test_dev_tasks_are_never_expert_tasks_and_too_few_is_an_error():
    train = [f"t{i}" for i in range(6)]
    tasks = dev_eval.dev_tasks(train, ["t0", "t1"], 4)
    assert not set(tasks) & {"t0", "t1"}
    with pytest.raises(ValueError, match="only 4 train tasks"):
        dev_eval.dev_tasks(train, ["t0", "t1"], 5)
