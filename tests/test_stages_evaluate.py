"""`Stages.evaluate`: the pending splits play in one rollout, each split gets its own file and stage record."""

import json
import os
import types

import pytest

from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import ASSISTANT, USER, Message, Trajectory
from coevo_jax.experiment import rollouts, stages
from coevo_jax.experiment.store import RunStore

EVAL_TASKS = {"test_seen": ["a", "b", "c"], "test_unseen": ["d", "b", "e"]}  # "b" in both splits
REWARDS = {"a": 1.0, "b": 0.5, "c": 0.0, "d": 1.0, "e": 0.25}


@pytest.fixture
def evaluation(tmp_path, monkeypatch):
    """Stages over a fresh workdir whose rollouts are faked: each call's task list is recorded."""
    calls = []

    def play(setup, params, env_factory, task_ids, path, **kwargs):
        calls.append((list(task_ids), path))
        played = [
            Trajectory(
                traj_id=f"{task}-0",
                task_id=task,
                messages=(Message(USER, task), Message(ASSISTANT, "Thought: x\nAction: y")),
                reward=REWARDS[task],
                agent="target",
            )
            for task in task_ids
        ]
        with open(path, "w") as f:  # the joint file exists while the evaluation runs, as a real one would
            f.write("")
        return played

    monkeypatch.setattr(rollouts, "play", play)
    monkeypatch.setattr(stages.Stages, "params", lambda self, name: {})
    setup = types.SimpleNamespace(cfg=types.SimpleNamespace(seed=0))
    store = RunStore(str(tmp_path))
    os.makedirs(store.path(stages.ROLLOUTS_DIR), exist_ok=True)
    make = lambda: stages.Stages(setup, RunStore(str(tmp_path)), None, [], [], EVAL_TASKS)  # noqa: E731
    return make, calls, store


def test_the_splits_play_in_one_call_and_each_gets_its_own_file_and_summary(evaluation):
    make, calls, store = evaluation
    out = make().evaluate("sft_target")
    assert calls == [(["a", "b", "c", "d", "e"], store.path(stages.joint_eval_file("sft_target")))]
    for split, tasks in EVAL_TASKS.items():
        episodes = read_trajectories(store.path(stages.eval_file("sft_target", split)))
        assert [t.task_id for t in episodes] == tasks
        assert out[split] == rollouts.summarize_eval(episodes)
        assert out[split]["task_rewards"] == {t.task_id: t.reward for t in episodes}
    assert out["test_seen"]["avg_reward"] == pytest.approx(0.5)
    assert out["test_unseen"]["avg_reward"] == pytest.approx(1.75 / 3)
    assert not os.path.exists(store.path(stages.joint_eval_file("sft_target")))


def test_a_done_evaluation_plays_nothing_and_a_half_done_one_plays_only_the_pending_split(evaluation):
    make, calls, store = evaluation
    first = make().evaluate("sft_target")
    assert make().evaluate("sft_target") == first and len(calls) == 1

    stages_file = store.path("stages.json")
    records = json.load(open(stages_file))
    del records["eval/sft_target/test_unseen"]
    with open(stages_file, "w") as f:
        json.dump(records, f)
    again = make().evaluate("sft_target")
    assert calls[1][0] == ["d", "b", "e"]
    assert again == first
