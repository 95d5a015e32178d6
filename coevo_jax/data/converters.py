"""Turn real third-party episode files into `Trajectory` objects (ETO conversation records).

Two sources are supported, both parsed strictly (errors name file, record index and field):

* ETO in-context examples (`*_icl.json`): a JSON list of conversations, each a list of messages. The real
  files mix `{"role": ...}` and `{"from": "gpt", ...}` spellings; both are accepted. They are expert
  demonstrations and carry no reward, so they get `reward=1.0` unless told otherwise. Given the
  environment's instruction turn (`*_inst.txt`), the trajectory gets ETO's prompt layout (instruction,
  "OK", the example's first user turn), as in ETO's SFT data.
* InterCode-SQL episodes (`ic_sql_multiturn_gpt-4_10_turns.json`): a JSON object keyed by task, each with
  `query` and `turn_history.{actions, observations, rewards}`, in ETO's layout: the instruction, "OK",
  then "Database: <db>\nQuestion: <query>" as the task turn. Each SQL action becomes an assistant turn
  "Action: <sql>" and each observation a user turn "Observation: <output>". The trajectory reward r(u, e)
  is InterCode's reward after the final turn (the episode ends when it reaches 1.0 or the turn limit).
  The producing model goes to `sampling["model"]`; the agent label defaults to "expert" (GPT-4 episodes
  are ETO's expert source; filter on reward before using them as experts).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from coevo_jax.data.formats import with_eto_prompt
from coevo_jax.data.json_files import DataFormatError, load_json_records
from coevo_jax.data.record_reader import parse_record
from coevo_jax.data.records import ETO_ACK, Trajectory

INTERCODE_SQL_INSTRUCTION = (
    "You are an agent that answers questions about a MySQL database by querying it. "
    "Each turn, write one SQL query; the environment replies with its output or its error message. "
    "Explore the schema when you need to (SHOW TABLES, DESCRIBE <table>). "
    'Your output must strictly follow this format: "Action: <one SQL query>".'
)


def icl_examples_to_trajectories(
    conversations: object,
    *,
    env_name: str,
    source_name: str = "<memory>",
    instruction: str | None = None,
    reward: float = 1.0,
) -> list[Trajectory]:
    """ETO in-context examples (a list of message lists) as expert trajectories.

    With `instruction`, the prompt becomes ETO's (instruction, "OK", first user turn) with `prompt_len` 3.
    """
    if not isinstance(conversations, list):
        raise DataFormatError(source_name, -1, "<file>", "expected a list of conversations")
    trajectories = []
    for index, messages in enumerate(conversations):
        if not isinstance(messages, list):
            raise DataFormatError(source_name, index, "conversations", "expected a list of messages")
        record = {
            "id": f"{env_name}_icl_{index}",
            "env": env_name,
            "conversations": messages,
            "reward": reward,
        }
        trajectory = parse_record(record, source=source_name, index=index)
        if instruction is not None:
            trajectory = with_eto_prompt(trajectory, instruction.rstrip())
        trajectories.append(trajectory)
    return trajectories


def read_icl_examples(
    path: str | os.PathLike[str], *, env_name: str, instruction: str | None = None
) -> list[Trajectory]:
    """Read an ETO `*_icl.json` file."""
    return icl_examples_to_trajectories(
        load_json_records(path), env_name=env_name, source_name=os.fspath(path), instruction=instruction
    )


def _episode_list(episode: Mapping, key: str, source: str, index: int, item_type: type | tuple) -> list:
    history = episode.get("turn_history")
    if not isinstance(history, Mapping):
        raise DataFormatError(source, index, "turn_history", "expected an object")
    values = history.get(key)
    if not isinstance(values, list):
        raise DataFormatError(source, index, f"turn_history.{key}", "expected a list")
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, item_type):
            raise DataFormatError(source, index, f"turn_history.{key}[{i}]", f"unexpected value {value!r}")
    return values


def intercode_episode_to_trajectory(
    key: str,
    episode: object,
    *,
    source_name: str = "<memory>",
    index: int = 0,
    instruction: str = INTERCODE_SQL_INSTRUCTION,
    db: str | None = None,
    model: str = "gpt-4",
    agent: str = "expert",
) -> Trajectory:
    """One InterCode-SQL episode as a trajectory with task id `intercode_sql_<key>`, in ETO's layout."""
    if not isinstance(episode, Mapping):
        raise DataFormatError(
            source_name, index, "<record>", f"expected an object, got {type(episode).__name__}"
        )
    query = episode.get("query")
    if not isinstance(query, str) or not query:
        raise DataFormatError(source_name, index, "query", f"expected a non-empty string, got {query!r}")
    actions = _episode_list(episode, "actions", source_name, index, str)
    observations = _episode_list(episode, "observations", source_name, index, str)
    rewards = _episode_list(episode, "rewards", source_name, index, (int, float))
    if not actions:
        raise DataFormatError(source_name, index, "turn_history.actions", "no turns")
    for name, values in (("observations", observations), ("rewards", rewards)):
        if len(values) != len(actions):
            raise DataFormatError(
                source_name,
                index,
                f"turn_history.{name}",
                f"{len(values)} entries for {len(actions)} actions",
            )
    for turn, value in enumerate(rewards):  # only the last is the trajectory's, but none may be NaN or inf
        if not math.isfinite(value):
            field_name = f"turn_history.rewards[{turn}]"
            raise DataFormatError(source_name, index, field_name, f"expected a finite number, got {value!r}")
    final_reward = float(rewards[-1])
    if not 0.0 <= final_reward <= 1.0:
        raise DataFormatError(
            source_name,
            index,
            f"turn_history.rewards[{len(rewards) - 1}]",
            f"{final_reward!r} is outside [0, 1]",
        )
    database = f"Database: {db}\n" if db else ""
    conversation = [
        {"from": "human", "value": instruction},
        {"from": "gpt", "value": ETO_ACK},
        {"from": "human", "value": f"{database}Question: {query}"},
    ]
    for action, observation in zip(actions, observations, strict=True):
        conversation.append({"from": "gpt", "value": f"Action: {action}"})
        conversation.append({"from": "human", "value": f"Observation: {observation}"})
    conversation.pop()  # e = (u, a_1, o_1, ..., a_n): the last observation is not part of the trajectory
    record = {
        "id": f"intercode_sql_{key}_{model}",
        "task_id": f"intercode_sql_{key}",
        "env": "intercode_sql",
        "agent": agent,
        "reward": final_reward,
        "prompt_len": 3,
        "sampling": {"model": model},
        "conversations": conversation,
        "hardness": episode.get("hardness"),
    }
    return parse_record(record, source=source_name, index=index)


def read_intercode_trajectories(
    path: str | os.PathLike[str],
    *,
    instruction: str = INTERCODE_SQL_INSTRUCTION,
    dbs: Mapping[str, str] | None = None,
    model: str = "gpt-4",
    agent: str = "expert",
) -> list[Trajectory]:
    """Read an InterCode trajectory file (object keyed by task); `dbs` maps task key to database name."""
    source_name = os.fspath(path)
    episodes = load_json_records(path)
    if not isinstance(episodes, Mapping):
        raise DataFormatError(source_name, -1, "<file>", "expected an object keyed by task")
    return [
        intercode_episode_to_trajectory(
            key,
            episode,
            source_name=source_name,
            index=index,
            instruction=instruction,
            db=(dbs or {}).get(key),
            model=model,
            agent=agent,
        )
        for index, (key, episode) in enumerate(episodes.items())
    ]
