"""The built-in environment: the expert solves every task, random play scores low but partially, a seed fixes
the tasks, seen and unseen families are apart, and feedback, reward and records behave as documented."""

import random

import pytest

from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import ASSISTANT, write_trajectories
from coevo_jax.envs import make
from coevo_jax.envs.builtin import BuiltinEnv
from coevo_jax.envs.builtin.tasks import SEEN_FAMILIES, UNSEEN_FAMILIES
from coevo_jax.envs.builtin.world import NO_MATCH

SPLITS = ("train", "dev", "dev_unseen", "test_seen", "test_unseen")


@pytest.fixture(scope="module")
def env():
    return BuiltinEnv(seed=0)


def family(task_id: str) -> str:
    return task_id.split("/")[0]


def play(env, task_id, actions):
    """Observations and scores of `actions` from a fresh episode (stops when the task is done)."""
    observations, scores = [env.reset(task_id)], []
    for action in actions:
        observation, score, done, _ = env.step(action)
        observations.append(observation)
        scores.append(score)
        if done:
            break
    return observations, scores


def random_episode(env, task_id, rng):
    """A uniform random policy over the admissible actions, with some garbage replies mixed in."""
    env.reset(task_id)
    scores, done = [0.0], False
    while not done and len(scores) <= env.max_steps(task_id):
        action = rng.choice(env.admissible_actions()) if rng.random() < 0.9 else "dance with the stove"
        _, score, done, _ = env.step(action)
        scores.append(score)
    return scores


def test_splits_sizes_and_unknown_names(env):
    assert env.splits() == SPLITS
    assert [len(env.tasks(split)) for split in SPLITS] == [300, 100, 100, 200, 200]
    with pytest.raises(ValueError, match="validation"):
        env.tasks("validation")
    with pytest.raises(ValueError, match="heat/9999"):
        env.reset("heat/9999")
    with pytest.raises(ValueError, match=r"builtin: a task id must be a string .*got int 809; use '809'"):
        env.reset(809)
    assert 80 <= len(env.instruction.split()) <= 150


@pytest.mark.parametrize("split", SPLITS)
def test_expert_reaches_full_reward_on_every_task_within_budget(env, split):
    for task_id in env.tasks(split):
        steps = env.expert_steps(task_id)
        assert 3 <= len(env.task(task_id).subgoals) <= 6
        assert len(steps) <= env.max_steps(task_id) == 2 * len(steps) + 5
        _, scores = play(env, task_id, [s.action for s in steps])
        assert len(scores) == len(steps), f"{task_id}: done before the last expert step"
        assert scores[-1] == 1.0, task_id
        assert scores == sorted(scores) and scores[-2] < 1.0, task_id


def test_step_budget_is_configurable_and_checked():
    tight = BuiltinEnv(seed=0, num_train=5, budget_per_expert_step=1, budget_extra_steps=0)
    task_id = tight.tasks("train")[0]
    expert = [s.action for s in tight.expert_steps(task_id)]
    assert tight.max_steps(task_id) == len(expert)
    _, scores = play(tight, task_id, expert)
    assert scores[-1] == 1.0  # the expert's own length is always enough
    with pytest.raises(ValueError, match="budget_per_expert_step must be >= 1"):
        BuiltinEnv(budget_per_expert_step=0)
    with pytest.raises(ValueError, match="budget_extra_steps >= 0, got 2 and -1"):
        BuiltinEnv(budget_extra_steps=-1)


def test_stopping_one_step_short_of_the_expert_is_a_near_success(env):
    for task_id in env.tasks("test_unseen"):
        actions = [s.action for s in env.expert_steps(task_id)]
        _, scores = play(env, task_id, actions[:-1])
        assert 0.6 <= scores[-1] < 1.0, task_id


def test_random_policy_scores_low_but_partially(env):
    rng = random.Random(0)
    task_ids = env.tasks("train") + env.tasks("test_unseen")
    finals = []
    for _ in range(100):
        scores = random_episode(env, rng.choice(task_ids), rng)
        assert scores == sorted(scores), "the score went down"
        finals.append(scores[-1])
    mean = sum(finals) / len(finals)
    assert 0.0 < mean < 0.35
    assert sum(0.0 < s < 1.0 for s in finals) >= 10


def test_same_seed_same_tasks_and_observations_other_seed_other_tasks():
    first, second, other = BuiltinEnv(seed=7), BuiltinEnv(seed=7), BuiltinEnv(seed=8)
    assert all(first.tasks(split) == second.tasks(split) for split in SPLITS)
    rng = random.Random(1)
    for task_id in first.tasks("test_seen") + first.tasks("test_unseen"):
        actions = [s.action for s in first.expert_steps(task_id)]
        actions[1:1] = rng.sample(
            ["look around", "inventory", "go to workshop", "pick up knife", "mix bowl"], 3
        )
        assert play(first, task_id, actions) == play(second, task_id, actions)
    resized = BuiltinEnv(seed=7, num_train=14, num_test_seen=7, num_test_unseen=6)  # ids alone fix the worlds
    assert all(
        resized.reset(t) == first.reset(t) for t in resized.tasks("test_unseen") + resized.tasks("train")
    )
    texts = lambda e: [e.reset(t) for t in e.tasks("test_seen")]
    assert sum(a != b for a, b in zip(texts(first), texts(other), strict=True)) > 40


