"""What every environment's synthesizer does (paper sections 3.2-3.3), and the parts they share.

A synthesizer re-explores its environment from a signal (`explore`: a seeded, biased walk that records the
(action, observation) steps), abstracts a successful sequence of at least `min_steps` steps into a new task
(`abstract`: a `TaskSpec` with an instruction from the environment's templates, the initial state and an
executable reference solution, or the reason there is none), and verifies a task by execution in an
environment that did not explore it (`verify`: the reason it fails, or None). Without a signal
(`guided=False`, the unguided-exploration ablation) the walk starts from a random train task and favours
nothing. The synthesizer of an environment is found by its name (`synthesizer_for`). The LLM path
(`llm`) explores and abstracts with a model instead, and asks the environment's synthesizer to judge its steps
(`step_ok`), to make its action sequence a task (`task_from_actions`) and to verify it (`verify`).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import importlib
import json
import random
from collections.abc import Mapping, Sequence

from coevo_jax.coevolve.signals import Signal
from coevo_jax.envs.base import Environment, TaskSpec


@dataclasses.dataclass(frozen=True)
class Step:
    """One interaction triple of an exploration (the paper's (a_t, o_t, id), the id being the exploration's):
    the action, what the environment answered, and whether it accepted the action (ran without error)."""

    action: str
    observation: str
    ok: bool


@dataclasses.dataclass(frozen=True)
class Exploration:
    """One exploration run: where it started (`parent`, a task id), its steps, and the environment-specific
    context the abstraction needs (the start state, what the signal pointed at)."""

    exploration_id: str
    signal: Signal | None
    parent: str
    steps: tuple[Step, ...]
    context: Mapping[str, object] = dataclasses.field(default_factory=dict)


class Synthesizer(abc.ABC):
    """An environment's explorer, abstraction and verification (see the module docstring)."""

    env_name: str = ""

    @abc.abstractmethod
    def explore(
        self,
        env: Environment,
        signal: Signal | None,
        rng: random.Random,
        *,
        steps: int,
        exploration_id: str,
    ) -> Exploration:
        """A walk of at most `steps` steps in `env`, biased by `signal` (None: unguided)."""

    @abc.abstractmethod
    def abstract(self, env: Environment, exploration: Exploration, *, min_steps: int) -> TaskSpec | str:
        """A new task from the exploration's successful steps, or why there is none (a short reason)."""

    @abc.abstractmethod
    def task_from_actions(
        self, env: Environment, parent: str, actions: Sequence[str], instruction: str, *, min_steps: int
    ) -> TaskSpec | str:
        """A task whose reference solution is `actions` (parsed), played from the start of task `parent`, in
        the words of `instruction` ("" for the environment's templates), or why there is none: the LLM
        path's abstraction, whose action sequence and query come from a model."""

    def step_ok(self, observation: str, info: dict) -> bool:
        """Whether the environment accepted an action played through `step` (the LLM path's exploration)."""
        return not observation.startswith("Error")

    def verify(self, env: Environment, spec: TaskSpec) -> str | None:
        """Why `spec` fails in `env` (a fresh environment), or None: by default its reference solution must
        reach reward 1.0 under the environment's own reward, ending the episode at its last step."""
        return replay_failure(env, spec)


def replay_failure(env: Environment, spec: TaskSpec) -> str | None:
    """Adds `spec` to `env` and replays its solution: None if it scores 1.0, else the reason."""
    try:
        env.add_tasks([spec])
        env.reset(spec.task_id)
    except ValueError as error:
        return f"unplayable: {error}"
    reward, done = 0.0, False
    for index, action in enumerate(spec.solution):
        if done:
            return f"ends at step {index} of {len(spec.solution)}"
        _, reward, done, _ = env.step(action)
    if reward < 1.0:
        return "replay scores below 1"
    return None


def spec_digest(env_name: str, state: Mapping, solution) -> str:
    """What makes two synthesized tasks the same: the environment, the initial state and completion
    criterion (`state`) and the solution, hashed (the wording of the instruction does not count)."""
    text = json.dumps([env_name, state, list(solution)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


_SYNTHESIZERS = {
    "builtin": "coevo_jax.coevolve.builtin_synthesis:BuiltinSynthesizer",
    "intercode_sql": "coevo_jax.coevolve.sql_synthesis:SqlSynthesizer",
    "bfcl": "coevo_jax.coevolve.bfcl_synthesis:BfclSynthesizer",
}


def synthesizer_for(env_name: str) -> Synthesizer:
    """The programmatic synthesizer of an environment; ValueError naming those that exist."""
    if env_name not in _SYNTHESIZERS:
        raise ValueError(
            f"no CoEvolve synthesizer for {env_name!r}; there is one for {sorted(_SYNTHESIZERS)}"
        )
    module_name, attribute = _SYNTHESIZERS[env_name].split(":")
    return getattr(importlib.import_module(module_name), attribute)()
