"""ETO conversation reader and converters, on real ETO / InterCode records and on malformed ones."""

import copy
import json
import os

import pytest

from coevo_jax.data.converters import (
    icl_examples_to_trajectories,
    read_icl_examples,
    read_intercode_trajectories,
)
from coevo_jax.data.records import (
    ASSISTANT,
    USER,
    DataFormatError,
    load_json_records,
    parse_record,
    read_trajectories,
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
    assert (trajectory.reward, trajectory.source, trajectory.prompt_len) == (1.0, "expert", 1)


def test_icl_instruction_goes_into_first_user_turn():
    (plain,) = read_icl_examples(os.path.join(ICL, "webshop_icl.json"), env_name="webshop")
    (joined,) = read_icl_examples(
        os.path.join(ICL, "webshop_icl.json"), env_name="webshop", instruction=instruction("webshop")
    )
    assert joined.messages[0].content == instruction("webshop").rstrip() + "\n\n" + plain.messages[0].content
    assert joined.messages[1:] == plain.messages[1:]


def test_real_intercode_episodes_parse():
    trajectories = read_intercode_trajectories(INTERCODE, dbs={"8": "cre_Doc_Template_Mgt"})
    with open(INTERCODE) as f:
        raw = json.load(f)
    assert [t.task_id for t in trajectories] == [f"intercode_sql_{k}" for k in raw]
    assert [round(t.reward, 4) for t in trajectories] == [1.0, 1.0, 0.0, 0.6667, 0.0, 1.0, 0.25]
    for trajectory, episode in zip(trajectories, raw.values(), strict=True):
        history = episode["turn_history"]
        assert trajectory.actions == tuple(f"Action: {a}" for a in history["actions"])
        observations = [m.content for m in trajectory.messages[2::2]]
        assert observations == [f"Observation: {o}" for o in history["observations"][:-1]]
        assert trajectory.messages[0].content.endswith(f"Question: {episode['query']}")
        assert trajectory.messages[-1].role == ASSISTANT
        assert trajectory.extra["hardness"] == episode["hardness"]
    assert (
        "Database: cre_Doc_Template_Mgt\nQuestion: Count the number of paragraphs."
        in trajectories[1].messages[0].content
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


def test_system_message_and_longer_prompt():
    record = {
        "id": "t",
        "reward": 0,
        "prompt_len": 4,
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
    del record["prompt_len"]
    assert parse_record(record).prompt_len == 2  # default: system + first user turn


def test_missing_reward_needs_a_default():
    record = {"id": "t", "conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}]}
    assert parse_record(record, default_reward=1.0).reward == 1.0
    with pytest.raises(DataFormatError, match="field 'reward'"):
        parse_record(record)


def _real_record():
    return copy.deepcopy(load_json_records(RECORDS)[6])  # InterCode task 0: 5 actions, reward 1.0


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
