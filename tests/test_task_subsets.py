"""Which tasks a run evaluates (the first N, or N spread over the split) and explores (the first N, which
must include tasks with an expert for ETO and co-evolution)."""

import dataclasses

import pytest

from coevo_jax import envs
from coevo_jax.data.records import Message, Trajectory, write_trajectories
from coevo_jax.envs.sciworld.data import load_data, split_task_id
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.experts import EXPERTS_FILE, generate_experts
from coevo_jax.experiment.run import run
from coevo_jax.experiment.store import CONFIG_FILE
from coevo_jax.experiment.task_subsets import ALL_WITH_EXPERTS, explored_tasks, pick_tasks, tasks_with_experts

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
    with pytest.raises(ValueError, match="env.eval_task_subset 'random'"):
        ExperimentConfig.from_mapping({"env": {"eval_task_subset": "random"}})
    with pytest.raises(ValueError, match="count must be >= 0"):
        pick_tasks(TASKS, -1, "first")


def _expert(task_id: str) -> Trajectory:
    messages = (Message("user", f"do {task_id}"), Message("assistant", "Thought: done.\nAction: finish"))
    return Trajectory(traj_id=f"expert/{task_id}", task_id=task_id, messages=messages, reward=1.0)


def test_tasks_with_experts_keeps_the_covered_tasks_in_task_order():
    experts = [_expert("t7"), _expert("t2"), _expert("elsewhere"), _expert("t2")]
    assert tasks_with_experts(TASKS, experts) == ["t2", "t7"]
    assert tasks_with_experts(TASKS, []) == []


def test_explored_tasks_are_the_first_n_or_every_one_with_an_expert():
    experts = [_expert("t7"), _expert("t2"), _expert("elsewhere")]
    assert explored_tasks(TASKS, ALL_WITH_EXPERTS, experts) == ["t2", "t7"]
    assert explored_tasks(TASKS, 3, experts) == ["t0", "t1", "t2"]  # the first N, with or without experts
    assert explored_tasks(TASKS, None, experts) == TASKS
    assert explored_tasks(TASKS, ALL_WITH_EXPERTS, []) == []
    with pytest.raises(
        ValueError, match="env.explore_tasks -1: .* 0 for every train task that has an expert"
    ):
        ExperimentConfig.from_mapping({"env": {"explore_tasks": -1}})


def _tiny_builtin_config(**env_changes) -> ExperimentConfig:
    """A one-layer policy on 6 built-in train tasks (nothing trains: the tests stop before)."""
    env = {"name": "builtin", "kwargs": {"seed": 0, "num_train": 6, "num_test_seen": 2, "num_test_unseen": 2}}
    config = {"methods": ("sft", "eto"), "env": {**env, **env_changes}, "model": {"num_layers": 1}}
    return ExperimentConfig.from_mapping(config)


def test_a_run_explores_the_first_train_tasks_whatever_the_eval_subset(tmp_path):
    """`spread` once picked the explored train tasks too: 1 of 32 ScienceWorld tasks had its expert, and
    ETO built no pair. The explored tasks are the first N, those the environment's experts come from."""
    cfg = _tiny_builtin_config(explore_tasks=3, expert_tasks=3, eval_task_subset="spread")
    cfg = dataclasses.replace(cfg, methods=("zero_shot",))  # evaluates the untrained policy: seconds
    results = run(cfg, str(tmp_path / "run"))
    assert results["counts"]["train_tasks"] == results["counts"]["train_tasks_with_experts"] == 3
    env = envs.make("builtin", **dict(cfg.env.kwargs))
    experts = generate_experts(env, cfg.env)
    assert tasks_with_experts(pick_tasks(env.tasks("train"), 3, "spread"), experts) != pick_tasks(
        env.tasks("train"), 3, "spread"
    )  # the spread pick would have left tasks without an expert


def test_a_run_whose_explored_tasks_have_no_expert_is_refused_before_it_writes(tmp_path):
    """ETO pairs each explored episode with its own task's expert: experts of other tasks would give none."""
    cfg = _tiny_builtin_config(explore_tasks=2, expert_tasks=3)
    env = envs.make("builtin", **dict(cfg.env.kwargs))
    others = [dataclasses.replace(t, task_id=f"other/{t.task_id}") for t in generate_experts(env, cfg.env)]
    path = tmp_path / "experts.jsonl"
    write_trajectories(str(path), others)
    cfg = _tiny_builtin_config(explore_tasks=2, expert_tasks=3, experts_path=str(path))
    workdir = tmp_path / "run"
    with pytest.raises(
        ValueError, match=r"none of the 2 explored train tasks .* 3 expert trajectories .* eto"
    ):
        run(cfg, str(workdir))
    assert not (workdir / CONFIG_FILE).exists() and not (workdir / EXPERTS_FILE).exists()


def test_a_run_with_explore_tasks_0_explores_every_train_task_that_has_an_expert(tmp_path):
    """Experts of train tasks 1, 3 and 4 of 6 (from a file): those three are explored, in split order."""
    cfg = _tiny_builtin_config(expert_tasks=6)
    env = envs.make("builtin", **dict(cfg.env.kwargs))
    train = env.tasks("train")
    chosen = [t for t in generate_experts(env, cfg.env) if t.task_id in {train[1], train[3], train[4]}]
    path = tmp_path / "experts.jsonl"
    write_trajectories(str(path), chosen)
    cfg = _tiny_builtin_config(explore_tasks=ALL_WITH_EXPERTS, experts_path=str(path))
    results = run(dataclasses.replace(cfg, methods=("zero_shot",)), str(tmp_path / "run"))
    assert results["counts"]["train_tasks"] == results["counts"]["train_tasks_with_experts"] == 3
    assert results["config"]["env"]["explore_tasks"] == 0


def test_explore_tasks_0_with_no_train_task_covered_is_refused_before_it_writes(tmp_path):
    cfg = _tiny_builtin_config(expert_tasks=2)
    env = envs.make("builtin", **dict(cfg.env.kwargs))
    others = [dataclasses.replace(t, task_id=f"other/{t.task_id}") for t in generate_experts(env, cfg.env)]
    path = tmp_path / "experts.jsonl"
    write_trajectories(str(path), others)
    cfg = _tiny_builtin_config(explore_tasks=ALL_WITH_EXPERTS, experts_path=str(path))
    workdir = tmp_path / "run"
    with pytest.raises(
        ValueError, match=r"explore_tasks = 0 .* none of the 6 train tasks .* eto would explore"
    ):
        run(cfg, str(workdir))
    assert not (workdir / CONFIG_FILE).exists() and not (workdir / EXPERTS_FILE).exists()
