"""The environment interface the rollout loop drives, and expert-trajectory recording through it.

An `Environment` instance plays one episode at a time and is not thread-safe; the rollout loop keeps one
instance per slot. `reset(task_id)` returns the task text the agent sees first (the third message of ETO's
prompt layout, after the environment's `instruction` and the agent's "OK"); `step(action)` takes the parsed
action (not the raw reply) and returns `(observation, reward, done, info)`, where `reward` is the episode's
score so far in [0, 1] (the trajectory's reward r(u, e) is the last one returned) and the observation is the
environment's raw text (the loop adds `Observation: `). `expert_trajectories(split, limit)` gives the expert
demonstrations a run clones (SFT) and pairs against (ETO, eq. 8), each replayed through the environment with
`record_expert_trajectory`, so its reward is the environment's own.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from coevo_jax.data.records import ASSISTANT, ETO_ACK, USER, Message, Trajectory
from coevo_jax.react import OBSERVATION_PREFIX, format_observation, format_reply

StepResult = tuple[str, float, bool, dict]


class Environment(abc.ABC):
    """A text environment with named task splits (see the module docstring for the contract)."""

    name: str = ""
    observation_prefix: str = OBSERVATION_PREFIX  # how observations are introduced to the agent

    @property
    @abc.abstractmethod
    def instruction(self) -> str:
        """Task-independent instructions (rules, action syntax); the first message of every prompt."""

    @abc.abstractmethod
    def splits(self) -> tuple[str, ...]:
        """Names of the task splits, e.g. ('train', 'test_seen', 'test_unseen')."""

    @abc.abstractmethod
    def tasks(self, split: str) -> list[str]:
        """Task ids of `split`, in a fixed order; raises ValueError naming the split when unknown."""

    @abc.abstractmethod
    def max_steps(self, task_id: str) -> int:
        """Step budget of the task (invalid replies spend steps too)."""

    @abc.abstractmethod
    def reset(self, task_id: str) -> str:
        """Starts an episode of `task_id`; returns the task text."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Applies one action; returns (observation text, score so far in [0, 1], done, info)."""

    @abc.abstractmethod
    def expert_trajectories(self, split: str, limit: int | None = None) -> list[Trajectory]:
        """At most `limit` expert trajectories on tasks of `split`, in task order (all when `limit` is None).

        Each is replayed through this environment, which ends any episode in progress. Environments whose
        expert demonstrations can fail may leave tasks out, and say how `limit` counts them; one that has no
        expert source of its own raises ValueError saying so (a run then reads `env.experts_path`).
        """

    def episode_metrics(self) -> dict[str, float]:
        """Measures of the episode just played besides its reward (BFCL's turn accuracy), asked once it has
        ended, for whatever reason; the rollout loop keeps them in the trajectory's `extra["metrics"]`.
        The default has none."""
        return {}

    def close(self) -> None:  # noqa: B027 (an optional hook: most environments hold nothing)
        """Releases external resources (processes, connections); the default has none."""


def check_task_id(env_name: str, task_id: object) -> str:
    """`task_id` if it is a string; otherwise a ValueError saying ids are strings (809 -> use '809')."""
    if not isinstance(task_id, str):
        raise ValueError(
            f"{env_name}: a task id must be a string (as tasks() lists them), got {type(task_id).__name__} "
            f"{task_id!r}; use {str(task_id)!r}"
        )
    return task_id


def check_split(env_name: str, split: str, splits) -> str:
    """`split` if it is one of `splits`; otherwise a ValueError naming the environment and its splits."""
    if split not in splits:
        raise ValueError(f"{env_name}: unknown split {split!r}; splits: {', '.join(splits)}")
    return split


@dataclass(frozen=True)
class ExpertStep:
    """One step of an expert solution: a short thought and the action."""

    thought: str
    action: str


def prompt_messages(env: Environment, task_text: str) -> list[Message]:
    """ETO's prompt layout: the instruction, the agent's "OK", then the task."""
    return [Message(USER, env.instruction), Message(ASSISTANT, ETO_ACK), Message(USER, task_text)]


def record_expert_trajectory(
    env: Environment, task_id: str, steps: Sequence[ExpertStep], *, traj_id: str | None = None
) -> Trajectory:
    """Replays an expert solution through `env` and records it as an expert `Trajectory`.

    The reward is what the environment reports, so a broken solution shows up as reward < 1, never as a
    silently "successful" demonstration. Raises ValueError if the episode ends before the last step.
    """
    messages = prompt_messages(env, env.reset(task_id))
    reward, done = 0.0, False
    for index, step in enumerate(steps):
        if done:
            raise ValueError(f"{env.name} task {task_id}: episode ended before expert step {index}")
        observation, reward, done, _ = env.step(step.action)
        messages.append(Message(ASSISTANT, format_reply(step.thought, step.action)))
        messages.append(Message(USER, format_observation(observation, env.observation_prefix)))
    return Trajectory(
        traj_id=traj_id or f"{env.name}_{task_id}_expert",
        task_id=task_id,
        messages=tuple(messages[:-1]),  # the last observation is never seen by the agent
        reward=float(reward),
        agent="expert",
        prompt_len=3,
        env=env.name,
    )
