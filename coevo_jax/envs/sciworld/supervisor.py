"""Crash and hang recovery for ScienceWorld episodes: kill the JVM, start a new one, replay, retry once.

`SupervisedSimulator` owns one `ScienceWorldJVM` (started lazily) and records the episode in progress: the
task it loaded and every action with the observation, score and completion flag it produced. When a call
fails (`JVMError`: a crash, a Java exception, or no answer before the deadline), it kills the JVM, starts a new
one, reloads the task, replays the recorded actions and retries the failed call once. The replay must give
back exactly the recorded observations, scores and flags; with the deterministic JVM (`jvm`) it does,
and a replay that differs raises `ReplayDiverged` rather than continue from a state the agent never saw. If
the retry fails too, `SimulatorFailed` says what failed twice and why; the rollout loop records it as the
episode's `env_error`. Loading a task recovers the same way (there is nothing to replay).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from coevo_jax.envs.sciworld.jvm import JVMError, JVMOptions, ScienceWorldJVM

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_ACTION = "look around"  # ScienceWorld's reset takes this step; ETO's episodes start after it


class SimulatorFailed(RuntimeError):
    """The simulator failed again after a restart and replay: the episode cannot go on."""


class ReplayDiverged(SimulatorFailed):
    """A restarted JVM replayed the episode into a different state than the one recorded."""


@dataclass(frozen=True)
class StepOutcome:
    """What one action produced: the observation, ScienceWorld's score (-1..1) and its completion flag."""

    observation: str
    score: float
    completed: bool


@dataclass
class _Episode:
    task_name: str  # ScienceWorld's own name (e.g. "boil")
    variation: int
    simplification: str
    first: StepOutcome  # of FIRST_ACTION
    task_description: str
    actions: list[str] = field(default_factory=list)
    outcomes: list[StepOutcome] = field(default_factory=list)


class SupervisedSimulator:
    """One JVM's ScienceWorld with restart-and-replay recovery (see the module docstring)."""

    def __init__(self, options: JVMOptions, *, load_timeout_s: float, step_timeout_s: float, label: str):
        self.options = options
        self.load_timeout_s = load_timeout_s
        self.step_timeout_s = step_timeout_s
        self.label = label
        self.restarts = 0
        self._jvm: ScienceWorldJVM | None = None
        self._episode: _Episode | None = None

    @property
    def jvm(self) -> ScienceWorldJVM:
        """The current JVM, started on first use."""
        if self._jvm is None:
            self._jvm = ScienceWorldJVM(self.options)
        return self._jvm

    @property
    def started(self) -> bool:
        return self._jvm is not None

    def load(self, task_name: str, variation: int, simplification: str) -> str:
        """Starts an episode of the task (after ScienceWorld's first 'look around'); returns its description."""
        self._episode = None
        self._episode = self._recovering(
            f"loading {task_name}/{variation}",
            lambda: self._load(task_name, variation, simplification, False),
        )
        return self._episode.task_description

    def step(self, action: str) -> StepOutcome:
        """Applies `action` in the current episode."""
        episode = self._episode
        if episode is None:
            raise RuntimeError(f"{self.label}: step before a task was loaded")
        outcome = self._recovering(
            f"step {len(episode.actions) + 1} ({action!r}) of {episode.task_name}/{episode.variation}",
            lambda: self._step(action),
        )
        episode.actions.append(action)
        episode.outcomes.append(outcome)
        return outcome

    def gold_actions(self, task_name: str, variation: int, simplification: str) -> list[str]:
        """ScienceWorld's gold action sequence of the task; ends the current episode."""
        self._episode = None

        def gold():
            self._load(task_name, variation, simplification, True)
            return self.jvm.call("getGoldActionSequence", timeout_s=self.step_timeout_s)

        return self._recovering(f"generating the gold path of {task_name}/{variation}", gold)

    def max_variations(self, task_name: str) -> int:
        """How many variations ScienceWorld has of the task."""
        return self._recovering(
            f"counting variations of {task_name}",
            lambda: int(self.jvm.call("getTaskMaxVariations", task_name, timeout_s=self.step_timeout_s)),
        )

    def close(self) -> None:
        """Kills the JVM (a later call starts a new one)."""
        self._episode = None
        self._discard_jvm()

    def _load(self, task_name: str, variation: int, simplification: str, gold: bool) -> _Episode:
        jvm = self.jvm
        jvm.call("load", task_name, variation, simplification, gold, timeout_s=self.load_timeout_s)
        first = self._step(FIRST_ACTION)
        if first.observation.startswith("ERROR"):
            raise ValueError(
                f"{self.label}: ScienceWorld cannot load {task_name}/{variation}: {first.observation}"
            )
        description = jvm.call("freeActionTaskDesc", timeout_s=self.step_timeout_s)
        return _Episode(task_name, variation, simplification, first, description)

    def _step(self, action: str) -> StepOutcome:
        jvm, timeout_s = self.jvm, self.step_timeout_s
        observation = jvm.call("step", action, timeout_s=timeout_s)
        score = float(jvm.call("getScore", timeout_s=timeout_s))
        completed = bool(jvm.call("getCompleted", timeout_s=timeout_s))
        return StepOutcome(observation, score, completed)

    def _recovering(self, what: str, attempt: Callable[[], T]) -> T:
        """`attempt()`; on a JVM failure, a new JVM, the episode replayed, and one more `attempt()`."""
        try:
            return attempt()
        except JVMError as first:
            episode = self._episode
            replayed = len(episode.actions) if episode else 0
            log.warning(
                "%s: %s failed (%s); restarting the JVM and replaying %d actions",
                self.label,
                what,
                first,
                replayed,
            )
            self._discard_jvm()
            self.restarts += 1
            try:
                if episode is not None:
                    self._replay(episode)
                return attempt()
            except ReplayDiverged:
                self._episode = None
                self._discard_jvm()
                raise
            except JVMError as second:
                self._episode = None
                self._discard_jvm()
                raise SimulatorFailed(
                    f"{self.label}: {what} failed twice: {first}; then, after a JVM restart and a replay of "
                    f"{replayed} actions: {second}"
                ) from second

    def _replay(self, episode: _Episode) -> None:
        loaded = self._load(episode.task_name, episode.variation, episode.simplification, False)
        self._check_replay(episode, 0, FIRST_ACTION, loaded.first, episode.first)
        for index, (action, recorded) in enumerate(
            zip(episode.actions, episode.outcomes, strict=True), start=1
        ):
            self._check_replay(episode, index, action, self._step(action), recorded)

    def _check_replay(
        self, episode: _Episode, index: int, action: str, got: StepOutcome, recorded: StepOutcome
    ):
        if got != recorded:
            raise ReplayDiverged(
                f"{self.label}: replaying {episode.task_name}/{episode.variation} in a new JVM gave a different "
                f"result at step {index} ({action!r}): {got} instead of {recorded}"
            )

    def _discard_jvm(self) -> None:
        if self._jvm is not None:
            self._jvm.kill()
            self._jvm = None
