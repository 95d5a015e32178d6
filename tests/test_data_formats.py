"""Interchange formats: ETO conversation files in and out, TRL preference files out, lossless pair JSONL."""

import json
import os

import pytest

from coevo_jax.data.formats import (
    read_eto_conversations,
    read_pairs_jsonl,
    with_eto_prompt,
    write_eto_conversations,
    write_pairs_jsonl,
    write_trl_preferences,
)
from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.pairs import build_target_pairs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import ASSISTANT, USER, Message, Trajectory

DATA = os.path.join(os.path.dirname(__file__), "data")
RECORDS = os.path.join(DATA, "eto_records.jsonl")
ETO_FILE = os.path.join(DATA, "eto_conversations.json")  # written from RECORDS by build_fixtures.py

ETO_RECORD = {
    "id": 7,
    "conversations": [
        {"from": "human", "value": "You are web shopping. ..."},
        {"from": "gpt", "value": "OK"},
        {"from": "human", "value": "Observation:\nWebShop [SEP] i need a red mug"},
        {"from": "gpt", "value": "Thought: search first.\nAction: search[red mug]"},
        {"from": "human", "value": "Observation:\n[SEP] Red Mug [SEP] $5"},
        {"from": "gpt", "value": "Thought: buy it.\nAction: click[Buy Now]"},
    ],
    "reward": 0.75,
}


def test_eto_record_reads_with_the_ok_turn_in_the_prompt(tmp_path):
    path = tmp_path / "webshop_pm.json"
    path.write_text(json.dumps([ETO_RECORD]))
    (trajectory,) = read_eto_conversations(path, env="webshop", agent="target", iteration=1)
    assert (trajectory.traj_id, trajectory.task_id, trajectory.reward) == ("7", "7", 0.75)
    assert (trajectory.env, trajectory.agent, trajectory.iteration, trajectory.prompt_len) == (
        "webshop",
        "target",
        1,
        3,
    )
    assert trajectory.actions == (
        "Thought: search first.\nAction: search[red mug]",
        "Thought: buy it.\nAction: click[Buy Now]",
    )  # "OK" is not an action
    assert trajectory.instruction == "Observation:\nWebShop [SEP] i need a red mug"
    assert trajectory.observations == ("Observation:\n[SEP] Red Mug [SEP] $5",)


def test_written_eto_record_has_exactly_etos_layout(tmp_path):
    (trajectory,) = read_eto_conversations(_write(tmp_path / "in.json", [ETO_RECORD]))
    out = tmp_path / "out.json"
    write_eto_conversations(out, [trajectory])
    (record,) = json.loads(out.read_text())
    assert list(record) == ["id", "conversations", "reward"]
    assert record == {**ETO_RECORD, "id": "7"}  # ids are written as strings
    assert [m["from"] for m in record["conversations"]] == ["human", "gpt", "human", "gpt", "human", "gpt"]
    assert all(list(m) == ["from", "value"] for m in record["conversations"])


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_eto_read_write_read_round_trip_on_real_trajectories(tmp_path, suffix):
    native = read_trajectories(RECORDS)
    from_eto = read_eto_conversations(ETO_FILE)
    assert [(t.traj_id, t.messages, t.reward, t.prompt_len) for t in from_eto] == [
        (t.traj_id, t.messages, t.reward, t.prompt_len) for t in native
    ]
    path = tmp_path / f"again{suffix}"
    write_eto_conversations(path, from_eto)
    assert read_eto_conversations(path) == from_eto
    with open(ETO_FILE) as f:
        assert json.load(f)[3]["conversations"][1] == {"from": "gpt", "value": "OK"}


def test_eto_writer_refuses_other_prompts_and_with_eto_prompt_converts():
    one_turn = Trajectory("t", "t", (Message(USER, "task"), Message(ASSISTANT, "Action: a")), 0.0)
    with pytest.raises(ValueError, match="t: prompt is not ETO's"):
        write_eto_conversations(os.devnull, [one_turn])
    eto = with_eto_prompt(one_turn, "You are an agent.")
    assert [m.content for m in eto.messages] == ["You are an agent.", "OK", "task", "Action: a"]
    assert eto.prompt_len == 3 and eto.actions == one_turn.actions and with_eto_prompt(eto, "x") is eto


def _write(path, records):
    path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize(
    "field_name, mutate",
    [
        ("conversations[1].from", lambda r: r["conversations"][1].update({"from": "human"})),
        ("conversations[0].from", lambda r: r["conversations"].insert(0, {"from": "system", "value": "s"})),
        ("conversations[2].from", lambda r: r["conversations"].__setitem__(2, {"from": "gpt", "value": "x"})),
        ("conversations", lambda r: r.update({"conversations": r["conversations"][:3]})),
        ("id", lambda r: r.update({"id": True})),
        ("reward", lambda r: r.pop("reward")),
    ],
)
def test_malformed_eto_record_names_file_record_and_field(tmp_path, field_name, mutate):
    bad = json.loads(json.dumps(ETO_RECORD))
    mutate(bad)
    path = _write(tmp_path / "eto.json", [{**ETO_RECORD, "id": "ok"}, bad])
    with pytest.raises(DataFormatError) as info:
        read_eto_conversations(path)
    assert (info.value.source, info.value.index, info.value.field_name) == (str(path), 1, field_name)
    trajectories, report = read_eto_conversations(path, skip_bad=True, return_report=True)
    assert [t.traj_id for t in trajectories] == ["ok"] and report.num_bad == 1


