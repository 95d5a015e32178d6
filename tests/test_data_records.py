"""Trajectory records (lossless JSONL, strict reader, skip_bad) and converters, on real and malformed data."""

import copy
import json
import logging
import os

import pytest

from coevo_jax.data.converters import (
    INTERCODE_SQL_INSTRUCTION,
    icl_examples_to_trajectories,
    read_icl_examples,
    read_intercode_trajectories,
)
from coevo_jax.data.json_files import DataFormatError, load_json_records
from coevo_jax.data.record_reader import parse_record, read_trajectories
from coevo_jax.data.records import (
    ASSISTANT,
    USER,
    Message,
    Trajectory,
    Turn,
    trajectory_to_record,
    write_trajectories,
)

DATA = os.path.join(os.path.dirname(__file__), "data")
ICL = os.path.join(DATA, "eto_icl")
INTERCODE = os.path.join(DATA, "intercode", "ic_sql_gpt-4_sample.json")
RECORDS = os.path.join(DATA, "eto_records.jsonl")


def instruction(env):
    with open(os.path.join(ICL, f"{env}_inst.txt")) as f:
        return f.read()


@pytest.mark.parametrize(
    "env, num_messages, first_words, last_action",
    [
        (
            "alfworld",
            10,
            "You are in the middle of a room.",
            "Action: put toiletpaper 1 in/on toiletpaperhanger 1",
        ),
        (
            "sciworld",
            14,
            "Your task is to use chemistry to create green paint.",
            "Action: focus on green paint",
        ),
        ("webshop", 8, "Observation:\nWebShop [SEP] Instruction:", "Action: click[Buy Now]"),
    ],
)
def test_real_eto_icl_examples_parse(env, num_messages, first_words, last_action):
    (trajectory,) = read_icl_examples(os.path.join(ICL, f"{env}_icl.json"), env_name=env)
    assert len(trajectory.messages) == num_messages
    assert [m.role for m in trajectory.messages] == [USER, ASSISTANT] * (num_messages // 2)
    assert trajectory.messages[0].content.startswith(first_words)
    assert trajectory.actions[-1].endswith(last_action)
    assert all(a.startswith("Thought: ") and "\nAction: " in a for a in trajectory.actions)
    assert (trajectory.reward, trajectory.agent, trajectory.prompt_len, trajectory.env) == (
        1.0,
        "expert",
        1,
        env,
    )
    assert trajectory.iteration is None and trajectory.sampling == {}


def test_icl_instruction_gives_eto_layout():
    (plain,) = read_icl_examples(os.path.join(ICL, "webshop_icl.json"), env_name="webshop")
    (eto,) = read_icl_examples(
        os.path.join(ICL, "webshop_icl.json"), env_name="webshop", instruction=instruction("webshop")
    )
    assert eto.messages[:2] == (Message(USER, instruction("webshop").rstrip()), Message(ASSISTANT, "OK"))
    assert eto.messages[2:] == plain.messages and eto.prompt_len == 3
    assert eto.actions == plain.actions and eto.instruction == plain.messages[0].content


def test_real_intercode_episodes_parse():
    trajectories = read_intercode_trajectories(INTERCODE, dbs={"8": "cre_Doc_Template_Mgt"})
    with open(INTERCODE) as f:
        raw = json.load(f)
    assert [t.task_id for t in trajectories] == [f"intercode_sql_{k}" for k in raw]
    assert [round(t.reward, 4) for t in trajectories] == [1.0, 1.0, 0.0, 0.6667, 0.0, 1.0, 0.25]
    for trajectory, episode in zip(trajectories, raw.values(), strict=True):
        history = episode["turn_history"]
        assert trajectory.actions == tuple(f"Action: {a}" for a in history["actions"])
        assert trajectory.observations == tuple(f"Observation: {o}" for o in history["observations"][:-1])
        assert trajectory.turns[-1] == Turn(trajectory.actions[-1], None)
        assert [m.content for m in trajectory.prompt[:2]] == [INTERCODE_SQL_INSTRUCTION, "OK"]
        assert trajectory.instruction.endswith(f"Question: {episode['query']}")
        assert trajectory.messages[-1].role == ASSISTANT
        assert trajectory.extra["hardness"] == episode["hardness"]
        assert (trajectory.env, trajectory.agent, trajectory.sampling) == (
            "intercode_sql",
            "expert",
            {"model": "gpt-4"},
        )
    assert (
        trajectories[1].instruction
        == "Database: cre_Doc_Template_Mgt\nQuestion: Count the number of paragraphs."
    )


def test_eto_records_fixture_matches_the_converted_real_data():
    """tests/data/eto_records.jsonl was written from the real files by tests/data/build_fixtures.py."""
    expected = []
    for env in ("alfworld", "sciworld", "webshop"):
        expected += read_icl_examples(
            os.path.join(ICL, f"{env}_icl.json"), env_name=env, instruction=instruction(env)
        )
    expected += read_intercode_trajectories(INTERCODE)
    got = read_trajectories(RECORDS)
    assert got == expected
    assert [t.extra for t in got] == [t.extra for t in expected]
    assert len(got) == 10


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_write_then_read_round_trips(tmp_path, suffix):
    trajectories = read_trajectories(RECORDS)
    path = tmp_path / f"out{suffix}"
    write_trajectories(path, trajectories)
    assert read_trajectories(path) == trajectories


def test_lossless_round_trip_of_every_field(tmp_path):
    trajectory = Trajectory(
        "wörld_0_target_1",
        "wörld_0",
        (
            Message(USER, 'Tâche : faire bouillir de l\'eau 🫖\n\t"quoted"'),
            Message(ASSISTANT, "Thought: 好.\nAction: go"),
        ),
        0.1 + 0.2,  # 0.30000000000000004 must come back bit for bit
        agent="target",
        env="sciworld",
        iteration=3,
        sampling={
            "temperature": 0.7,
            "top_p": 0.95,
            "seed": 12,
            "model": "smol",
            "nested": {"a": [1, 2.5, None]},
        },
        extra={"hardness": "easy", "notes": ["x", {"y": 1e-300}]},
    )
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, [trajectory])
    (back,) = read_trajectories(path)
    assert back == trajectory and back.reward == 0.1 + 0.2
    assert trajectory_to_record(back) == trajectory_to_record(trajectory)
    assert json.loads(path.read_text(encoding="utf-8"))["agent"] == "target"


