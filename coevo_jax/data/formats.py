"""Interchange formats: ETO's conversation files (in and out), TRL preference files (out), pair JSONL.

* ETO / FastChat conversations, the layout of ETO's `*_sft.json` files:

      {"id": "12", "conversations": [
          {"from": "human", "value": <environment instruction>}, {"from": "gpt", "value": "OK"},
          {"from": "human", "value": <the task>}, {"from": "gpt", "value": "Thought: ...\\nAction: ..."},
          {"from": "human", "value": "Observation: ..."}, {"from": "gpt", ...}, ...],
       "reward": 0.5}                      # optional on input (pass default_reward for expert files)

  The first three turns are the instruction u: the "OK" is prompt, never an action to train on. Reading
  gives trajectories with `prompt_len = 3`, `task_id = traj_id = str(id)`, and `env` / `agent` /
  `iteration` from the caller; other keys go to `extra`. Writing produces exactly `id`, `conversations`,
  `reward` in that layout; a trajectory whose prompt is not ETO's three turns is refused (use
  `with_eto_prompt` to split off an environment instruction first).
* TRL's conversational preference format, one JSON line per pair: `{"prompt": [...], "chosen": [...],
  "rejected": [...]}` with `{"role", "content"}` messages; `prompt` is the shared instruction messages,
  `chosen` / `rejected` the messages after it.
* Pair JSONL: our lossless pair record (ids, kind, weights, hard-negative mark, both full trajectories).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

from coevo_jax.data.json_files import DataFormatError, load_json_records, write_json_records
from coevo_jax.data.pair_pool import PreferencePair
from coevo_jax.data.record_reader import (
    ReadReport,
    parse_all,
    parse_messages,
    parse_record,
    parse_reward,
    parse_weight,
)
from coevo_jax.data.records import (
    ASSISTANT,
    ETO_ACK,
    USER,
    Message,
    Trajectory,
    messages_to_conversations,
    trajectory_to_record,
)

ETO_PROMPT_LEN = 3


def parse_eto_record(
    record: object,
    *,
    source: str = "<memory>",
    index: int = 0,
    env: str = "",
    agent: str = "expert",
    iteration: int | None = None,
    default_reward: float | None = None,
) -> Trajectory:
    """One ETO conversation record, its layout checked strictly, as a `Trajectory` with `prompt_len = 3`."""
    if not isinstance(record, Mapping):
        raise DataFormatError(source, index, "<record>", f"expected an object, got {type(record).__name__}")
    raw_id = record.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or raw_id == "":
        raise DataFormatError(source, index, "id", f"expected a non-empty string or an int, got {raw_id!r}")
    messages = parse_messages(record.get("conversations"), source, index)
    for i, (message, role) in enumerate(zip(messages, (USER, ASSISTANT, USER, ASSISTANT), strict=False)):
        if message.role != role:
            problem = f"ETO layout needs {role} here (instruction, OK, task, action ...), got {message.role}"
            raise DataFormatError(source, index, f"conversations[{i}].from", problem)
    if len(messages) <= ETO_PROMPT_LEN:
        raise DataFormatError(source, index, "conversations", "no action after the task turn")
    reward = parse_reward(record.get("reward", default_reward), source, index)
    extra = {k: v for k, v in record.items() if k not in ("id", "conversations", "reward")}
    return Trajectory(
        str(raw_id),
        str(raw_id),
        messages,
        reward,
        agent=agent,
        prompt_len=ETO_PROMPT_LEN,
        env=env,
        iteration=iteration,
        extra=extra,
    )


def read_eto_conversations(
    path: str | os.PathLike[str],
    *,
    env: str = "",
    agent: str = "expert",
    iteration: int | None = None,
    default_reward: float | None = None,
    skip_bad: bool = False,
    return_report: bool = False,
) -> list[Trajectory] | tuple[list[Trajectory], ReadReport]:
    """Read an ETO conversation file (`.json` list or `.jsonl`); `(trajectories, report)` on request."""
    source = os.fspath(path)

    def parse_one(record: object, index: int) -> Trajectory:
        return parse_eto_record(
            record,
            source=source,
            index=index,
            env=env,
            agent=agent,
            iteration=iteration,
            default_reward=default_reward,
        )

    records = load_json_records(source, strict=False)  # bad lines surface in record order
    trajectories, report = parse_all(records, parse_one, source=source, skip_bad=skip_bad)
    return (trajectories, report) if return_report else trajectories


def in_eto_layout(trajectory: Trajectory) -> bool:
    """Whether the prompt is ETO's three turns: instruction (user), acknowledgement (assistant), task (user)."""
    roles = [m.role for m in trajectory.messages[:4]]
    return trajectory.prompt_len == ETO_PROMPT_LEN and roles == [USER, ASSISTANT, USER, ASSISTANT]


