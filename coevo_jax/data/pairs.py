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

from collections.abc import Iterable

from coevo_jax.data.pair_pool import (
    DEFAULT_HARD_NEGATIVE_THRESHOLD,
    ETO_PAIR_WEIGHTS,
    EXPERT_PAIR_WEIGHTS,
    EXPERT_VS_FAILURE,
    EXPERT_VS_POSITIVE,
    EXPERT_VS_TARGET,
    FAILURE_AGENT_VS_FAILURE_AGENT,
    FAILURE_PAIR_WEIGHTS,
    FAILURE_VS_FAILURE,
    TARGET_VS_TARGET,
    Counts,
    PreferenceDataset,
    check_threshold,
    cross_pairs,
    deduplicate,
    failures_by_task,
    finalize,
    is_failure,
    task_pool,
    within_pairs,
)
from coevo_jax.data.records import Trajectory


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
    check_threshold(hard_negative_threshold)
    counts = Counts()
    target = failures_by_task(task_pool("target", target_trajectories, counts), success_threshold)
    agent = failures_by_task(task_pool("failure", failure_agent_trajectories, counts), success_threshold)
    per_task = {}
    for task in target.keys() | agent.keys():
        task_target, task_agent = target.get(task, []), agent.get(task, [])
        per_task[task] = cross_pairs(
            task_target, task_agent, FAILURE_VS_FAILURE, FAILURE_PAIR_WEIGHTS, counts
        )
        if include_within_agent:
            per_task[task] += within_pairs(task_target, TARGET_VS_TARGET, FAILURE_PAIR_WEIGHTS, counts)
            per_task[task] += within_pairs(
                task_agent, FAILURE_AGENT_VS_FAILURE_AGENT, FAILURE_PAIR_WEIGHTS, counts
            )
    return finalize(
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
    check_threshold(hard_negative_threshold)
    counts = Counts()
    experts = task_pool("expert", expert_trajectories, counts)
    target = task_pool("target", target_trajectories, counts)
    agent = task_pool("failure", failure_agent_trajectories, counts)
    target_failures, agent_failures = (
        failures_by_task(target, success_threshold),
        failures_by_task(agent, success_threshold),
    )
    per_task = {}
    for task in experts.keys() | target.keys() | agent.keys():
        task_experts = experts.get(task, [])
        per_task[task] = [
            *cross_pairs(task_experts, target.get(task, []), EXPERT_VS_TARGET, EXPERT_PAIR_WEIGHTS, counts),
            *cross_pairs(task_experts, agent.get(task, []), EXPERT_VS_FAILURE, EXPERT_PAIR_WEIGHTS, counts),
            *cross_pairs(
                target_failures.get(task, []),
                agent_failures.get(task, []),
                FAILURE_VS_FAILURE,
                FAILURE_PAIR_WEIGHTS,
                counts,
            ),
        ]
    return finalize(
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
    check_threshold(hard_negative_threshold)
    counts = Counts()
    experts = task_pool("expert", expert_trajectories, counts)
    target = failures_by_task(task_pool("target", target_trajectories, counts), success_threshold)
    agent = failures_by_task(task_pool("failure", failure_agent_trajectories, counts), success_threshold)
    per_task = {
        task: [
            *cross_pairs(experts[task], target.get(task, []), EXPERT_VS_TARGET, EXPERT_PAIR_WEIGHTS, counts),
            *cross_pairs(experts[task], agent.get(task, []), EXPERT_VS_FAILURE, EXPERT_PAIR_WEIGHTS, counts),
        ]
        for task in experts.keys() & (target.keys() | agent.keys())
    }
    return finalize(
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
    check_threshold(hard_negative_threshold)
    counts = Counts()
    experts = task_pool("expert", expert_trajectories, counts)
    predicted = task_pool("predicted", predictions, counts)
    per_task = {
        task: cross_pairs(experts[task], predicted[task], kind, weights, counts)
        for task in experts.keys() & predicted.keys()
    }
    return finalize(
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
    check_threshold(hard_negative_threshold)
    counts = Counts()
    experts = task_pool("expert", expert_trajectories, counts)
    failures = failures_by_task(task_pool("predicted", policy_trajectories, counts), success_threshold)
    per_task = {}
    for task in experts.keys() & failures.keys():
        if failures[task]:
            best = min(failures[task], key=lambda t: (-t.reward, t.traj_id))
            per_task[task] = cross_pairs(experts[task], [best], EXPERT_VS_TARGET, weights, counts)
    return finalize(
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
