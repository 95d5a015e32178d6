"""The environment interface the rollout loop drives, and expert-trajectory recording through it.

An `Environment` instance plays one episode at a time and is not thread-safe; the rollout loop keeps one
instance per slot. `reset(task_id)` returns the task text the agent sees first (the third message of ETO's
prompt layout, after the environment's `instruction` and the agent's "OK"); `step(action)` takes the parsed
action (not the raw reply) and returns `(observation, reward, done, info)`, where `reward` is the episode's
score so far in [0, 1] (the trajectory's reward r(u, e) is the last one returned) and the observation is the
environment's raw text (the loop adds `Observation: `). `expert_trajectories(split, limit)` gives the expert
demonstrations a run clones (SFT) and pairs against (ETO, eq. 8), each replayed through the environment with
`record_expert_trajectory`, so its reward is the environment's own.

`state_key()` names the state the episode is in, so that steps of a task's episodes taken from the same state
can be compared (GiGPO's step groups): equal keys, same state. An environment that returns None (the default)
is keyed by the history of observations since `reset`, which is the state wherever observations are
deterministic.

`add_tasks(specs)` gives an environment tasks beyond its own splits (CoEvolve's synthesized tasks): each a
`TaskSpec`, a JSON-able id, task text, initial state and reference solution that the environment reads into
its own task form, after which `reset(spec.task_id)` plays it like any other task. Added tasks are in no split.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coevo_jax.data.records import ASSISTANT, ETO_ACK, USER, Message, Trajectory
from coevo_jax.react import OBSERVATION_PREFIX, format_observation, format_reply

StepResult = tuple[str, float, bool, dict]
# The `episode_metrics` entry that grades an episode more finely than its reward (in [0, 1], higher is closer
# to success): what ranks the failures of a GRPO group whose rewards are all equal (`grpo.dead_groups`).
GRADED_SCORE = "graded_score"


@dataclass(frozen=True)
class TaskSpec:
    """A task given to an environment at run time: everything it needs to `reset` to it, as JSON values.

    `instruction` is the request in words (the question; BFCL's turns are in `state`); `state` is the
    environment's own description of the start and of what completes the task (a world and its subgoals, a
    database and its gold query, BFCL's backend configuration, turns and ground truth); `solution` is a
    reference solution, the parsed actions that complete it.
    """

    task_id: str
    instruction: str
    state: Mapping[str, object]
    solution: tuple[str, ...]
    env: str = field(default="")

    def to_json(self) -> dict[str, object]:
        return {
            "task_id": self.task_id,
            "env": self.env,
            "instruction": self.instruction,
            "state": self.state,
            "solution": list(self.solution),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> TaskSpec:
        missing = {"task_id", "instruction", "state", "solution"} - set(data)
        if missing:
            raise ValueError(f"task spec {data.get('task_id', '?')!r}: missing fields {sorted(missing)}")
        return cls(
            task_id=str(data["task_id"]),
            instruction=str(data["instruction"]),
            state=data["state"],
            solution=tuple(str(action) for action in data["solution"]),
            env=str(data.get("env", "")),
        )


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

    def add_tasks(self, specs: Iterable[TaskSpec]) -> None:
        """Makes each spec playable by `reset(spec.task_id)` (in no split). Adding an equal spec again does
        nothing; another spec under a taken id is a ValueError. The default accepts none."""
        raise NotImplementedError(f"{self.name}: this environment does not accept added tasks")

    def state_key(self) -> str | None:
        """A key of the episode's current state (equal keys: the same state, the same future rewards for the
        same actions), or None: the rollout loop then keys states by the observations since `reset`."""
        return None

    def episode_metrics(self) -> dict[str, float]:
        """Measures of the episode just played besides its reward (BFCL's turn accuracy), asked once it has
        ended, for whatever reason; the rollout loop keeps them in the trajectory's `extra["metrics"]`.
        `GRADED_SCORE`, where an environment has one, grades the episode more finely than its reward.
        The default has none."""
        return {}

    def close(self) -> None:  # noqa: B027 (an optional hook: most environments hold nothing)
        """Releases external resources (processes, connections); the default has none."""


def is_new_spec(env_name: str, added: Mapping[str, TaskSpec], spec: TaskSpec, own_id: bool) -> bool:
    """Whether `spec` is new to an environment whose added specs are `added` (`own_id`: the id is one of the
    environment's own tasks); an equal spec already added is not, another spec under a taken id is an error."""
    if not isinstance(spec, TaskSpec):
        raise ValueError(f"{env_name}: expected a TaskSpec, got {type(spec).__name__}")
    check_task_id(env_name, spec.task_id)
    if own_id:
        raise ValueError(f"{env_name}: task id {spec.task_id!r} is one of the environment's own tasks")
    if spec.task_id in added:
        if added[spec.task_id].to_json() != spec.to_json():
            raise ValueError(f"{env_name}: another task was already added under the id {spec.task_id!r}")
        return False
    return True


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
