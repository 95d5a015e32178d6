"""The strict reader of trajectory records (`records`): every field checked, each problem named.

`parse_record` validates one record and returns its `Trajectory`; `read_trajectories` reads a whole `.json` or
`.jsonl` file. A malformed record raises `DataFormatError` naming the file, the record index and the field.
With `skip_bad=True` the reader skips such records instead, logs each one, and can return a `ReadReport`
(`return_report=True`); nothing is ever dropped silently. The field checks (`parse_reward`, `parse_weight`,
`parse_token_trace`, ...) are shared with the other formats (`formats`, `tfds_builders`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from coevo_jax.data.json_files import DataFormatError, load_json_records
from coevo_jax.data.records import (
    AGENTS,
    ASSISTANT,
    ROLE_ALIASES,
    SYSTEM,
    USER,
    Message,
    TokenTrace,
    Trajectory,
    default_prompt_len,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadReport:
    """What a reader did with a file: how many records it read and which it skipped, and why."""

    path: str
    num_records: int
    errors: tuple[DataFormatError, ...] = ()

    @property
    def num_bad(self) -> int:
        return len(self.errors)

    @property
    def num_read(self) -> int:
        return self.num_records - self.num_bad

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "num_records": self.num_records,
            "num_read": self.num_read,
            "num_bad": self.num_bad,
            "bad": [{"index": e.index, "field": e.field_name, "problem": e.problem} for e in self.errors],
        }


def _parse_message(raw: object, source: str, index: int, where: str) -> Message:
    if not isinstance(raw, Mapping):
        raise DataFormatError(source, index, where, f"expected an object, got {type(raw).__name__}")
    role_key = "from" if "from" in raw else "role" if "role" in raw else None
    if role_key is None:
        raise DataFormatError(source, index, f"{where}.from", "missing role (neither 'from' nor 'role')")
    role = ROLE_ALIASES.get(raw[role_key]) if isinstance(raw[role_key], str) else None
    if role is None:
        raise DataFormatError(source, index, f"{where}.{role_key}", f"unknown role {raw[role_key]!r}")
    text_key = "value" if "value" in raw else "content" if "content" in raw else None
    if text_key is None:
        raise DataFormatError(source, index, f"{where}.value", "missing text (neither 'value' nor 'content')")
    if not isinstance(raw[text_key], str):
        problem = f"expected a string, got {type(raw[text_key]).__name__}"
        raise DataFormatError(source, index, f"{where}.{text_key}", problem)
    return Message(role, raw[text_key])


def parse_messages(raw_messages: object, source: str, index: int) -> tuple[Message, ...]:
    """`conversations`: a system message only first, then user and assistant alternating from user."""
    if not isinstance(raw_messages, list) or not raw_messages:
        raise DataFormatError(source, index, "conversations", "expected a non-empty list of messages")
    messages = tuple(
        _parse_message(raw, source, index, f"conversations[{i}]") for i, raw in enumerate(raw_messages)
    )
    expected = USER
    for i, message in enumerate(messages):
        if message.role == SYSTEM:
            if i != 0:
                raise DataFormatError(
                    source, index, f"conversations[{i}].from", "a system message may only come first"
                )
            continue
        if message.role != expected:
            problem = f"expected role {expected}, got {message.role}"
            raise DataFormatError(source, index, f"conversations[{i}].from", problem)
        expected = ASSISTANT if expected == USER else USER
    if not any(m.role == ASSISTANT for m in messages):
        raise DataFormatError(source, index, "conversations", "no assistant turn")
    return messages


def _require_str(record: Mapping, key: str, source: str, index: int, default: str | None = None) -> str:
    value = record.get(key, default)
    if not isinstance(value, str) or not value:
        raise DataFormatError(source, index, key, f"expected a non-empty string, got {value!r}")
    return value


def parse_reward(value: object, source: str, index: int, field_name: str = "reward") -> float:
    if value is None:
        raise DataFormatError(source, index, field_name, "missing (pass default_reward for files without)")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataFormatError(source, index, field_name, f"expected a finite number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise DataFormatError(source, index, field_name, f"{value!r} is outside [0, 1]")
    return float(value)


def parse_weight(value: object, source: str, index: int, field_name: str) -> float:
    """A loss weight (eq. 9's lambda_dpo, lambda_sft): a finite number >= 0 (NaN and infinities refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataFormatError(source, index, field_name, f"unexpected value {value!r}")
    if not (math.isfinite(value) and value >= 0.0):
        raise DataFormatError(source, index, field_name, f"expected a finite number >= 0, got {value!r}")
    return float(value)


def parse_metadata(
    record: Mapping, source: str, index: int, *, env: str, agent: str, iteration: int | None
) -> dict[str, object]:
    """The `env`, `agent`, `iteration` and `sampling` fields (each falling back to the given default)."""
    env_value = record.get("env", env)
    if not isinstance(env_value, str):
        raise DataFormatError(source, index, "env", f"expected a string, got {env_value!r}")
    agent_value = record.get("agent", agent)
    if agent_value not in AGENTS:
        raise DataFormatError(source, index, "agent", f"expected one of {AGENTS}, got {agent_value!r}")
    iteration_value = record.get("iteration", iteration)
    if iteration_value is not None and (
        isinstance(iteration_value, bool) or not isinstance(iteration_value, int) or iteration_value < 0
    ):
        raise DataFormatError(
            source, index, "iteration", f"expected null or an int >= 0, got {iteration_value!r}"
        )
    sampling = record.get("sampling", {})
    if not isinstance(sampling, Mapping) or not all(isinstance(k, str) for k in sampling):
        raise DataFormatError(source, index, "sampling", f"expected an object, got {sampling!r}")
    return {"env": env_value, "agent": agent_value, "iteration": iteration_value, "sampling": dict(sampling)}


KNOWN_KEYS = frozenset(
    {
        "id",
        "task_id",
        "env",
        "agent",
        "iteration",
        "reward",
        "prompt_len",
        "sampling",
        "conversations",
        "tokens",
    }
)


def parse_token_trace(raw: object, source: str, index: int) -> TokenTrace | None:
    """The optional `tokens` field: {"ids": [int], "reply_spans": [[start, end]], "logprobs": [float]}."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) != {"ids", "reply_spans", "logprobs"}:
        raise DataFormatError(source, index, "tokens", "expected an object with ids, reply_spans, logprobs")
    ids, spans, logprobs = raw["ids"], raw["reply_spans"], raw["logprobs"]
    is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)
    if not isinstance(ids, list) or not all(is_int(i) for i in ids):
        raise DataFormatError(source, index, "tokens.ids", "expected a list of ints")
    if not isinstance(spans, list) or not all(
        isinstance(s, list) and len(s) == 2 and all(is_int(i) for i in s) for s in spans
    ):
        raise DataFormatError(
            source, index, "tokens.reply_spans", "expected a list of [start, end] int pairs"
        )
    if not isinstance(logprobs, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs
    ):
        raise DataFormatError(source, index, "tokens.logprobs", "expected a list of numbers")
    try:
        return TokenTrace(ids, spans, logprobs)
    except ValueError as error:
        raise DataFormatError(source, index, "tokens", str(error)) from None


def parse_record(
    record: object,
    *,
    source: str = "<memory>",
    index: int = 0,
    default_reward: float | None = None,
    env: str = "",
    agent: str = "expert",
    iteration: int | None = None,
) -> Trajectory:
    """Validate one trajectory record and return it as a `Trajectory` (`env`, `agent`, ... are defaults)."""
    if not isinstance(record, Mapping):
        raise DataFormatError(source, index, "<record>", f"expected an object, got {type(record).__name__}")
    traj_id = _require_str(record, "id", source, index)
    task_id = _require_str(record, "task_id", source, index, default=traj_id)
    metadata = parse_metadata(record, source, index, env=env, agent=agent, iteration=iteration)
    messages = parse_messages(record.get("conversations"), source, index)
    prompt_len = record.get("prompt_len", default_prompt_len(messages))
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 1 <= prompt_len < len(messages):
        problem = f"expected an int in [1, {len(messages) - 1}], got {prompt_len!r}"
        raise DataFormatError(source, index, "prompt_len", problem)
    if messages[prompt_len - 1].role != USER:
        raise DataFormatError(source, index, "prompt_len", "the prompt must end with a user turn")
    reward = parse_reward(record.get("reward", default_reward), source, index)
    tokens = parse_token_trace(record.get("tokens"), source, index)
    extra = {k: v for k, v in record.items() if k not in KNOWN_KEYS}
    try:
        return Trajectory(
            traj_id, task_id, messages, reward, prompt_len=prompt_len, extra=extra, tokens=tokens, **metadata
        )
    except ValueError as error:  # a token trace that does not fit the conversation
        raise DataFormatError(source, index, "tokens", str(error)) from None


def parse_all(
    records: object, parse_one: Callable[[object, int], Trajectory], *, source: str, skip_bad: bool
) -> tuple[list[Trajectory], ReadReport]:
    """Parse every record (ids must be unique); with `skip_bad`, collect errors instead of raising."""
    if not isinstance(records, list):
        raise DataFormatError(
            source, -1, "<file>", f"expected a list of records, got {type(records).__name__}"
        )
    trajectories, errors, first_index = [], [], {}
    for index, record in enumerate(records):
        try:
            if isinstance(record, DataFormatError):  # a JSON Lines line that did not parse
                raise record
            trajectory = parse_one(record, index)
            if trajectory.traj_id in first_index:
                problem = (
                    f"duplicate id {trajectory.traj_id!r} (first at record {first_index[trajectory.traj_id]})"
                )
                raise DataFormatError(source, index, "id", problem)
        except DataFormatError as err:
            if not skip_bad:
                raise
            errors.append(err)
            continue
        first_index[trajectory.traj_id] = index
        trajectories.append(trajectory)
    report = ReadReport(source, len(records), tuple(errors))
    if errors:
        log.warning(
            "%s: skipped %d bad record(s) of %d:\n%s",
            source,
            report.num_bad,
            report.num_records,
            "\n".join(str(e) for e in errors),
        )
    return trajectories, report


def parse_records(
    records: object, *, source: str = "<memory>", default_reward: float | None = None
) -> list[Trajectory]:
    """Parse a list of records strictly; trajectory ids must be unique."""
    parse_one = lambda r, i: parse_record(r, source=source, index=i, default_reward=default_reward)
    return parse_all(records, parse_one, source=source, skip_bad=False)[0]


def read_trajectories(
    path: str | os.PathLike[str],
    *,
    default_reward: float | None = None,
    skip_bad: bool = False,
    return_report: bool = False,
    env: str = "",
    agent: str = "expert",
) -> list[Trajectory] | tuple[list[Trajectory], ReadReport]:
    """Read and validate a trajectory file (`.json` list or `.jsonl`); `(trajectories, report)` on request."""
    source = os.fspath(path)

    def parse_one(record: object, index: int) -> Trajectory:
        return parse_record(
            record, source=source, index=index, default_reward=default_reward, env=env, agent=agent
        )

    records = load_json_records(source, strict=False)  # bad lines surface in record order
    trajectories, report = parse_all(records, parse_one, source=source, skip_bad=skip_bad)
    return (trajectories, report) if return_report else trajectories