def test_system_message_and_eto_prompt():
    record = {
        "id": "t",
        "reward": 0,
        "conversations": [
            {"role": "system", "content": "sys"},
            {"from": "human", "value": "instruction"},
            {"from": "gpt", "value": "OK"},
            {"from": "human", "value": "task"},
            {"from": "gpt", "value": "Action: a"},
        ],
    }
    trajectory = parse_record(record)
    assert trajectory.actions == ("Action: a",) and trajectory.reward == 0.0 and trajectory.task_id == "t"
    assert (
        trajectory.prompt_len == 4 and trajectory.instruction == "task"
    )  # the "OK" is prompt, not an action
    del record["conversations"][0]
    assert parse_record(record).prompt_len == 3
    record["conversations"][1]["value"] = "Thought: a real first action."
    assert parse_record(record).prompt_len == 1  # not ETO's layout: the first user turn is the prompt
    record["prompt_len"] = 3
    assert parse_record(record).actions == ("Action: a",)  # an explicit prompt_len always wins


def test_missing_reward_needs_a_default():
    record = {"id": "t", "conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}]}
    assert parse_record(record, default_reward=1.0).reward == 1.0
    with pytest.raises(DataFormatError, match="field 'reward'"):
        parse_record(record)


def _real_record():
    return copy.deepcopy(load_json_records(RECORDS)[6])  # InterCode task 40: 5 actions, reward 2/3


def _set(path, value):
    def mutate(record):
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path):
    def mutate(record):
        target = record
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


MALFORMED = [
    ("conversations", _delete(["conversations"])),
    ("conversations", _set(["conversations"], [])),
    ("conversations[1].from", _set(["conversations", 1, "from"], "bot")),
    ("conversations[3].value", _set(["conversations", 3, "value"], 5)),
    ("conversations[0].value", _delete(["conversations", 0, "value"])),
    ("conversations[2].from", _delete(["conversations", 2, "from"])),
    ("conversations[4]", _set(["conversations", 4], "Action: SHOW TABLES")),
    ("conversations[1].from", _set(["conversations", 1, "from"], "human")),
    ("conversations[2].from", _set(["conversations", 2], {"from": "system", "value": "late system"})),
    ("reward", _set(["reward"], 1.5)),
    ("reward", _set(["reward"], "high")),
    ("reward", _set(["reward"], float("nan"))),
    ("reward", _delete(["reward"])),
    ("id", _delete(["id"])),
    ("task_id", _set(["task_id"], 12)),
    ("agent", _set(["agent"], "gpt-4")),
    ("env", _set(["env"], 3)),
    ("iteration", _set(["iteration"], -1)),
    ("iteration", _set(["iteration"], "2")),
    ("sampling", _set(["sampling"], [0.7])),
    ("prompt_len", _set(["prompt_len"], 0)),
    ("prompt_len", _set(["prompt_len"], 2)),
    ("prompt_len", _set(["prompt_len"], 99)),
]