def test_unseen_families_are_new_and_seen_splits_are_disjoint_instances(env):
    assert (
        {family(t) for t in env.tasks("train")}
        == {family(t) for t in env.tasks("test_seen")}
        == set(SEEN_FAMILIES)
    )
    assert {family(t) for t in env.tasks("dev")} == set(SEEN_FAMILIES)
    assert {family(t) for t in env.tasks("test_unseen")} == set(UNSEEN_FAMILIES)
    assert {family(t) for t in env.tasks("dev_unseen")} == set(UNSEEN_FAMILIES)
    assert not set(SEEN_FAMILIES) & set(UNSEEN_FAMILIES)
    layouts = {split: {env.task(t).layout for t in env.tasks(split)} for split in SPLITS}
    assert {split: len(found) for split, found in layouts.items()} == dict(
        zip(SPLITS, [300, 100, 100, 200, 200], strict=True)
    )
    for first, second in [("train", "dev"), ("train", "test_seen"), ("dev", "test_seen")]:
        assert not layouts[first] & layouts[second], (first, second)
    assert not layouts["dev_unseen"] & layouts["test_unseen"]


def test_dev_and_test_splits_do_not_depend_on_the_number_of_train_tasks(env):
    larger = BuiltinEnv(seed=0, num_train=700)
    for split in ("dev", "dev_unseen", "test_seen", "test_unseen"):
        assert larger.tasks(split) == env.tasks(split), split


def test_invalid_actions_get_feedback_and_leave_the_score(env):
    task_id = env.tasks("train")[0]
    _, scores = play(env, task_id, [s.action for s in env.expert_steps(task_id)[:2]])
    score_before = scores[-1]
    assert 0.0 < score_before < 1.0
    for action, feedback in [
        ("dance with the stove", NO_MATCH),
        ("pick up unicorn", "There is no unicorn here."),
        ("go to attic", "There is no room called attic."),
        ("put unicorn in the bowl", "There is no unicorn here."),
    ]:
        observation, score, done, info = env.step(action)
        assert (observation, score, done, info["valid"]) == (feedback, score_before, False, False)
    metrics = env.episode_metrics()  # the expert's two steps were valid
    assert metrics["invalid_actions"] == 4.0 and score_before <= metrics["graded_score"] < 1.0
    env.step("go to kitchen")
    env.step("activate stove")
    assert env.step("activate stove")[0] == "The stove is already on."
    assert env.step("pick up stove")[0] == "The stove cannot be picked up."
    assert env.step("mix stove")[0] == "You can only mix things in the bowl."
    env.reset(task_id)
    assert env.episode_metrics()["invalid_actions"] == 0.0


def test_the_graded_score_counts_the_conditions_of_subgoals_not_yet_reached(env):
    """Sub-goal progress: a reached subgoal counts 1, an unreached one the most of its conditions that held at
    once; equal rewards (subgoals reached), different grades. Complete: 1.0."""
    found = 0
    for task_id in env.tasks("train")[:60]:
        task, steps = env.task(task_id), env.expert_steps(task_id)
        if len(task.subgoals[-1]) < 2:
            continue
        _, scores = play(env, task_id, [s.action for s in steps])
        assert scores[-1] == 1.0 and env.episode_metrics()["graded_score"] == 1.0
        for cut in range(len(steps)):
            _, scores = play(env, task_id, [s.action for s in steps[:cut]])
            reward = scores[-1] if scores else 0.0
            grade = env.episode_metrics()["graded_score"]
            assert reward <= grade < 1.0
            found += grade > reward
    assert found > 0  # some cut episodes hold part of a subgoal they have not reached


def test_stepping_outside_an_episode_raises():
    env = make("builtin", seed=3)
    assert isinstance(env, BuiltinEnv) and env.name == "builtin"
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look around")
    task_id = env.tasks("test_seen")[0]
    play(env, task_id, [s.action for s in env.expert_steps(task_id)])
    with pytest.raises(RuntimeError, match="complete"):
        env.step("look around")


def test_expert_trajectories_carry_thoughts_and_round_trip(env, tmp_path):
    trajectories = env.expert_trajectories("test_unseen")
    assert len(trajectories) == 200 and all(t.reward == 1.0 and t.env == "builtin" for t in trajectories)
    for trajectory in trajectories:
        replies = [m.content for m in trajectory.messages[trajectory.prompt_len :] if m.role == ASSISTANT]
        assert replies and all(r.startswith("Thought: ") and "\nAction: " in r for r in replies)
        assert trajectory.messages[0].content == env.instruction
    path = tmp_path / "expert.jsonl"
    write_trajectories(path, trajectories)
    assert read_trajectories(path) == trajectories
    assert env.expert_trajectories("test_unseen", limit=3) == trajectories[:3]
