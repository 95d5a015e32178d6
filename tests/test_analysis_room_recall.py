"""room_recall against the built-in environment's own expert episodes, written as rollout files are."""

import json
import random
import re

import pytest

from coevo_jax.analysis import room_recall
from coevo_jax.data.records import write_trajectories
from coevo_jax.envs.builtin import BuiltinEnv
from coevo_jax.envs.builtin.world import ROOMS


@pytest.fixture(scope="module")
def expert_records(tmp_path_factory):
    env = BuiltinEnv(seed=0)
    path = tmp_path_factory.mktemp("rollouts") / "experts.jsonl"
    write_trajectories(path, env.expert_trajectories("test_seen") + env.expert_trajectories("test_unseen"))
    return room_recall.read_records(str(path))


def test_experts_never_misplace_a_thing(expert_records):
    count = room_recall.recall_count(expert_records)
    assert count == room_recall.RecallCount(episodes=400, failures=0, misplaced=0, misplaced_failures=0)


def test_an_expert_read_against_a_task_text_with_another_room_is_caught(expert_records):
    """Moving one thing to another room in the task text makes the expert's restatements of it wrong."""
    rng = random.Random(0)
    caught = 0
    for record in expert_records:
        task = record["conversations"][room_recall.TASK_TURN]["value"]
        thing, room = rng.choice(room_recall.TASK_ROOM.findall(task))
        other = rng.choice([r for r in ROOMS if r != room])
        edited = json.loads(json.dumps(record))
        edited["conversations"][room_recall.TASK_TURN]["value"] = task.replace(
            f"The {thing} is in the {room}.", f"The {thing} is in the {other}."
        )
        wrong = room_recall.misplaced_claims(edited["conversations"])
        assert {(t, given) for t, given, _ in wrong} <= {(thing, other)}
        assert all(claimed == room for _, _, claimed in wrong)
        restated = any(
            re.search(rf"the {thing}(; it is in the {room}|, and it is here)\.", turn["value"])
            for turn in record["conversations"][room_recall.TASK_TURN + 1 :]
            if turn["from"] == "gpt"
        )
        assert bool(wrong) == restated
        caught += bool(wrong)
    assert caught > 300  # most experts restate where the thing they carry is


def _episode(task, turns, reward=0.0):
    conversations = [{"from": "human", "value": "system"}, {"from": "gpt", "value": "OK"}]
    conversations.append({"from": "human", "value": task})
    for reply, observation in turns:
        conversations.append({"from": "gpt", "value": f"Thought: {reply}\nAction: x"})
        conversations.append({"from": "human", "value": f"Observation: {observation}"})
    return {"reward": reward, "conversations": conversations}


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
    assert room_recall.misplaced_claims(episode["conversations"]) == [
        ("tomato", "hallway", "kitchen"),
        ("knife", "greenhouse", "kitchen"),
    ]
    right = _episode(TASK, [("I need the knife; it is in the greenhouse.", "You go to the greenhouse.")], 1.0)
    count = room_recall.recall_count([episode, right, dict(episode, reward=1.0)])
    assert count == room_recall.RecallCount(episodes=3, failures=1, misplaced=2, misplaced_failures=1)


def test_a_line_that_is_no_episode_is_named(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(_episode(TASK, [])) + "\n" + json.dumps({"reward": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"rollouts.jsonl, line 2: not an episode record"):
        room_recall.read_records(str(path))
    path.write_text(json.dumps(_episode(TASK, [("I need the knife; it is in the kitchen.", "x")])) + "\n")
    room_recall.main([str(path)])
    assert f"| {path} | 1 | 1 | 1 | 1 |" in capsys.readouterr().out
