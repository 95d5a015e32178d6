"""Preference datasets of the paper (section 4) and its baselines, one pure function per equation.

Conventions shared by every builder:
* pairs are only formed within one instruction u (same `task_id`), and a pair always prefers the higher
  reward: r(u, e_chosen) > r(u, e_rejected) strictly; equal rewards never make a pair;
* a trajectory is a failure iff its reward is below `success_threshold` (1.0 in the paper: r < 1);
* output order is canonical (task id, then kind, then chosen id, then rejected id), independent of the
  input order; `max_pairs_per_task` keeps a seeded random subset per task, and the same seed always keeps
  the same subset.

Functions:
* `build_failure_pairs` (eq. 6): D_fail, for the failure agent. Every (e_tgt, e_fail) in F_tgt x F_fail with
  different rewards, the higher-reward one chosen. Weights (lambda_DPO, lambda_SFT) = (1, 0): plain DPO (eq. 7).
* `build_target_pairs` (eq. 8): D_tgt, for the target agent: (e_exp, e_tgt) and (e_exp, e_fail) with weights
  (0.5, 0.5), plus F_tgt x F_fail with weights (1.0, 0.0) (eq. 9). An expert pair needs the expert to
  score strictly higher, so with perfect experts e_tgt / e_fail range over failures only.
* `build_eto_pairs`: the ETO baseline, expert vs the policy's own failures, weights (1, 0) by default.
* `select_rft`: the RFT baseline's SFT set: the experts plus the policy's successes (exact duplicates dropped).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from coevo_jax.data.records import Trajectory

EXPERT_VS_TARGET = "expert_vs_target"
EXPERT_VS_FAILURE = "expert_vs_failure"
FAILURE_VS_FAILURE = "failure_vs_failure"
EXPERT_PAIR_WEIGHTS = (0.5, 0.5)  # (lambda_DPO, lambda_SFT), paper section 4.3
FAILURE_PAIR_WEIGHTS = (1.0, 0.0)


@dataclass(frozen=True)
class PreferencePair:
    task_id: str
    chosen: Trajectory
    rejected: Trajectory
    kind: str
    lambda_dpo: float
    lambda_sft: float

    @property
    def pair_id(self) -> str:
        return f"{self.kind}:{self.chosen.traj_id}>{self.rejected.traj_id}"


def is_failure(trajectory: Trajectory, success_threshold: float = 1.0) -> bool:
    return trajectory.reward < success_threshold


def group_by_task(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.task_id].append(trajectory)
    return {task: sorted(group, key=lambda t: t.traj_id) for task, group in groups.items()}


def _ordered_pair(a: Trajectory, b: Trajectory) -> tuple[Trajectory, Trajectory] | None:
    """(chosen, rejected) by reward, or None when the rewards tie."""
    if a.reward == b.reward:
        return None
    return (a, b) if a.reward > b.reward else (b, a)


def _check_same_prompt(chosen: Trajectory, rejected: Trajectory) -> None:
    if chosen.prompt != rejected.prompt:
        raise ValueError(
            f"task {chosen.task_id}: {chosen.traj_id} and {rejected.traj_id} have different instruction prompts"
        )


def _make_pair(
    chosen: Trajectory, rejected: Trajectory, kind: str, weights: tuple[float, float]
) -> PreferencePair:
    _check_same_prompt(chosen, rejected)
    return PreferencePair(chosen.task_id, chosen, rejected, kind, weights[0], weights[1])


def _failure_cross_pairs(
    target_failures: Sequence[Trajectory], agent_failures: Sequence[Trajectory], weights: tuple[float, float]
) -> list[PreferencePair]:
    pairs = []
    for e_tgt in target_failures:
        for e_fail in agent_failures:
            ordered = _ordered_pair(e_tgt, e_fail)
            if ordered is not None:
                pairs.append(_make_pair(*ordered, FAILURE_VS_FAILURE, weights))
    return pairs


def _expert_pairs(
    experts: Sequence[Trajectory], predictions: Sequence[Trajectory], kind: str, weights: tuple[float, float]
) -> list[PreferencePair]:
    return [
        _make_pair(e_exp, e_pred, kind, weights)
        for e_exp in experts
        for e_pred in predictions
        if e_exp.reward > e_pred.reward
    ]


def _pair_sort_key(pair: PreferencePair) -> tuple[str, str, str, str]:
    return (pair.task_id, pair.kind, pair.chosen.traj_id, pair.rejected.traj_id)


def _finalize(
    pairs_per_task: dict[str, list[PreferencePair]], max_pairs_per_task: int | None, seed: int
) -> list[PreferencePair]:
    """Canonical order; with a cap, a seeded subset per task (salted by a checksum of the task id, so one
    task's subset does not depend on which other tasks are present)."""
    result = []
    for task_id in sorted(pairs_per_task):
        pairs = sorted(pairs_per_task[task_id], key=_pair_sort_key)
        if max_pairs_per_task is not None and len(pairs) > max_pairs_per_task:
            rng = np.random.default_rng([seed, zlib.crc32(task_id.encode())])
            keep = np.sort(rng.choice(len(pairs), size=max_pairs_per_task, replace=False))
            pairs = [pairs[i] for i in keep]
        result.extend(pairs)
    return result


def build_failure_pairs(
    target_trajectories: Iterable[Trajectory],
    failure_agent_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> list[PreferencePair]:
    """Eq. 6: D_fail = {(u, e_c, e_r) | (e_c, e_r) from F_tgt x F_fail, r(u, e_c) > r(u, e_r)}."""
    target = group_by_task(t for t in target_trajectories if is_failure(t, success_threshold))
    agent = group_by_task(t for t in failure_agent_trajectories if is_failure(t, success_threshold))
    per_task = {
        task: _failure_cross_pairs(target[task], agent[task], FAILURE_PAIR_WEIGHTS)
        for task in target.keys() & agent.keys()
    }
    return _finalize(per_task, max_pairs_per_task, seed)


def build_target_pairs(
    expert_trajectories: Iterable[Trajectory],
    target_trajectories: Iterable[Trajectory],
    failure_agent_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> list[PreferencePair]:
    """Eq. 8: D_tgt = {(e_exp, e_tgt), (e_exp, e_fail)} u (F_tgt x F_fail), weighted for eq. 9."""
    experts = group_by_task(expert_trajectories)
    target = group_by_task(target_trajectories)
    agent = group_by_task(failure_agent_trajectories)
    per_task: dict[str, list[PreferencePair]] = {}
    for task in experts.keys() | target.keys() | agent.keys():
        task_experts, task_target, task_agent = (
            experts.get(task, []),
            target.get(task, []),
            agent.get(task, []),
        )
        per_task[task] = [
            *_expert_pairs(task_experts, task_target, EXPERT_VS_TARGET, EXPERT_PAIR_WEIGHTS),
            *_expert_pairs(task_experts, task_agent, EXPERT_VS_FAILURE, EXPERT_PAIR_WEIGHTS),
            *_failure_cross_pairs(
                [t for t in task_target if is_failure(t, success_threshold)],
                [t for t in task_agent if is_failure(t, success_threshold)],
                FAILURE_PAIR_WEIGHTS,
            ),
        ]
    return _finalize(per_task, max_pairs_per_task, seed)


def build_eto_pairs(
    expert_trajectories: Iterable[Trajectory],
    policy_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
    weights: tuple[float, float] = (1.0, 0.0),
    max_pairs_per_task: int | None = None,
    seed: int = 0,
) -> list[PreferencePair]:
    """ETO baseline: (e_exp, e_pred) for the policy's failures e_pred that the expert outscores."""
    experts = group_by_task(expert_trajectories)
    failures = group_by_task(t for t in policy_trajectories if is_failure(t, success_threshold))
    per_task = {
        task: _expert_pairs(experts[task], failures[task], EXPERT_VS_TARGET, weights)
        for task in experts.keys() & failures.keys()
    }
    return _finalize(per_task, max_pairs_per_task, seed)


def select_rft(
    expert_trajectories: Iterable[Trajectory],
    policy_trajectories: Iterable[Trajectory],
    *,
    success_threshold: float = 1.0,
) -> list[Trajectory]:
    """RFT baseline: experts plus the policy's successes (r >= threshold), sorted by (task_id, traj_id).

    A success whose messages equal an already kept trajectory of the same task is dropped as a duplicate.
    """
    experts = sorted(expert_trajectories, key=lambda t: (t.task_id, t.traj_id))
    successes = sorted(
        (t for t in policy_trajectories if not is_failure(t, success_threshold)),
        key=lambda t: (t.task_id, t.traj_id),
    )
    seen = {(t.task_id, t.messages) for t in experts}
    kept = list(experts)
    for trajectory in successes:
        if (trajectory.task_id, trajectory.messages) not in seen:
            seen.add((trajectory.task_id, trajectory.messages))
            kept.append(trajectory)
    return sorted(kept, key=lambda t: (t.task_id, t.traj_id))