def test_trl_preference_records(tmp_path):
    expert = next(t for t in read_trajectories(RECORDS) if t.traj_id == "intercode_sql_0_gpt-4")
    failed = Trajectory("sql0_tgt", expert.task_id, expert.messages[:5], 0.25, "target", prompt_len=3)
    (pair,) = build_target_pairs([expert], [failed], [])
    path = tmp_path / "trl.jsonl"
    write_trl_preferences(path, [pair])
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert list(record) == ["prompt", "chosen", "rejected"]
    assert record["prompt"] == [{"role": m.role, "content": m.content} for m in expert.messages[:3]]
    assert record["chosen"] == [{"role": m.role, "content": m.content} for m in expert.messages[3:]]
    assert record["rejected"] == [
        {"role": "assistant", "content": failed.messages[3].content},
        {"role": "user", "content": failed.messages[4].content},
    ]


def test_pairs_jsonl_round_trip(tmp_path):
    expert = next(t for t in read_trajectories(RECORDS) if t.traj_id == "intercode_sql_0_gpt-4")
    target = Trajectory("sql0_tgt", expert.task_id, expert.messages[:4], 0.25, "target", prompt_len=3)
    failure = Trajectory(
        "sql0_fail",
        expert.task_id,
        expert.messages[:6],
        0.7,
        "failure",
        prompt_len=3,
        iteration=2,
        sampling={"t": 0.3},
    )
    pairs = build_target_pairs([expert], [target], [failure])
    path = tmp_path / "pairs.jsonl"
    write_pairs_jsonl(path, pairs)
    assert read_pairs_jsonl(path) == list(pairs)
    assert [p.hard_negative for p in read_pairs_jsonl(path)] == [True, False, False]
    record = json.loads(path.read_text().splitlines()[0])
    record["chosen"]["reward"] = "high"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=r"record 0: field 'chosen.reward'"):
        read_pairs_jsonl(path)


def test_eto_files_that_are_not_utf8_name_the_file_and_line(tmp_path):
    latin1 = tmp_path / "eto_latin1.json"
    record = dict(ETO_RECORD, conversations=[dict(t) for t in ETO_RECORD["conversations"]])
    record["conversations"][2]["value"] = "Observation: a café mug"
    latin1.write_bytes(json.dumps([record], ensure_ascii=False).encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"eto_latin1.json: record -1: .*not UTF-8 text \(byte 0xe9"):
        read_eto_conversations(latin1)
    lines = tmp_path / "eto_mixed.jsonl"
    good = json.dumps(ETO_RECORD, ensure_ascii=False).encode()
    bad = json.dumps(dict(ETO_RECORD, id=8), ensure_ascii=False).encode().replace(b"red mug", b"r\xe9d mug")
    lines.write_bytes(good + b"\n" + bad + b"\n")
    with pytest.raises(
        DataFormatError, match=r"eto_mixed.jsonl: record 1: field '<json>': line 2: not UTF-8"
    ):
        read_eto_conversations(lines)
    trajectories, report = read_eto_conversations(lines, skip_bad=True, return_report=True)
    assert [t.traj_id for t in trajectories] == ["7"] and report.num_bad == 1


@pytest.mark.parametrize(
    "field_name, value, problem",
    [
        ("lambda_dpo", float("nan"), "expected a finite number >= 0, got nan"),
        ("lambda_sft", float("inf"), "expected a finite number >= 0, got inf"),
        ("lambda_dpo", -1.0, "expected a finite number >= 0, got -1.0"),
        ("chosen.reward", float("nan"), "expected a finite number, got nan"),
        ("rejected.reward", float("-inf"), "expected a finite number, got -inf"),
        ("chosen.reward", 0.1, "0.1 is not above rejected.reward 0.25"),
    ],
)
def test_pair_files_with_bad_weights_or_rewards_are_refused(tmp_path, field_name, value, problem):
    expert = next(t for t in read_trajectories(RECORDS) if t.traj_id == "intercode_sql_0_gpt-4")
    target = Trajectory("sql0_tgt", expert.task_id, expert.messages[:4], 0.25, "target", prompt_len=3)
    path = tmp_path / "pairs.jsonl"
    write_pairs_jsonl(path, build_target_pairs([expert], [target], []))
    record = json.loads(path.read_text().splitlines()[0])
    if "." in field_name:
        side, key = field_name.split(".")
        record[side][key] = value
    else:
        record[field_name] = value
    path.write_text(json.dumps(record) + "\n")  # json writes NaN and Infinity, as Python's reader accepts
    with pytest.raises(DataFormatError, match=rf"pairs.jsonl: record 0: field '{field_name}': ") as info:
        read_pairs_jsonl(path)
    assert info.value.problem == problem
