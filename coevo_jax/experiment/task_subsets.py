"""Which tasks of a split a run uses when it uses fewer than all: the first N, or N spread over the split.

Some test splits are sorted by task kind (ETO's ScienceWorld unseen test lists every boiling task first), so
their first N tasks test one kind; `spread` takes every (len/N)-th task instead, keeping the split's mix of
kinds. Exploration takes the first N train tasks: those are the tasks the environment's experts come
from, and ETO and co-evolution pair an explored episode only with its own task's expert
(`tasks_with_experts` counts how many can be paired); or, with N = `ALL_WITH_EXPERTS` (0), every train task
that has an expert, the paper's and ETO's protocol (`explored_tasks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from coevo_jax.data.records import Trajectory

TASK_SUBSETS = ("first", "spread")
ALL_WITH_EXPERTS = 0  # `env.explore_tasks`: every train task that has an expert trajectory


def pick_tasks(tasks: Sequence[str], count: int | None, subset: str) -> list[str]:
    """`count` tasks of `tasks` (all of them when `count` is None or not smaller), chosen as `subset` says."""
    if subset not in TASK_SUBSETS:
        raise ValueError(f"task subset {subset!r}: one of {TASK_SUBSETS}")
    if count is None or count >= len(tasks):
        return list(tasks)
    if count < 0:
        raise ValueError(f"task count must be >= 0, got {count}")
    if subset == "first":
        return list(tasks[:count])
    return [tasks[(i * len(tasks)) // count] for i in range(count)]


def explored_tasks(train_tasks: Sequence[str], count: int | None, experts: Iterable[Trajectory]) -> list[str]:
    """The train tasks a run explores, in split order: every one with an expert for `ALL_WITH_EXPERTS`, else
    the first `count` (all of them for None)."""
    if count == ALL_WITH_EXPERTS:
        return tasks_with_experts(train_tasks, experts)
    return pick_tasks(train_tasks, count, "first")


def tasks_with_experts(tasks: Sequence[str], experts: Iterable[Trajectory]) -> list[str]:
    """The tasks of `tasks` (in order) that have an expert trajectory among `experts`."""
    covered = {expert.task_id for expert in experts}
    return [task for task in tasks if task in covered]
