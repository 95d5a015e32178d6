"""Trajectories as ETO conversation records: the data model, a strict reader and a writer.

A trajectory e = (u, a_1, o_1, ..., a_n) (paper eq. 1) is stored as one *ETO conversation record*, the
FastChat-style JSON that ETO (Song et al., 2024) uses for its SFT data, plus the fields co-evolution needs:

    {"id": "webshop_12_target_0",          # unique trajectory id (required)
     "task_id": "webshop_12",              # the instruction u; pairs are only formed within one task_id
     "reward": 0.75,                       # r(u, e) in [0, 1]
     "source": "target",                   # who produced it: expert | target | failure | ...
     "prompt_len": 1,                      # leading messages that make up u (never trained on)
     "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}

Messages may also be written `{"role": "user"|"assistant"|"system", "content": ...}`; real ETO prompt files
mix both spellings within one conversation, so each message may use either role key and either text key.
`task_id` defaults to `id`, `source` to "expert", `prompt_len` to 1. A missing `reward` is an error unless the
reader is given `default_reward` (ETO's expert files carry none).

Any malformed record raises `DataFormatError` naming the file, the record index and the field.
Files are JSON (a list of records) or JSON Lines (`.jsonl`, one record a line).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

USER, ASSISTANT, SYSTEM = "user", "assistant", "system"
ROLE_ALIASES = {"human": USER, "user": USER, "gpt": ASSISTANT, "assistant": ASSISTANT, "system": SYSTEM}
ETO_ROLE_NAMES = {USER: "human", ASSISTANT: "gpt", SYSTEM: "system"}


class DataFormatError(ValueError):
    """A record that does not follow the ETO conversation format; the message names file, record and field."""

    def __init__(self, source: str, index: int, field_name: str, problem: str):
        self.source, self.index, self.field_name, self.problem = source, index, field_name, problem
        super().__init__(f"{source}: record {index}: field '{field_name}': {problem}")


@dataclass(frozen=True)
class Message:
    role: str  # "user" (instruction or observation), "assistant" (action), or "system"
    content: str


@dataclass(frozen=True)
class Trajectory:
    """One episode for one instruction. The first `prompt_len` messages are the instruction u."""

    traj_id: str
    task_id: str
    messages: tuple[Message, ...]
    reward: float
    source: str = "expert"
    prompt_len: int = 1
    extra: Mapping[str, object] = field(default_factory=dict, compare=False)

    @property
    def prompt(self) -> tuple[Message, ...]:
        return self.messages[: self.prompt_len]

    @property
    def actions(self) -> tuple[str, ...]:
        """The assistant turns after the prompt: a_1 ... a_n."""
        return tuple(m.content for m in self.messages[self.prompt_len :] if m.role == ASSISTANT)


def _fail(source: str, index: int, field_name: str, problem: str) -> DataFormatError:
    return DataFormatError(source, index, field_name, problem)


def _parse_message(raw: object, source: str, index: int, where: str) -> Message:
    if not isinstance(raw, Mapping):
        raise _fail(source, index, where, f"expected an object, got {type(raw).__name__}")
    role_key = "from" if "from" in raw else "role" if "role" in raw else None
    if role_key is None:
        raise _fail(source, index, f"{where}.from", "missing role (neither 'from' nor 'role')")
    role = ROLE_ALIASES.get(raw[role_key]) if isinstance(raw[role_key], str) else None
    if role is None:
        raise _fail(source, index, f"{where}.{role_key}", f"unknown role {raw[role_key]!r}")
    text_key = "value" if "value" in raw else "content" if "content" in raw else None
    if text_key is None:
        raise _fail(source, index, f"{where}.value", "missing text (neither 'value' nor 'content')")
    if not isinstance(raw[text_key], str):
        raise _fail(
            source, index, f"{where}.{text_key}", f"expected a string, got {type(raw[text_key]).__name__}"
        )
    return Message(role, raw[text_key])


def _check_turn_order(messages: Sequence[Message], source: str, index: int) -> None:
    """System messages only first; then user and assistant strictly alternate, starting with user."""
    expected = USER
    for i, message in enumerate(messages):
        if message.role == SYSTEM:
            if i != 0:
                raise _fail(source, index, f"conversations[{i}].from", "a system message may only come first")
            continue
        if message.role != expected:
            raise _fail(
                source, index, f"conversations[{i}].from", f"expected role {expected}, got {message.role}"
            )
        expected = ASSISTANT if expected == USER else USER
    if not any(m.role == ASSISTANT for m in messages):
        raise _fail(source, index, "conversations", "no assistant turn")


def _require_str(record: Mapping, key: str, source: str, index: int, default: str | None = None) -> str:
    value = record.get(key, default)
    if not isinstance(value, str) or not value:
        raise _fail(source, index, key, f"expected a non-empty string, got {value!r}")
    return value


def _parse_reward(record: Mapping, source: str, index: int, default_reward: float | None) -> float:
    value = record.get("reward", default_reward)
    if value is None:
        raise _fail(source, index, "reward", "missing (pass default_reward for files without rewards)")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(source, index, "reward", f"expected a finite number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise _fail(source, index, "reward", f"{value!r} is outside [0, 1]")
    return float(value)


def parse_record(
    record: object, *, source: str = "<memory>", index: int = 0, default_reward: float | None = None
) -> Trajectory:
    """Validate one ETO conversation record and return it as a `Trajectory`."""
    if not isinstance(record, Mapping):
        raise _fail(source, index, "<record>", f"expected an object, got {type(record).__name__}")
    traj_id = _require_str(record, "id", source, index)
    task_id = _require_str(record, "task_id", source, index, default=traj_id)
    traj_source = _require_str(record, "source", source, index, default="expert")
    raw_messages = record.get("conversations")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _fail(source, index, "conversations", "expected a non-empty list of messages")
    messages = tuple(
        _parse_message(raw, source, index, f"conversations[{i}]") for i, raw in enumerate(raw_messages)
    )
    _check_turn_order(messages, source, index)
    prompt_len = record.get("prompt_len", 1 + (messages[0].role == SYSTEM))
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 1 <= prompt_len < len(messages):
        raise _fail(
            source, index, "prompt_len", f"expected an int in [1, {len(messages) - 1}], got {prompt_len!r}"
        )
    if messages[prompt_len - 1].role != USER:
        raise _fail(source, index, "prompt_len", "the prompt must end with a user turn")
    reward = _parse_reward(record, source, index, default_reward)
    known = {"id", "task_id", "source", "conversations", "prompt_len", "reward"}
    extra = {k: v for k, v in record.items() if k not in known}
    return Trajectory(traj_id, task_id, messages, reward, traj_source, prompt_len, extra)


def parse_records(
    records: object, *, source: str = "<memory>", default_reward: float | None = None
) -> list[Trajectory]:
    """Parse a list of records; trajectory ids must be unique."""
    if not isinstance(records, list):
        raise _fail(source, -1, "<file>", f"expected a list of records, got {type(records).__name__}")
    trajectories, seen = [], {}
    for index, record in enumerate(records):
        trajectory = parse_record(record, source=source, index=index, default_reward=default_reward)
        if trajectory.traj_id in seen:
            raise _fail(
                source,
                index,
                "id",
                f"duplicate id {trajectory.traj_id!r} (first at record {seen[trajectory.traj_id]})",
            )
        seen[trajectory.traj_id] = index
        trajectories.append(trajectory)
    return trajectories


def _load_json_lines(path: str) -> list[object]:
    records = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise _fail(path, len(records), "<json>", f"line {line_number + 1}: {err.msg}") from err
    return records


def load_json_records(path: str | os.PathLike[str]) -> list[object]:
    """Raw JSON records from a `.json` (list) or `.jsonl` file, with the file named in any parse error."""
    path = os.fspath(path)
    if path.endswith(".jsonl"):
        return _load_json_lines(path)
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as err:
            raise _fail(path, -1, "<json>", f"line {err.lineno}: {err.msg}") from err


def read_trajectories(
    path: str | os.PathLike[str], *, default_reward: float | None = None
) -> list[Trajectory]:
    """Read and validate an ETO conversation file (`.json` list or `.jsonl`)."""
    return parse_records(load_json_records(path), source=os.fspath(path), default_reward=default_reward)


def trajectory_to_record(trajectory: Trajectory) -> dict[str, object]:
    """The ETO conversation record of a trajectory (`from`/`value` spelling); inverse of `parse_record`."""
    return {
        "id": trajectory.traj_id,
        "task_id": trajectory.task_id,
        "reward": trajectory.reward,
        "source": trajectory.source,
        "prompt_len": trajectory.prompt_len,
        "conversations": [{"from": ETO_ROLE_NAMES[m.role], "value": m.content} for m in trajectory.messages],
        **dict(trajectory.extra),
    }


def write_trajectories(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> None:
    """Write ETO conversation records: JSON Lines for `.jsonl`, otherwise one indented JSON list."""
    records = [trajectory_to_record(t) for t in trajectories]
    with open(path, "w", encoding="utf-8") as f:
        if os.fspath(path).endswith(".jsonl"):
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        else:
            json.dump(records, f, ensure_ascii=False, indent=1)
            f.write("\n")
