"""room_recall against the built-in environment's own expert episodes, written as rollout files are."""

import dataclasses
import json
import random
import re

import pytest

from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import ASSISTANT, USER, Message, Trajectory, write_trajectories
from coevo_jax.envs.builtin import BuiltinEnv
from coevo_jax.envs.builtin.world import ROOMS
from studies.equal_budget import room_recall


@pytest.fixture(scope="module")
def expert_records(tmp_path_factory):
    env = BuiltinEnv(seed=0)
    path = tmp_path_factory.mktemp("rollouts") / "experts.jsonl"
    write_trajectories(path, env.expert_trajectories("test_seen") + env.expert_trajectories("test_unseen"))
    return read_trajectories(path)


def test_experts_never_misplace_a_thing(expert_records):
    count = room_recall.recall_count(expert_records)
    assert count == room_recall.RecallCount(episodes=400, failures=0, misplaced=0, misplaced_failures=0)


def test_an_expert_read_against_a_task_text_with_another_room_is_caught(expert_records):
    """Moving one thing to another room in the task text makes the expert's restatements of it wrong."""
    rng = random.Random(0)
    caught = 0
    for record in expert_records:
        task = record.instruction
        thing, room = rng.choice(room_recall.TASK_ROOM.findall(task))
        other = rng.choice([r for r in ROOMS if r != room])
        task_turn = record.prompt_len - 1
        edited_task = task.replace(f"The {thing} is in the {room}.", f"The {thing} is in the {other}.")
        messages = list(record.messages)
        messages[task_turn] = dataclasses.replace(messages[task_turn], content=edited_task)
        wrong = room_recall.misplaced_claims(dataclasses.replace(record, messages=tuple(messages)))
        assert {(t, given) for t, given, _ in wrong} <= {(thing, other)}
        assert all(claimed == room for _, _, claimed in wrong)
        restated = any(
            re.search(rf"the {thing}(; it is in the {room}|, and it is here)\.", action)
            for action in record.actions
        )
        assert bool(wrong) == restated
        caught += bool(wrong)
    assert caught > 300  # most experts restate where the thing they carry is


def _episode(task, turns, reward=0.0):
    messages = [Message(USER, "system"), Message(ASSISTANT, "OK"), Message(USER, task)]
    for reply, observation in turns:
        messages.append(Message(ASSISTANT, f"Thought: {reply}\nAction: x"))
        messages.append(Message(USER, f"Observation: {observation}"))
    return Trajectory(traj_id="e", task_id="t", messages=tuple(messages), reward=reward, prompt_len=3)


TASK = "Your task is to slice the tomato. The tomato is in the hallway. The knife is in the greenhouse. You are in the kitchen."


def test_here_is_the_room_the_agent_stands_in_and_held_things_are_skipped():
    episode = _episode(
        TASK,
        [
            ("I need the tomato, and it is here.", "There is no tomato here."),  # in the kitchen: wrong
            (
                "The task is about the tomato; it is in the hallway.",
                "You go to the hallway. You see a tomato.",
            ),
            ("I need the tomato, and it is here.", "You pick up the tomato."),  # right
            ("I need the knife; it is in the kitchen.", "You go to the kitchen."),  # wrong
            ("I need the tomato; it is in the workshop.", "You go to the workshop."),  # held: not counted
        ],
    )
    assert room_recall.misplaced_claims(episode) == [
        ("tomato", "hallway", "kitchen"),
        ("knife", "greenhouse", "kitchen"),
    ]
    right = _episode(TASK, [("I need the knife; it is in the greenhouse.", "You go to the greenhouse.")], 1.0)
    count = room_recall.recall_count([episode, right, dataclasses.replace(episode, reward=1.0)])
    assert count == room_recall.RecallCount(episodes=3, failures=1, misplaced=2, misplaced_failures=1)


def test_a_record_that_is_no_episode_is_named(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    good = _episode(TASK, [("I need the knife; it is in the kitchen.", "x")])
    write_trajectories(path, [good])
    room_recall.main([str(path)])
    assert f"| {path} | 1 | 1 | 1 | 1 |" in capsys.readouterr().out
    path.write_text(path.read_text() + json.dumps({"id": "bad", "conversations": []}) + "\n")
    with pytest.raises(DataFormatError, match=r"rollouts.jsonl: record 1: field"):
        room_recall.main([str(path)])
