"""The CoEvolve task pool: synthesized tasks with their provenance, kept in one workdir file that resumes.

Each task keeps its `TaskSpec` (what the environments' `add_tasks` take), the signal that led to it
(forgetting, boundary, rare, or unguided), its parent task, the round and training step it came from, and
whether it was verified. Two tasks are the same when their environment, initial state, completion criterion
and solution are (`synthesis.spec_digest`); the pool keeps the first. Besides the tasks, the file holds the
signals' memory (`signals.SignalMemory`) and every round's report, so that a resumed run continues the
forgetting windows and rare counts where they were. It is rewritten whole and atomically at the end of each
round (`atomic_files`): a kill leaves the pool of the last finished round, never half of one; the main
job should number rounds by `num_rounds` for the same reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Iterable

from coevo_jax.atomic_files import atomic_path
from coevo_jax.coevolve.signals import SignalMemory
from coevo_jax.envs.base import TaskSpec

POOL_FILE = "coevolve_pool.json"
FORMAT = 1
PROVENANCES = ("forgetting", "boundary", "rare", "unguided")


@dataclasses.dataclass(frozen=True)
class PoolTask:
    """A synthesized task and where it came from."""

    spec: TaskSpec
    signal: str  # forgetting | boundary | rare | unguided
    parent_task: str
    round: int
    step: int | None  # the training step of the signal (None when unguided)
    verified: bool
    digest: str

    def to_json(self) -> dict:
        return {
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "spec": self.spec.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict) -> PoolTask:
        return cls(**{**data, "spec": TaskSpec.from_json(data["spec"])})


class TaskPool:
    """The synthesized tasks of a run, the signals' memory and the round reports (see the module docstring)."""

    def __init__(self, path: str | None = None):
        self.path = path
        self.tasks: list[PoolTask] = []
        self.memory = SignalMemory()
        self.rounds: list[dict] = []
        self._digests: set[str] = set()

    @classmethod
    def open(cls, workdir: str) -> TaskPool:
        """The pool of `workdir`: the one saved there, or a new empty one that will be saved there."""
        pool = cls(os.path.join(os.path.abspath(workdir), POOL_FILE))
        if os.path.exists(pool.path):
            with open(pool.path) as f:
                try:
                    data = json.load(f)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{pool.path}: not valid JSON ({error})") from None
            if data.get("format") != FORMAT:
                raise ValueError(f"{pool.path}: pool format {data.get('format')!r}, expected {FORMAT}")
            pool.memory = SignalMemory.from_json(data["memory"])
            pool.rounds = list(data["rounds"])
            pool.add(PoolTask.from_json(task) for task in data["tasks"])
        return pool

    def reload(self) -> None:
        """Reads the pool's file again in place (another process saved a round into it)."""
        saved = TaskPool.open(os.path.dirname(self.path))
        self.tasks, self.memory, self.rounds, self._digests = [], saved.memory, saved.rounds, set()
        self.add(saved.tasks)

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    def __len__(self) -> int:
        return len(self.tasks)

    def __contains__(self, digest: str) -> bool:
        return digest in self._digests

    def add(self, tasks: Iterable[PoolTask]) -> int:
        """Adds the tasks not already in the pool (by digest or task id); returns how many were new."""
        ids, added = {t.spec.task_id for t in self.tasks}, 0
        for task in tasks:
            if task.signal not in PROVENANCES:
                raise ValueError(f"pool task {task.spec.task_id}: unknown provenance {task.signal!r}")
            if task.digest in self._digests or task.spec.task_id in ids:
                continue
            self.tasks.append(task)
            self._digests.add(task.digest)
            ids.add(task.spec.task_id)
            added += 1
        return added

    def specs(self, env: str | None = None) -> list[TaskSpec]:
        """The tasks' specs (of environment `env`), in the order they joined: what `add_tasks` takes."""
        return [t.spec for t in self.tasks if env is None or t.spec.env == env]

    def finish_round(self, report: dict, tasks: Iterable[PoolTask], memory: SignalMemory) -> int:
        """Records a round: its new tasks, the signals' memory after it and its report; saves the pool."""
        added = self.add(tasks)
        self.memory = memory
        self.rounds.append(report)
        self.save()
        return added

    def makeup(self) -> list[dict[str, int]]:
        """The pool's make-up after each round: tasks by provenance (what the pool figure draws)."""
        by_round = Counter((t.round, t.signal) for t in self.tasks)
        rows, totals = [], Counter()
        for index in range(self.num_rounds):
            totals.update({s: by_round[(index, s)] for s in PROVENANCES})
            rows.append({"round": index, **{s: totals[s] for s in PROVENANCES}})
        return rows

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "memory": self.memory.to_json(),
            "rounds": self.rounds,
            "tasks": [t.to_json() for t in self.tasks],
        }

    def save(self) -> None:
        """Writes the pool to its file atomically (nothing for a pool without one)."""
        if self.path is None:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with atomic_path(self.path) as tmp, open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