def with_eto_prompt(trajectory: Trajectory, env_instruction: str) -> Trajectory:
    """Put `env_instruction` in front as ETO does: (instruction, "OK", <the old one-turn prompt>, ...)."""
    if in_eto_layout(trajectory):
        return trajectory
    if trajectory.prompt_len != 1:
        raise ValueError(f"{trajectory.traj_id}: only a one-turn prompt can be put in ETO's layout")
    messages = (Message(USER, env_instruction), Message(ASSISTANT, ETO_ACK), *trajectory.messages)
    return Trajectory(
        trajectory.traj_id,
        trajectory.task_id,
        messages,
        trajectory.reward,
        agent=trajectory.agent,
        prompt_len=ETO_PROMPT_LEN,
        env=trajectory.env,
        iteration=trajectory.iteration,
        sampling=trajectory.sampling,
        extra=trajectory.extra,
    )


def eto_conversation_record(trajectory: Trajectory) -> dict[str, object]:
    """`{"id", "conversations", "reward"}` in ETO's layout (`from` / `value`, "human" / "gpt")."""
    if not in_eto_layout(trajectory):
        raise ValueError(
            f"{trajectory.traj_id}: prompt is not ETO's (instruction, OK, task); see with_eto_prompt"
        )
    return {
        "id": trajectory.traj_id,
        "conversations": messages_to_conversations(trajectory.messages),
        "reward": trajectory.reward,
    }


def write_eto_conversations(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> None:
    """Write ETO conversation records: a JSON list (as ETO's own files) or JSON Lines for `.jsonl`."""
    write_json_records(path, [eto_conversation_record(t) for t in trajectories])


def _role_content(messages: Iterable[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def trl_preference_record(pair: PreferencePair) -> dict[str, list[dict[str, str]]]:
    """TRL's conversational preference example: shared prompt, then each side's own messages."""
    return {
        "prompt": _role_content(pair.chosen.prompt),
        "chosen": _role_content(pair.chosen.messages[pair.chosen.prompt_len :]),
        "rejected": _role_content(pair.rejected.messages[pair.rejected.prompt_len :]),
    }


def write_trl_preferences(path: str | os.PathLike[str], pairs: Iterable[PreferencePair]) -> None:
    """One TRL preference example per line (JSON Lines)."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(trl_preference_record(p), ensure_ascii=False) + "\n" for p in pairs)


def pair_to_record(pair: PreferencePair) -> dict[str, object]:
    return {
        "pair_id": pair.pair_id,
        "task_id": pair.task_id,
        "kind": pair.kind,
        "lambda_dpo": pair.lambda_dpo,
        "lambda_sft": pair.lambda_sft,
        "hard_negative": pair.hard_negative,
        "chosen": trajectory_to_record(pair.chosen),
        "rejected": trajectory_to_record(pair.rejected),
    }


def _pair_field(record: Mapping, key: str, kind: type | tuple, source: str, index: int):
    value = record.get(key)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise DataFormatError(source, index, key, f"unexpected value {value!r}")
    return value


def parse_pair_record(record: object, *, source: str = "<memory>", index: int = 0) -> PreferencePair:
    """Inverse of `pair_to_record`, validated (errors name file, record and field, e.g. `chosen.reward`).

    The chosen side must have the higher reward, and the weights must be finite and >= 0.
    """
    if not isinstance(record, Mapping):
        raise DataFormatError(source, index, "<record>", f"expected an object, got {type(record).__name__}")
    sides = {}
    for side in ("chosen", "rejected"):
        try:
            sides[side] = parse_record(record.get(side), source=source, index=index)
        except DataFormatError as err:
            raise DataFormatError(source, index, f"{side}.{err.field_name}", err.problem) from err
    pair = PreferencePair(
        task_id=_pair_field(record, "task_id", str, source, index),
        chosen=sides["chosen"],
        rejected=sides["rejected"],
        kind=_pair_field(record, "kind", str, source, index),
        lambda_dpo=parse_weight(record.get("lambda_dpo"), source, index, "lambda_dpo"),
        lambda_sft=parse_weight(record.get("lambda_sft"), source, index, "lambda_sft"),
        hard_negative=_pair_field(record, "hard_negative", bool, source, index),
    )
    if not pair.chosen.reward > pair.rejected.reward:  # every pair builder's invariant (pairs.py)
        problem = f"{pair.chosen.reward!r} is not above rejected.reward {pair.rejected.reward!r}"
        raise DataFormatError(source, index, "chosen.reward", problem)
    if record.get("pair_id", pair.pair_id) != pair.pair_id:
        raise DataFormatError(source, index, "pair_id", f"{record['pair_id']!r} does not match its sides")
    return pair


def write_pairs_jsonl(path: str | os.PathLike[str], pairs: Iterable[PreferencePair]) -> None:
    write_json_records(path, (pair_to_record(p) for p in pairs))


def read_pairs_jsonl(path: str | os.PathLike[str]) -> list[PreferencePair]:
    source = os.fspath(path)
    return [parse_pair_record(r, source=source, index=i) for i, r in enumerate(load_json_records(source))]
