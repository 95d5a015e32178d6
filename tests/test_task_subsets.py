"""Which tasks a run explores and evaluates: the first N, or N spread over the split."""

import pytest

from coevo_jax.envs.sciworld.data import load_data, split_task_id
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.task_subsets import pick_tasks

TASKS = [f"t{i}" for i in range(10)]


def test_first_takes_the_leading_tasks_and_spread_takes_every_len_over_n_th():
    assert pick_tasks(TASKS, 3, "first") == ["t0", "t1", "t2"]
    assert pick_tasks(TASKS, 3, "spread") == ["t0", "t3", "t6"]
    assert pick_tasks(TASKS, 4, "spread") == ["t0", "t2", "t5", "t7"]
    assert pick_tasks(TASKS, 0, "spread") == []


@pytest.mark.parametrize("subset", ["first", "spread"])
def test_no_count_or_a_count_past_the_split_keeps_every_task_in_order(subset):
    assert pick_tasks(TASKS, None, subset) == TASKS
    assert pick_tasks(TASKS, 10, subset) == TASKS
    assert pick_tasks(TASKS, 99, subset) == TASKS


@pytest.mark.parametrize("count", range(1, 10))
def test_spread_picks_distinct_tasks_in_split_order(count):
    picked = pick_tasks(TASKS, count, "spread")
    assert len(picked) == len(set(picked)) == count
    assert picked == sorted(picked, key=TASKS.index)


def test_spread_keeps_the_mix_of_a_split_sorted_by_kind():
    """ETO's ScienceWorld unseen test lists its tasks by kind: its first 16 are two kinds, 16 spread are many."""
    unseen = load_data().splits["test_unseen"]
    kinds = lambda ids: {split_task_id(t)[0] for t in ids}  # noqa: E731
    assert len(kinds(pick_tasks(unseen, 16, "first"))) <= 2
    assert len(kinds(pick_tasks(unseen, 16, "spread"))) >= 12


def test_an_unknown_subset_is_refused_by_the_function_and_the_config():
    with pytest.raises(ValueError, match="'random'"):
        pick_tasks(TASKS, 2, "random")
    with pytest.raises(ValueError, match="env.task_subset 'random'"):
        ExperimentConfig.from_mapping({"env": {"task_subset": "random"}})
    with pytest.raises(ValueError, match="count must be >= 0"):
        pick_tasks(TASKS, -1, "first")
