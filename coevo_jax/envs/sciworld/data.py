"""ETO's ScienceWorld task splits, step limits and prompt, shipped in `envs/data/sciworld/` and validated.

The files are ETO's (Yifan-Song793/ETO, `eval_agent/data/sciworld/` and `eval_agent/prompt/`), copied verbatim:
`train_indices.json` (1,483 `[task_name, variation]` pairs), `dev_indices.json` (194, the paper's seen test),
`test_indices.json` (211, its unseen test), `max_steps.json` (step limit per task name), `taskname2id.json`,
`sciworld_inst.txt` (the instruction turn) and `sciworld_icl.json` (ETO's one in-context example). As in
ETO, 54 of the seen-test tasks are also train tasks; the unseen test shares none with either.

A task id is `"{task_name}/{variation}"`, e.g. `"task-1-boil/4"`; ETO's task names carry a numeric prefix and
parentheses that ScienceWorld's own names drop (`scienceworld.utils.infer_task` maps one to the other).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from coevo_jax.data.records import Message

DATA_DIR = Path(__file__).parents[1] / "data" / "sciworld"
SPLIT_FILES = {
    "train": "train_indices.json",
    "test_seen": "dev_indices.json",
    "test_unseen": "test_indices.json",
}
MAX_STEPS_FILE = "max_steps.json"
TASK_IDS_FILE = "taskname2id.json"
INSTRUCTION_FILE = "sciworld_inst.txt"
ICL_FILE = "sciworld_icl.json"


def task_id(task_name: str, variation: int) -> str:
    """The task id of (ETO task name, variation)."""
    return f"{task_name}/{variation}"


def split_task_id(task_id: str) -> tuple[str, int]:
    """(ETO task name, variation) of a task id; ValueError naming the id when it is not `NAME/INT`."""
    name, sep, variation = task_id.rpartition("/")
    if not sep or not name or not variation.isdigit():
        raise ValueError(f"sciworld: task id {task_id!r} is not 'TASK_NAME/VARIATION' (e.g. 'task-1-boil/4')")
    return name, int(variation)


@dataclass(frozen=True)
class SciWorldData:
    """The split task ids, per-task-name step limits, instruction and in-context example."""

    splits: dict[str, list[str]]
    max_steps: dict[str, int]
    instruction: str
    icl_messages: tuple[Message, ...]


def _read_json(path: Path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read JSON: {error}") from error


def _read_max_steps(path: Path) -> dict[str, int]:
    table = _read_json(path)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected an object of task name -> step limit, got {type(table).__name__}")
    for name, limit in table.items():
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            raise ValueError(f"{path}: record {name!r}: step limit {limit!r} is not a positive integer")
    return table


def _read_split(path: Path, max_steps: dict[str, int]) -> list[str]:
    records = _read_json(path)
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a list of [task_name, variation], got {type(records).__name__}")
    ids = []
    for index, record in enumerate(records):
        if not isinstance(record, list) or len(record) != 2:
            raise ValueError(f"{path}: record {index}: expected [task_name, variation], got {record!r}")
        name, variation = record
        if name not in max_steps:
            raise ValueError(
                f"{path}: record {index}: field task_name {name!r} has no limit in {MAX_STEPS_FILE}"
            )
        if not isinstance(variation, int) or isinstance(variation, bool) or variation < 0:
            raise ValueError(f"{path}: record {index}: field variation {variation!r} is not an integer >= 0")
        ids.append(task_id(name, variation))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: repeats a [task_name, variation] pair")
    return ids


def _read_icl(path: Path) -> tuple[Message, ...]:
    conversations = _read_json(path)
    if not isinstance(conversations, list) or not conversations or not isinstance(conversations[0], list):
        raise ValueError(f"{path}: expected a list of conversations (lists of messages)")
    messages = []
    for index, message in enumerate(conversations[0]):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise ValueError(
                f"{path}: conversation 0, message {index}: field role must be 'user' or 'assistant'"
            )
        if not isinstance(message.get("content"), str):
            raise ValueError(f"{path}: conversation 0, message {index}: field content must be a string")
        messages.append(Message(message["role"], message["content"]))
    return tuple(messages)


def load_data(data_dir: str | Path = DATA_DIR) -> SciWorldData:
    """Reads and checks the ETO files in `data_dir`; a bad file raises ValueError naming file, record and field."""
    data_dir = Path(data_dir)
    max_steps = _read_max_steps(data_dir / MAX_STEPS_FILE)
    known = _read_json(data_dir / TASK_IDS_FILE)
    missing = sorted(set(max_steps) - set(known)) if isinstance(known, dict) else ["(not an object)"]
    if missing:
        raise ValueError(f"{data_dir / TASK_IDS_FILE}: lacks task names of {MAX_STEPS_FILE}: {missing}")
    splits = {split: _read_split(data_dir / name, max_steps) for split, name in SPLIT_FILES.items()}
    instruction = (data_dir / INSTRUCTION_FILE).read_text(encoding="utf-8")
    return SciWorldData(splits, max_steps, instruction, _read_icl(data_dir / ICL_FILE))
