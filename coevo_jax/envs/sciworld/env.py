"""`SciWorldEnv`: ScienceWorld (Wang et al., 2022) with ETO's splits, prompt, step limits and reward.

Splits (ETO's, `data`): `train` (1,483 tasks), `test_seen` (ETO's dev, 194) and `test_unseen` (ETO's
test, 211); a task id is `"{task_name}/{variation}"`, e.g. `"task-1-boil/4"`. As in ETO's `SciWorldEnv`, a
task is loaded with ScienceWorld's "easy" simplifications (teleport actions, open doors, self-watering flower
pots, and no electrical actions outside the electrical tasks), the episode starts after its first `look around`,
and the agent is shown the task description. The reward after each step is ETO's: the best score seen in the
episode (ScienceWorld's score / 100; ETO's `raw_score`), clamped to [0, 1] because a failed task scores -100.
An episode is done when ScienceWorld says the task is complete or failed (score < 0); the rollout loop
enforces ETO's step limits (`max_steps.json`). `info` carries the raw score of the step.

Each instance owns one JVM (`jvm`, its heap bounded by the default `-Xmx384m`), started on the
first `reset` and supervised (`supervisor`): a crashed or hung JVM is replaced, the episode replayed
and the step retried once; a second failure raises `SimulatorFailed`, which the rollout loop records as the
episode's `env_error`. The rollout loop's one environment per slot is the pool of JVMs; they start in
parallel because each starts inside its slot's first job. `close()` kills the JVM.

Expert trajectories come from ScienceWorld's gold action paths (`gold`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from coevo_jax.data.records import Message, Trajectory
from coevo_jax.envs.base import (
    Environment,
    ExpertStep,
    StepResult,
    check_split,
    check_task_id,
    record_expert_trajectory,
)
from coevo_jax.envs.sciworld.data import DATA_DIR, SPLIT_FILES, load_data, split_task_id
from coevo_jax.envs.sciworld.gold import ExpertResult, gold_expert_steps
from coevo_jax.envs.sciworld.jvm import JVMOptions
from coevo_jax.envs.sciworld.supervisor import SupervisedSimulator

log = logging.getLogger(__name__)
SPLITS = tuple(SPLIT_FILES)


@dataclass
class EnvTimings:
    """Wall time spent in the simulator by one environment (for throughput reports)."""

    resets: int = 0
    reset_seconds: float = 0.0
    steps: int = 0
    step_seconds: float = 0.0

    @property
    def steps_per_second(self) -> float:
        return self.steps / max(self.step_seconds, 1e-9)


class SciWorldEnv(Environment):
    """ScienceWorld behind ETO's protocol, one supervised JVM per instance (see the module docstring)."""

    name = "sciworld"

    def __init__(
        self,
        *,
        java_max_heap: str = "384m",
        step_timeout_s: float = 60.0,
        load_timeout_s: float = 120.0,
        start_timeout_s: float = 60.0,
        simplification: str = "easy",
        deterministic: bool = True,
        java: str = "java",
        data_dir: str | Path = DATA_DIR,
    ):
        self._data = load_data(data_dir)
        self._known = {task_id for ids in self._data.splits.values() for task_id in ids}
        self.simplification = simplification
        options = JVMOptions(java_max_heap, deterministic, java, start_timeout_s)
        self.simulator = SupervisedSimulator(
            options, load_timeout_s=load_timeout_s, step_timeout_s=step_timeout_s, label=self.name
        )
        self.timings = EnvTimings()
        self._variations: dict[str, int] = {}
        self._expert_cache: dict[str, list[ExpertStep]] = {}
        self._task_id: str | None = None
        self._best = 0.0
        self._done = False

    @property
    def instruction(self) -> str:
        return self._data.instruction

    def icl_messages(self) -> list[Message]:
        """ETO's in-context example (a solved ScienceWorld episode), for a one-shot prompt."""
        return list(self._data.icl_messages)

    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def tasks(self, split: str) -> list[str]:
        check_split("sciworld", split, SPLITS)
        return list(self._data.splits[split])

    def max_steps(self, task_id: str) -> int:
        name, _ = split_task_id(task_id)
        if name not in self._data.max_steps:
            raise ValueError(
                f"sciworld: task id {task_id!r}: task name {name!r} has no step limit in ETO's data"
            )
        return self._data.max_steps[name]

    def scienceworld_task(self, task_id: str) -> tuple[str, int]:
        """ScienceWorld's (task name, variation) of a task id; ValueError naming the id when it is not one.

        Ids outside the splits are accepted when ETO gives the task a step limit and the variation exists.
        """
        from scienceworld.utils import infer_task

        name, variation = split_task_id(task_id)
        self.max_steps(task_id)
        sw_name = infer_task(name)
        if task_id not in self._known:
            if sw_name not in self._variations:
                self._variations[sw_name] = self.simulator.max_variations(sw_name)
            if variation >= self._variations[sw_name]:
                raise ValueError(
                    f"sciworld: task id {task_id!r}: ScienceWorld has {self._variations[sw_name]} variations of {name}"
                )
        return sw_name, variation

    def reset(self, task_id: str) -> str:
        sw_name, variation = self.scienceworld_task(check_task_id(self.name, task_id))
        start = time.perf_counter()
        self._task_id, self._done, self._best = None, False, 0.0
        description = self.simulator.load(sw_name, variation, self.simplification)
        self._task_id = task_id
        self.timings.resets += 1
        self.timings.reset_seconds += time.perf_counter() - start
        return description

    def step(self, action: str) -> StepResult:
        if self._task_id is None:
            raise RuntimeError("sciworld: step() before reset()")
        if self._done:
            raise RuntimeError(f"sciworld: the episode of {self._task_id} is over; reset() first")
        start = time.perf_counter()
        outcome = self.simulator.step(action)
        self.timings.steps += 1
        self.timings.step_seconds += time.perf_counter() - start
        self._best = max(self._best, outcome.score)
        self._done = outcome.completed or outcome.score < 0
        info = {"raw_score": outcome.score, "completed": outcome.completed}
        return outcome.observation, min(max(self._best, 0.0), 1.0), self._done, info

    def gold_actions(self, task_id: str) -> list[str]:
        """ScienceWorld's gold action path of the task (`generateGoldPath=True`); ends the current episode."""
        sw_name, variation = self.scienceworld_task(task_id)
        self._task_id = None
        actions = self.simulator.gold_actions(sw_name, variation, self.simplification)
        if not actions or any(not isinstance(a, str) or a.startswith("ERROR") for a in actions):
            raise ValueError(
                f"sciworld: task {task_id}: ScienceWorld gave no usable gold path: {actions[:3]!r}"
            )
        return actions

    def expert_steps(self, task_id: str) -> list[ExpertStep]:
        """The gold path up to the step that completes the task, with templated thoughts (`gold`).

        Replays the path once to find that step, so it ends the current episode.
        """
        if task_id not in self._expert_cache:
            actions = self.gold_actions(task_id)
            self._expert_cache[task_id] = gold_expert_steps(self, task_id, actions, self.simplification)
        return list(self._expert_cache[task_id])

    def expert_result(self, task_id: str) -> ExpertResult:
        """Builds and replays the gold-path demonstration of `task_id` (ends the current episode)."""
        start = time.perf_counter()
        try:
            steps = self.expert_steps(task_id)
        except (RuntimeError, ValueError) as error:  # SimulatorFailed, no usable gold path
            return ExpertResult(
                task_id, None, f"{type(error).__name__}: {error}", 0, time.perf_counter() - start, 0.0
            )
        built = time.perf_counter()
        try:
            trajectory = record_expert_trajectory(self, task_id, steps)
        except (RuntimeError, ValueError) as error:
            reason = f"{type(error).__name__}: {error}"
            return ExpertResult(task_id, None, reason, len(steps), built - start, time.perf_counter() - built)
        reason = (
            None if trajectory.reward >= 1.0 else f"replay reaches reward {trajectory.reward:.3f}, not 1.0"
        )
        return ExpertResult(
            task_id, trajectory, reason, len(steps), built - start, time.perf_counter() - built
        )

    def expert_trajectories(self, split: str, limit: int | None = None) -> list[Trajectory]:
        """Gold-path trajectories of the first `limit` tasks of `split` that reach reward 1.0.

        `limit` counts tasks tried (each costs simulator time), so fewer come back when some fail; the others
        are logged with the reason; `python -m coevo_jax.envs.sciworld.experts` writes a whole split
        to a file in parallel and reports them.
        """
        kept = []
        for task_id in self.tasks(split)[:limit]:
            result = self.expert_result(task_id)
            if result.ok:
                kept.append(result.trajectory)
            else:
                log.warning("sciworld: no expert trajectory for %s: %s", task_id, result.reason)
        return kept

    def close(self) -> None:
        self._task_id = None
        self.simulator.close()