@pytest.mark.parametrize("field_name, mutate", MALFORMED)
def test_malformed_record_error_names_file_record_and_field(tmp_path, field_name, mutate):
    good = load_json_records(RECORDS)[:2]
    bad = _real_record()
    mutate(bad)
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*good, bad]))
    with pytest.raises(DataFormatError) as info:
        read_trajectories(path)
    assert (info.value.source, info.value.index, info.value.field_name) == (str(path), 2, field_name)
    assert str(info.value).startswith(f"{path}: record 2: field '{field_name}': ")


def test_skip_bad_counts_and_reports_every_skipped_record(tmp_path, caplog):
    good = load_json_records(RECORDS)
    bad_reward, no_id = _real_record(), _real_record()
    bad_reward["reward"] = 1.5
    del no_id["id"]
    lines = [json.dumps(r) for r in [good[0], bad_reward, good[1], no_id, good[1]]] + ["{not json"]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match="record 1: field 'reward'"):
        read_trajectories(path)
    with caplog.at_level(logging.WARNING):
        trajectories, report = read_trajectories(path, skip_bad=True, return_report=True)
    assert [t.traj_id for t in trajectories] == [good[0]["id"], good[1]["id"]]
    assert (report.num_records, report.num_read, report.num_bad) == (6, 2, 4)
    assert report.to_dict()["bad"] == [
        {"index": 1, "field": "reward", "problem": "1.5 is outside [0, 1]"},
        {"index": 3, "field": "id", "problem": "expected a non-empty string, got None"},
        {"index": 4, "field": "id", "problem": "duplicate id 'sciworld_icl_0' (first at record 2)"},
        {"index": 5, "field": "<json>", "problem": report.errors[3].problem},
    ]
    assert f"{path}: skipped 4 bad record(s) of 6" in caplog.text
    assert f"{path}: record 3: field 'id'" in caplog.text  # each skipped record is named in the log
    assert read_trajectories(path, skip_bad=True) == trajectories  # plain list without return_report


def test_malformed_files(tmp_path):
    duplicate = tmp_path / "dup.json"
    duplicate.write_text(json.dumps([_real_record(), _real_record()]))
    with pytest.raises(DataFormatError, match=r"dup.json: record 1: field 'id': duplicate id"):
        read_trajectories(duplicate)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(_real_record()) + "\n{not json\n")
    with pytest.raises(DataFormatError, match=r"broken.jsonl: record 1: field '<json>': line 2"):
        read_trajectories(broken)
    not_object = tmp_path / "list.json"
    not_object.write_text(json.dumps([_real_record(), ["a list"]]))
    with pytest.raises(DataFormatError, match=r"list.json: record 1: field '<record>'"):
        read_trajectories(not_object)


@pytest.mark.parametrize(
    "key, field_name, mutate",
    [
        ("0", "query", _delete(["query"])),
        ("0", "turn_history", _delete(["turn_history"])),
        ("0", "turn_history.rewards", _set(["turn_history", "rewards"], [0.0])),
        ("0", "turn_history.actions[1]", _set(["turn_history", "actions", 1], None)),
        ("0", "turn_history.rewards[2]", _set(["turn_history", "rewards", 2], True)),
        ("0", "turn_history.rewards[4]", _set(["turn_history", "rewards", 4], 2.0)),
        ("0", "turn_history.rewards[1]", _set(["turn_history", "rewards", 1], float("nan"))),
        ("0", "turn_history.rewards[4]", _set(["turn_history", "rewards", 4], float("inf"))),
        ("12", "turn_history.actions", _set(["turn_history", "actions"], [])),
    ],
)
def test_malformed_intercode_episode_names_file_record_and_field(tmp_path, key, field_name, mutate):
    with open(INTERCODE) as f:
        episodes = json.load(f)
    mutate(episodes[key])
    path = tmp_path / "ic.json"
    path.write_text(json.dumps(episodes))
    with pytest.raises(DataFormatError) as info:
        read_intercode_trajectories(path)
    assert (info.value.source, info.value.index, info.value.field_name) == (
        str(path),
        list(episodes).index(key),
        field_name,
    )


def test_malformed_icl_example_names_field():
    with open(os.path.join(ICL, "alfworld_icl.json")) as f:
        conversations = json.load(f)
    conversations[0][3]["from"] = "robot"
    with pytest.raises(
        DataFormatError, match=r"alfworld_icl.json: record 0: field 'conversations\[3\].from'"
    ):
        icl_examples_to_trajectories(conversations, env_name="alfworld", source_name="alfworld_icl.json")
