"""What every preference-pair builder shares (`data.pairs`): the pair and dataset types, the pair kinds and
their loss weights, deduplicated per-task pools, the pairing rule and the canonical order with the per-task cap.
"""

from __future__ import annotations

import itertools
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from coevo_jax.data.records import Trajectory
from coevo_jax.data.reports import DatasetReport, dataset_report

EXPERT_VS_TARGET = "expert_vs_target"
EXPERT_VS_FAILURE = "expert_vs_failure"
EXPERT_VS_POSITIVE = "expert_vs_positive"
FAILURE_VS_FAILURE = "failure_vs_failure"  # F_tgt x F_fail: a target failure vs a failure-agent failure
TARGET_VS_TARGET = "target_vs_target"  # within F_tgt (D_fail with include_within_agent)
FAILURE_AGENT_VS_FAILURE_AGENT = "failure_agent_vs_failure_agent"  # within F_fail
EXPERT_PAIR_WEIGHTS = (0.5, 0.5)  # (lambda_DPO, lambda_SFT), paper section 4.3
FAILURE_PAIR_WEIGHTS = (1.0, 0.0)
ETO_PAIR_WEIGHTS = (1.0, 0.0)
DEFAULT_HARD_NEGATIVE_THRESHOLD = 0.6


@dataclass(frozen=True)
class PreferencePair:
    task_id: str
    chosen: Trajectory
    rejected: Trajectory
    kind: str
    lambda_dpo: float
    lambda_sft: float
    hard_negative: bool = False  # r(u, e_rejected) >= the builder's hard_negative_threshold

    @property
    def pair_id(self) -> str:
        return f"{self.kind}:{self.chosen.traj_id}>{self.rejected.traj_id}"


@dataclass(frozen=True)
class PreferenceDataset(Sequence):
    """A built dataset: its pairs in canonical order (index it, iterate it, len() it) and its report."""

    pairs: tuple[PreferencePair, ...]
    report: DatasetReport

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index):
        return self.pairs[index]

    def __iter__(self) -> Iterator[PreferencePair]:
        return iter(self.pairs)


@dataclass
class Counts:
    """Book-keeping while building: what was removed or skipped, for the report."""

    duplicates_removed: dict[str, int] = field(default_factory=dict)
    ties_skipped: int = 0
    identical_skipped: int = 0


def is_failure(trajectory: Trajectory, success_threshold: float = 1.0) -> bool:
    return trajectory.reward < success_threshold


def deduplicate(trajectories: Iterable[Trajectory]) -> tuple[list[Trajectory], int]:
    """Keep one trajectory (the smallest id) per (task id, messages); returns (kept, number removed)."""
    kept: dict[tuple, Trajectory] = {}
    items = sorted(trajectories, key=lambda t: t.traj_id)
    for trajectory in items:
        kept.setdefault((trajectory.task_id, trajectory.messages), trajectory)
    return list(kept.values()), len(items) - len(kept)


def group_by_task(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.task_id].append(trajectory)
    return {task: sorted(group, key=lambda t: t.traj_id) for task, group in groups.items()}


def task_pool(name: str, trajectories: Iterable[Trajectory], counts: Counts) -> dict[str, list[Trajectory]]:
    """Deduplicated and grouped by task; the removed duplicates are counted under `name`."""
    kept, removed = deduplicate(trajectories)
    counts.duplicates_removed[name] = counts.duplicates_removed.get(name, 0) + removed
    return group_by_task(kept)


def failures_by_task(
    groups: dict[str, list[Trajectory]], success_threshold: float
) -> dict[str, list[Trajectory]]:
    return {task: [t for t in group if is_failure(t, success_threshold)] for task, group in groups.items()}


def make_pair(
    a: Trajectory, b: Trajectory, kind: str, weights: tuple[float, float], counts: Counts
) -> PreferencePair | None:
    """The pair with the higher reward chosen, or None (counted) when the rewards tie or the messages match."""
    if a.reward == b.reward:
        counts.ties_skipped += 1
        return None
    if a.messages == b.messages:
        counts.identical_skipped += 1
        return None
    chosen, rejected = (a, b) if a.reward > b.reward else (b, a)
    if chosen.prompt != rejected.prompt:
        raise ValueError(
            f"task {chosen.task_id}: {chosen.traj_id} and {rejected.traj_id} have different instruction prompts"
        )
    return PreferencePair(chosen.task_id, chosen, rejected, kind, weights[0], weights[1])


def cross_pairs(
    xs: Sequence[Trajectory],
    ys: Sequence[Trajectory],
    kind: str,
    weights: tuple[float, float],
    counts: Counts,
) -> list[PreferencePair]:
    """Every (x, y) in xs x ys that makes a pair."""
    made = (make_pair(x, y, kind, weights, counts) for x in xs for y in ys)
    return [p for p in made if p is not None]


def within_pairs(
    xs: Sequence[Trajectory], kind: str, weights: tuple[float, float], counts: Counts
) -> list[PreferencePair]:
    """Every unordered pair of distinct members of xs that makes a pair."""
    made = (make_pair(x, y, kind, weights, counts) for x, y in itertools.combinations(xs, 2))
    return [p for p in made if p is not None]


def pair_sort_key(pair: PreferencePair) -> tuple[str, str, str, str]:
    return (pair.task_id, pair.kind, pair.chosen.traj_id, pair.rejected.traj_id)


def check_threshold(hard_negative_threshold: float) -> None:
    if not 0.0 <= hard_negative_threshold <= 1.0:
        raise ValueError(f"hard_negative_threshold {hard_negative_threshold!r} is outside [0, 1]")


def finalize(
    name: str,
    pairs_per_task: dict[str, list[PreferencePair]],
    counts: Counts,
    *,
    max_pairs_per_task: int | None,
    seed: int,
    hard_negative_threshold: float,
) -> PreferenceDataset:
    """Canonical order, the per-task cap, hard-negative marks and the report.

    The cap keeps a seeded subset per task, salted by a checksum of the task id, so one task's subset does
    not depend on which other tasks are present.
    """
    result, dropped = [], 0
    for task_id in sorted(pairs_per_task):
        pairs = sorted(pairs_per_task[task_id], key=pair_sort_key)
        if max_pairs_per_task is not None and len(pairs) > max_pairs_per_task:
            rng = np.random.default_rng([seed, zlib.crc32(task_id.encode())])
            keep = np.sort(rng.choice(len(pairs), size=max_pairs_per_task, replace=False))
            dropped += len(pairs) - max_pairs_per_task
            pairs = [pairs[i] for i in keep]
        result.extend(replace(p, hard_negative=p.rejected.reward >= hard_negative_threshold) for p in pairs)
    report = dataset_report(
        name,
        result,
        hard_negative_threshold=hard_negative_threshold,
        duplicates_removed=counts.duplicates_removed,
        ties_skipped=counts.ties_skipped,
        identical_skipped=counts.identical_skipped,
        dropped_by_cap=dropped,
    )
    return PreferenceDataset(tuple(result), report)
