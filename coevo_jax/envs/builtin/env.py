"""`BuiltinEnv`: the default environment, small procedural ScienceWorld-like tasks in pure Python.

Four rooms, food, containers, a stove, a freezer, a knife and a mixing bowl (`world`); task families
of 3–6 subgoals each, seen ones for train/dev/test_seen and unseen recombinations for dev_unseen/test_unseen
(`tasks`, whose docstring lists them). The score after each step is the fraction of the task's
subgoals reached so far: a reached subgoal stays reached, so the score never decreases, and it is exactly 1.0
when all are reached, which ends the episode (`done`). Failed episodes therefore land on partial scores
(e.g. 0.25, 0.5, 0.75), near-misses included. Invalid actions get feedback and change nothing.

The step budget is `max_steps = budget_per_expert_step * (expert solution length) + budget_extra_steps`
(2 and 5 by default); the rollout loop enforces it. A tighter budget makes tasks no easier (the score still
needs every subgoal) and makes failed episodes, which play to the budget, cheaper. Stepping
before `reset` or after `done` raises RuntimeError. Everything is a function of (seed, task id): no global
random state, clock or set order.

`add_tasks` takes other tasks on the same rules (CoEvolve's synthesized ones): a start world, subgoals of the
same condition kinds, and a reference solution that is their expert (`tasks.task_from_spec`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import (
    GRADED_SCORE,
    Environment,
    ExpertStep,
    StepResult,
    TaskSpec,
    check_split,
    check_task_id,
    is_new_spec,
    record_expert_trajectory,
)
from coevo_jax.envs.builtin.experts import expert_steps
from coevo_jax.envs.builtin.tasks import Task, build_splits, holds, task_from_spec
from coevo_jax.envs.builtin.world import World

SPLITS = ("train", "dev", "dev_unseen", "test_seen", "test_unseen")
INSTRUCTION = (
    "You are an agent in a small house with four rooms: hallway, kitchen, workshop and greenhouse. "
    "The kitchen has a stove, a freezer and a bowl. Things in the stove get hot while it is on, and things in "
    "the freezer get cold. A held knife slices food. Complete the task you are given.\n"
    "Available actions: look around; inventory; go to ROOM; examine OBJ; focus on OBJ; pick up OBJ; "
    "put OBJ in CONTAINER; activate DEVICE; deactivate DEVICE; use TOOL on OBJ; mix CONTAINER.\n"
    "Reply in this format:\nThought: your reasoning\nAction: one action"
)


class BuiltinEnv(Environment):
    """Procedural multi-step tasks with graded reward and an expert solver (see the module docstring)."""

    name = "builtin"

    def __init__(
        self,
        seed: int = 0,
        num_train: int = 300,
        num_test_seen: int = 200,
        num_test_unseen: int = 200,
        num_dev: int = 100,
        num_dev_unseen: int = 100,
        budget_per_expert_step: int = 2,
        budget_extra_steps: int = 5,
    ):
        if budget_per_expert_step < 1 or budget_extra_steps < 0:
            raise ValueError(
                f"builtin: budget_per_expert_step must be >= 1 and budget_extra_steps >= 0, got "
                f"{budget_per_expert_step} and {budget_extra_steps}"
            )
        self.seed = seed
        self.budget = (budget_per_expert_step, budget_extra_steps)
        sizes = {
            "train": num_train,
            "dev": num_dev,
            "dev_unseen": num_dev_unseen,
            "test_seen": num_test_seen,
            "test_unseen": num_test_unseen,
        }
        self._splits = build_splits(seed, sizes)
        self._tasks = {task.task_id: task for tasks in self._splits.values() for task in tasks}
        self._expert_cache: dict[str, list[ExpertStep]] = {}
        self._added: dict[str, TaskSpec] = {}
        self._task: Task | None = None
        self._world: World | None = None
        self._reached: list[bool] = []
        self._invalid = 0
        self._done = False

    @property
    def instruction(self) -> str:
        return INSTRUCTION

    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def tasks(self, split: str) -> list[str]:
        check_split("builtin", split, SPLITS)
        return [task.task_id for task in self._splits[split]]

    def task(self, task_id: str) -> Task:
        """The task behind `task_id`; ValueError when it is in none of the splits."""
        if task_id not in self._tasks:
            raise ValueError(f"builtin: unknown task id {task_id!r} for seed {self.seed}")
        return self._tasks[task_id]

    def add_tasks(self, specs: Iterable[TaskSpec]) -> None:
        """Added tasks (`tasks.task_from_spec`): a start world, subgoals and a reference solution each; the
        solution is their expert, and it sets their step budget as a planned one does."""
        for spec in specs:
            own = spec.task_id in self._tasks and spec.task_id not in self._added
            if is_new_spec(self.name, self._added, spec, own):
                self._tasks[spec.task_id] = task_from_spec(spec)
                self._added[spec.task_id] = spec

    def max_steps(self, task_id: str) -> int:
        per_step, extra = self.budget
        return per_step * len(self.expert_steps(task_id)) + extra

    def reset(self, task_id: str) -> str:
        self._task = self.task(check_task_id("builtin", task_id))
        self._world = self._task.start.copy()
        self._reached = [False] * len(self._task.subgoals)
        self._closest = [0.0] * len(self._task.subgoals)  # most of each subgoal's conditions held at once
        self._invalid = 0
        self._done = False
        return self._task.text

    def step(self, action: str) -> StepResult:
        if self._world is None or self._task is None:
            raise RuntimeError("builtin: step() before reset()")
        if self._done:
            raise RuntimeError(f"builtin: task {self._task.task_id} is already complete; reset() first")
        observation, valid = self._world.step(action)
        self._invalid += not valid
        for index, subgoal in enumerate(self._task.subgoals):
            held = sum(holds(self._world, c) for c in subgoal) / len(subgoal)
            self._closest[index] = max(self._closest[index], held)
            self._reached[index] = self._reached[index] or held == 1.0
        self._done = all(self._reached)
        info = {"valid": valid, "subgoals_reached": sum(self._reached), "subgoals": len(self._reached)}
        return observation, self.score, self._done, info

    @property
    def score(self) -> float:
        """The fraction of subgoals reached so far in this episode (exactly 1.0 when the task is complete)."""
        return 1.0 if self._done else sum(self._reached) / len(self._reached)

    def state_key(self) -> str:
        """The world (room, every thing's place and state, focus) and the subgoals reached, which the score
        counts: the whole state the rest of the episode depends on."""
        if self._world is None:
            raise RuntimeError("builtin: state_key() before reset()")
        return json.dumps([self._world.to_json(), self._reached], sort_keys=True, separators=(",", ":"))

    def episode_metrics(self) -> dict[str, float]:
        """The episode's actions the world refused (a well-formed action it cannot do: wrong room, object not
        here), a symptom of a policy drifting off what the experts taught; and its sub-goal progress
        (`GRADED_SCORE`): per subgoal 1 when reached, else the largest share of its conditions that held at
        once, averaged; it separates failures whose reward (subgoals reached) is the same."""
        if self._task is None:
            return {}
        progress = sum(self._closest) / len(self._closest)
        return {"invalid_actions": float(self._invalid), GRADED_SCORE: 1.0 if self._done else progress}

    def admissible_actions(self) -> list[str]:
        """The actions the current state accepts, sorted (for random baselines and debugging)."""
        if self._world is None:
            raise RuntimeError("builtin: admissible_actions() before reset()")
        return self._world.admissible_actions()

    def expert_steps(self, task_id: str) -> list[ExpertStep]:
        """A short solution with a thought per step, planned from the task's world."""
        task = self.task(task_id)
        if task.solution:
            return [ExpertStep("This step is part of the reference solution.", a) for a in task.solution]
        if task_id not in self._expert_cache:
            self._expert_cache[task_id] = expert_steps(task)
        return list(self._expert_cache[task_id])

    def expert_trajectories(self, split: str, limit: int | None = None) -> list[Trajectory]:
        """The planner's trajectory on each of the first `limit` tasks of `split`, none left out."""
        return [
            record_expert_trajectory(self, task_id, self.expert_steps(task_id))
            for task_id in self.tasks(split)[:limit]
        ]
