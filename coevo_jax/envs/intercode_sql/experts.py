"""InterCode's GPT-4 episodes as expert demonstrations.

`ic_sql_multiturn_gpt-4_10_turns.json` holds, for each of the 1,034 tasks, GPT-4's SQL actions, the MySQL
observations and InterCode's reward after every turn (what `submit` would have scored then). `expert_steps`
and `replay_experts` turn the episodes that reached reward 1 into ReAct expert demonstrations: GPT-4's
actions up to its first reward-1 turn, each with a short templated thought, then `submit`. Turns that
InterCode's harness rejected before they reached the database ("Format your SQL command as follows ...")
are left out. Each demonstration is replayed through the environment and kept only if it scores 1.0 there.
The same episodes check our reward against InterCode's (`agreement`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from coevo_jax.data.converters import intercode_episode_to_trajectory
from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment, ExpertStep, record_expert_trajectory
from coevo_jax.envs.intercode_sql.db import DATA_DIR

EPISODES_PATH = DATA_DIR / "ic_sql_multiturn_gpt-4_10_turns.json"
HARNESS_REJECTION = "Format your SQL command as follows"


@dataclasses.dataclass(frozen=True)
class GptEpisode:
    """One recorded episode: actions, MySQL observations and InterCode's reward after each turn."""

    task_id: str
    actions: tuple[str, ...]
    observations: tuple[str, ...]
    rewards: tuple[float, ...]


def load_episodes(path: str | Path = EPISODES_PATH) -> list[GptEpisode]:
    """The episodes of an InterCode trajectory file, validated (errors name the file, record and field)."""
    source = str(path)
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataFormatError(source, -1, "<file>", f"cannot read JSON: {error}") from None
    if not isinstance(raw, dict):
        raise DataFormatError(source, -1, "<file>", "expected an object keyed by task id")
    episodes = []
    for index, (key, episode) in enumerate(raw.items()):
        intercode_episode_to_trajectory(key, episode, source_name=source, index=index)  # validates
        if not key.isdigit():
            raise DataFormatError(source, index, "<key>", f"task id {key!r} is not an index")
        history = episode["turn_history"]
        episodes.append(
            GptEpisode(
                key,
                tuple(history["actions"]),
                tuple(history["observations"]),
                tuple(float(r) for r in history["rewards"]),
            )
        )
    return episodes


def _thought(action: str, previous_observation: str | None, is_last_query: bool) -> str:
    statement = action.strip().rstrip(";")
    if re.match(r"^SHOW\s+TABLES", statement, re.I):
        return "I should find out which tables the database has."
    described = re.match(r"^(?:DESCRIBE|DESC|SHOW\s+COLUMNS\s+FROM)\s+`?(\w+)`?", statement, re.I)
    if described:
        return f"I need to know the columns of the {described.group(1)} table."
    if previous_observation is not None and previous_observation.startswith("Error executing query"):
        return "The last command failed, so I will correct it."
    if is_last_query:
        return "This query should answer the question."
    return "Let me query the data to get closer to the answer."


def expert_steps(episode: GptEpisode) -> list[ExpertStep] | None:
    """The episode's actions up to its first reward-1 turn, with thoughts, then submit; None if it never won."""
    if 1.0 not in episode.rewards:
        return None
    last = episode.rewards.index(1.0)
    kept = [
        (action, observation)
        for action, observation in zip(
            episode.actions[: last + 1], episode.observations[: last + 1], strict=True
        )
        if not observation.startswith(HARNESS_REJECTION)
    ]
    steps, previous = [], None
    for position, (action, observation) in enumerate(kept):
        steps.append(ExpertStep(_thought(action, previous, position == len(kept) - 1), action.strip()))
        previous = observation
    steps.append(ExpertStep("The last result answers the question, so I will submit it.", "submit"))
    return steps


def replay_experts(
    env: Environment, split: str = "train", episodes: list[GptEpisode] | None = None
) -> tuple[list[Trajectory], dict[str, str]]:
    """Expert trajectories of `split` replayed through `env` (reward 1.0 only) and why others were dropped.

    In the order of `episodes`, by default InterCode's file (`load_episodes`), which lists tasks by index.
    """
    wanted = set(env.tasks(split))
    kept, dropped = [], {}
    for episode in episodes if episodes is not None else load_episodes():
        if episode.task_id not in wanted:
            continue
        steps = expert_steps(episode)
        if steps is None:
            dropped[episode.task_id] = "GPT-4 never reached reward 1"
            continue
        trajectory = record_expert_trajectory(env, episode.task_id, steps)
        if trajectory.reward == 1.0:
            kept.append(trajectory)
        else:
            dropped[episode.task_id] = f"replay scored {trajectory.reward} here"
    return kept, dropped
