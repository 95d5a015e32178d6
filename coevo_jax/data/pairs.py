"""Preference datasets of the paper (section 4) and its baselines, one pure function per equation.

Conventions shared by every builder:
* identical trajectories (same task id and same messages) are removed from each input pool first, keeping
  the smallest trajectory id; the report counts how many per pool;
* pairs are only formed within one instruction u (same `task_id`), and a pair always prefers the higher
  reward: r(u, e_chosen) > r(u, e_rejected) strictly; equal rewards never make a pair (counted as ties),
  nor do two trajectories with the same messages from different pools (counted as identical);
* a trajectory is a failure iff its reward is below `success_threshold` (1.0 in the paper: r < 1);
* a pair is a *hard negative* when its rejected side is a near-success: r(u, e_rejected) >=
  `hard_negative_threshold` (0.6 by default, as in the paper; its "super-hard" open question uses 0.7);
* output order is canonical (task id, then kind, then chosen id, then rejected id), independent of the
  input order; `max_pairs_per_task` keeps a seeded random subset per task, the same seed the same subset.

Every builder returns a `PreferenceDataset`: a sequence of `PreferencePair`s plus its `DatasetReport`.

Builders: `build_failure_pairs` (eq. 6), `build_target_pairs` (eq. 8), `build_expert_failure_pairs` (the
authors' latest D_tgt), and the baselines and controls `build_eto_pairs`, `build_best_of_n_pairs`,
`build_positive_agent_pairs`, `select_rft` (RFT's SFT set).
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
class _Counts:
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


def _pool(name: str, trajectories: Iterable[Trajectory], counts: _Counts) -> dict[str, list[Trajectory]]:
    """Deduplicated and grouped by task; the removed duplicates are counted under `name`."""
    kept, removed = deduplicate(trajectories)
    counts.duplicates_removed[name] = counts.duplicates_removed.get(name, 0) + removed
    return group_by_task(kept)


def _failures(groups: dict[str, list[Trajectory]], success_threshold: float) -> dict[str, list[Trajectory]]:
    return {task: [t for t in group if is_failure(t, success_threshold)] for task, group in groups.items()}


def _make_pair(
    a: Trajectory, b: Trajectory, kind: str, weights: tuple[float, float], counts: _Counts
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


def _cross_pairs(
    xs: Sequence[Trajectory],
    ys: Sequence[Trajectory],
    kind: str,
    weights: tuple[float, float],
    counts: _Counts,
) -> list[PreferencePair]:
    """Every (x, y) in xs x ys that makes a pair."""
    made = (_make_pair(x, y, kind, weights, counts) for x in xs for y in ys)
    return [p for p in made if p is not None]


def _within_pairs(
    xs: Sequence[Trajectory], kind: str, weights: tuple[float, float], counts: _Counts
) -> list[PreferencePair]:
    """Every unordered pair of distinct members of xs that makes a pair."""
    made = (_make_pair(x, y, kind, weights, counts) for x, y in itertools.combinations(xs, 2))
    return [p for p in made if p is not None]


def _pair_sort_key(pair: PreferencePair) -> tuple[str, str, str, str]:
    return (pair.task_id, pair.kind, pair.chosen.traj_id, pair.rejected.traj_id)


def _check_threshold(hard_negative_threshold: float) -> None:
    if not 0.0 <= hard_negative_threshold <= 1.0:
        raise ValueError(f"hard_negative_threshold {hard_negative_threshold!r} is outside [0, 1]")


def _finalize(
    name: str,
    pairs_per_task: dict[str, list[PreferencePair]],
    counts: _Counts,
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
        pairs = sorted(pairs_per_task[task_id], key=_pair_sort_key)
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


def build_failure_pairs(
    target_trajectories: Iterable[Trajectory],
    failure_agent_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
    include_within_agent: bool = False,
    hard_negative_threshold: float = DEFAULT_HARD_NEGATIVE_THRESHOLD,
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> PreferenceDataset:
    """Eq. 6: D_fail = {(u, e_c, e_r) | (e_c, e_r) from F_tgt x F_fail, r(u, e_c) > r(u, e_r)}, weights (1, 0).

    `include_within_agent` also pairs failures within F_tgt and within F_fail (not in eq. 6; an option).
    """
    _check_threshold(hard_negative_threshold)
    counts = _Counts()
    target = _failures(_pool("target", target_trajectories, counts), success_threshold)
    agent = _failures(_pool("failure", failure_agent_trajectories, counts), success_threshold)
    per_task = {}
    for task in target.keys() | agent.keys():
        task_target, task_agent = target.get(task, []), agent.get(task, [])
        per_task[task] = _cross_pairs(
            task_target, task_agent, FAILURE_VS_FAILURE, FAILURE_PAIR_WEIGHTS, counts
        )
        if include_within_agent:
            per_task[task] += _within_pairs(task_target, TARGET_VS_TARGET, FAILURE_PAIR_WEIGHTS, counts)
            per_task[task] += _within_pairs(
                task_agent, FAILURE_AGENT_VS_FAILURE_AGENT, FAILURE_PAIR_WEIGHTS, counts
            )
    return _finalize(
        "D_fail",
        per_task,
        counts,
        max_pairs_per_task=max_pairs_per_task,
        seed=seed,
        hard_negative_threshold=hard_negative_threshold,
    )


def build_target_pairs(
    expert_trajectories: Iterable[Trajectory],
    target_trajectories: Iterable[Trajectory],
    failure_agent_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
    hard_negative_threshold: float = DEFAULT_HARD_NEGATIVE_THRESHOLD,
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> PreferenceDataset:
    """Eq. 8: D_tgt = {(e_exp, e_tgt), (e_exp, e_fail)} u (F_tgt x F_fail), weighted for eq. 9.

    The expert pairs, over all predictions, weigh (0.5, 0.5); the F_tgt x F_fail pairs (1.0, 0.0). With perfect
    experts (r = 1) the expert is always the chosen side and successful predictions tie (no pair)."""
    _check_threshold(hard_negative_threshold)
    counts = _Counts()
    experts = _pool("expert", expert_trajectories, counts)
    target = _pool("target", target_trajectories, counts)
    agent = _pool("failure", failure_agent_trajectories, counts)
    target_failures, agent_failures = (
        _failures(target, success_threshold),
        _failures(agent, success_threshold),
    )
    per_task = {}
    for task in experts.keys() | target.keys() | agent.keys():
        task_experts = experts.get(task, [])
        per_task[task] = [
            *_cross_pairs(task_experts, target.get(task, []), EXPERT_VS_TARGET, EXPERT_PAIR_WEIGHTS, counts),
            *_cross_pairs(task_experts, agent.get(task, []), EXPERT_VS_FAILURE, EXPERT_PAIR_WEIGHTS, counts),
            *_cross_pairs(
                target_failures.get(task, []),
                agent_failures.get(task, []),
                FAILURE_VS_FAILURE,
                FAILURE_PAIR_WEIGHTS,
                counts,
            ),
        ]
    return _finalize(
        "D_tgt",
        per_task,
        counts,
        max_pairs_per_task=max_pairs_per_task,
        seed=seed,
        hard_negative_threshold=hard_negative_threshold,
    )


def build_expert_failure_pairs(
    expert_trajectories: Iterable[Trajectory],
    target_trajectories: Iterable[Trajectory],
    failure_agent_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
    hard_negative_threshold: float = DEFAULT_HARD_NEGATIVE_THRESHOLD,
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> PreferenceDataset:
    """The authors' latest D_tgt: (e_exp, e) for each failure e in F_tgt and in F_fail, weights (0.5, 0.5).

    Eq. 8 without its F_tgt x F_fail part: the target learns from both agents' failures only against the
    expert, each trained by eq. 9 with the expert-pair weights. Successful predictions make no pair.
    """
    _check_threshold(hard_negative_threshold)
    counts = _Counts()
    experts = _pool("expert", expert_trajectories, counts)
    target = _failures(_pool("target", target_trajectories, counts), success_threshold)
    agent = _failures(_pool("failure", failure_agent_trajectories, counts), success_threshold)
    per_task = {
        task: [
            *_cross_pairs(experts[task], target.get(task, []), EXPERT_VS_TARGET, EXPERT_PAIR_WEIGHTS, counts),
            *_cross_pairs(experts[task], agent.get(task, []), EXPERT_VS_FAILURE, EXPERT_PAIR_WEIGHTS, counts),
        ]
        for task in experts.keys() & (target.keys() | agent.keys())
    }
    return _finalize(
        "D_tgt_expert_failure",
        per_task,
        counts,
        max_pairs_per_task=max_pairs_per_task,
        seed=seed,
        hard_negative_threshold=hard_negative_threshold,
    )


def _expert_vs_predictions(
    name: str,
    kind: str,
    expert_trajectories: Iterable[Trajectory],
    predictions: Iterable[Trajectory],
    *,
    weights: tuple[float, float],
    hard_negative_threshold: float,
    max_pairs_per_task: int | None,
    seed: int,
) -> PreferenceDataset:
    _check_threshold(hard_negative_threshold)
    counts = _Counts()
    experts = _pool("expert", expert_trajectories, counts)
    predicted = _pool("predicted", predictions, counts)
    per_task = {
        task: _cross_pairs(experts[task], predicted[task], kind, weights, counts)
        for task in experts.keys() & predicted.keys()
    }
    return _finalize(
        name,
        per_task,
        counts,
        max_pairs_per_task=max_pairs_per_task,
        seed=seed,
        hard_negative_threshold=hard_negative_threshold,
    )


def build_eto_pairs(
    expert_trajectories: Iterable[Trajectory],
    policy_trajectories: Iterable[Trajectory],
    *,
    weights: tuple[float, float] = ETO_PAIR_WEIGHTS,
    hard_negative_threshold: float = DEFAULT_HARD_NEGATIVE_THRESHOLD,
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> PreferenceDataset:
    """ETO baseline: the expert vs each prediction of the same task; higher reward chosen, ties skipped."""
    return _expert_vs_predictions(
        "ETO",
        EXPERT_VS_TARGET,
        expert_trajectories,
        policy_trajectories,
        weights=weights,
        hard_negative_threshold=hard_negative_threshold,
        max_pairs_per_task=max_pairs_per_task,
        seed=seed,
    )


def build_best_of_n_pairs(
    expert_trajectories: Iterable[Trajectory],
    policy_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
    weights: tuple[float, float] = ETO_PAIR_WEIGHTS,
    hard_negative_threshold: float = DEFAULT_HARD_NEGATIVE_THRESHOLD,
    seed: int = 0,
) -> PreferenceDataset:
    """Best-of-N control: per task, the expert vs the highest-reward failure among the policy's episodes.

    The policy's N episodes of a task (after deduplication) are ranked by environment reward and the best
    one that still failed (r < `success_threshold`) is the rejected side, ties broken by the smallest
    trajectory id; a task whose episodes all succeeded makes no pair. One pair per expert of a task: no cap.
    """
    _check_threshold(hard_negative_threshold)
    counts = _Counts()
    experts = _pool("expert", expert_trajectories, counts)
    failures = _failures(_pool("predicted", policy_trajectories, counts), success_threshold)
    per_task = {}
    for task in experts.keys() & failures.keys():
        if failures[task]:
            best = min(failures[task], key=lambda t: (-t.reward, t.traj_id))
            per_task[task] = _cross_pairs(experts[task], [best], EXPERT_VS_TARGET, weights, counts)
    return _finalize(
        "best_of_n",
        per_task,
        counts,
        max_pairs_per_task=None,
        seed=seed,
        hard_negative_threshold=hard_negative_threshold,
    )


def build_positive_agent_pairs(
    expert_trajectories: Iterable[Trajectory],
    positive_agent_trajectories: Iterable[Trajectory],
    *,
    weights: tuple[float, float] = ETO_PAIR_WEIGHTS,
    hard_negative_threshold: float = DEFAULT_HARD_NEGATIVE_THRESHOLD,
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> PreferenceDataset:
    """Ablation: the second agent learns as ETO does, expert vs its own predictions (kind expert_vs_positive)."""
    return _expert_vs_predictions(
        "positive_agent",
        EXPERT_VS_POSITIVE,
        expert_trajectories,
        positive_agent_trajectories,
        weights=weights,
        hard_negative_threshold=hard_negative_threshold,
        max_pairs_per_task=max_pairs_per_task,
        seed=seed,
    )


def select_rft(
    expert_trajectories: Iterable[Trajectory],
    policy_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
) -> list[Trajectory]:
    """RFT baseline: experts plus the policy's successes (r >= threshold), sorted by (task_id, traj_id).

    A trajectory whose messages equal an already kept trajectory of the same task is dropped as a duplicate
    (experts are kept first).
    """
    experts, _ = deduplicate(expert_trajectories)
    successes, _ = deduplicate(t for t in policy_trajectories if not is_failure(t, success_threshold))
    seen = {(t.task_id, t.messages) for t in experts}
    kept = experts + [t for t in successes if (t.task_id, t.messages) not in seen]
    return sorted(kept, key=lambda t: (t.task_id, t.traj_id))
