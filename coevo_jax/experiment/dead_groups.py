"""GRPO's dead groups as hard negatives (`grpo.dead_groups = "pairs"`).

A group is dead when a task's K usable episodes all failed with the same reward: GRPO's advantages are all 0
and it learns nothing from them. Their failures are not worthless, though (the co-evolving agents paper's
point): ranked by the graded score the environment reports (`envs.base.GRADED_SCORE`: BFCL's turn accuracy,
the built-in environment's sub-goal progress; the reward where an environment has none, which ranks nothing),
the better failure is preferred to the worse, as eq. 6's failure-failure pairs with eq. 9's weights
(lambda_DPO 1, lambda_SFT 0). `dead_group_pairs` builds them (at most `max_pairs` a group, the largest score
margins first); `train_pairs` trains them in the same GRPO step, after its policy-gradient updates, with
the eq. 9 step and the GRPO optimizer, against the step's reference: the KL reference (the SFT policy), or,
where GRPO has none (`beta` 0), the policy as the step sampled it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Sequence

import jax
import numpy as np

from coevo_jax.data.batching import collate_dpo, plan_batches, tokenize_pairs
from coevo_jax.data.pair_pool import DEFAULT_HARD_NEGATIVE_THRESHOLD, FAILURE_PAIR_WEIGHTS, PreferencePair
from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import GRADED_SCORE
from coevo_jax.experiment import processes
from coevo_jax.train import StepKind

DEAD_GROUP_VS_DEAD_GROUP = "dead_group"  # the pair kind: two failures of one dead GRPO group


def graded_score(trajectory: Trajectory) -> float:
    """The environment's graded score of the episode (`GRADED_SCORE` in its metrics), else its reward."""
    return float(trajectory.extra.get("metrics", {}).get(GRADED_SCORE, trajectory.reward))


@dataclasses.dataclass(frozen=True)
class DeadGroupPairs:
    """One step's dead groups and the pairs made from them, with each pair's graded-score margin."""

    pairs: tuple[PreferencePair, ...]
    margins: tuple[float, ...]
    dead_groups: int

    def stats(self) -> dict[str, float]:
        margins = np.asarray(self.margins, np.float64)
        return {
            "dead_groups": self.dead_groups,
            "dead_group_pairs": len(self.pairs),
            "dead_pair_margin_mean": float(margins.mean()) if len(margins) else 0.0,
            "dead_pair_margin_min": float(margins.min()) if len(margins) else 0.0,
            "dead_pair_hard_negatives": sum(p.hard_negative for p in self.pairs),
        }


def dead_group_pairs(
    groups: Sequence[Sequence[Trajectory]], *, max_pairs: int, success_threshold: float = 1.0
) -> DeadGroupPairs:
    """Pairs of each dead group of `groups` (a task's usable episodes each): every two members whose graded
    scores differ, the higher chosen, at most `max_pairs` a group by largest margin (then by episode ids).
    A rejected side whose reward is at least the paper's threshold (0.6) is a hard negative."""
    pairs, margins, dead = [], [], 0
    for members in groups:
        rewards = {t.reward for t in members}
        if len(members) < 2 or len(rewards) != 1 or rewards.pop() >= success_threshold:
            continue
        dead += 1
        ranked = []
        for x, y in itertools.combinations(members, 2):
            (low, high) = sorted((x, y), key=graded_score)
            margin = graded_score(high) - graded_score(low)
            if margin > 0:
                ranked.append((-margin, high.traj_id, low.traj_id, high, low))
        for negative_margin, _, _, chosen, rejected in sorted(ranked)[:max_pairs]:
            pairs.append(
                PreferencePair(
                    chosen.task_id,
                    chosen,
                    rejected,
                    DEAD_GROUP_VS_DEAD_GROUP,
                    *FAILURE_PAIR_WEIGHTS,
                    hard_negative=rejected.reward >= DEFAULT_HARD_NEGATIVE_THRESHOLD,
                )
            )
            margins.append(-negative_margin)
    return DeadGroupPairs(tuple(pairs), tuple(margins), dead)


def task_groups(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """The episodes by task, in order of first appearance."""
    groups: dict[str, list[Trajectory]] = collections.defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.task_id].append(trajectory)
    return list(groups.values())


def train_pairs(setup, steps, state, frozen, reference, pairs, scalars, *, buckets, place, seed: int):
    """Eq. 9 updates (`StepKind.COEVO`) on `pairs`: one pass, `dpo.pairs_per_batch` pairs an update in
    `buckets`, with the step's optimizer state; `reference` (whole-policy params) gives the reference
    log-probs, `place` puts a host batch on the mesh. Returns (state, host metrics of the last update or None,
    updates)."""
    cfg = setup.cfg
    tokenized, _ = tokenize_pairs(pairs, setup.tokenizer, setup.chat_format, max_length=cfg.max_length)
    if not tokenized:
        return state, None, 0
    per_batch, pad = cfg.dpo.pairs_per_batch, setup.tokenizer.pad_token_id
    step_fn, last, updates = steps.step(StepKind.COEVO), None, 0
    for length, idx in plan_batches([len(p) for p in tokenized], per_batch, buckets, seed=seed):
        batch = collate_dpo([tokenized[i] for i in idx], length=length, pairs_per_batch=per_batch, pad_id=pad)
        placed = place({k: v for k, v in batch.items() if k in steps.reference.keys})
        chosen, rejected = processes.to_host(steps.reference(reference, placed))
        batch["ref_chosen_logps"] = np.asarray(chosen, np.float32).reshape(per_batch)
        batch["ref_rejected_logps"] = np.asarray(rejected, np.float32).reshape(per_batch)
        state, last = step_fn(state, place(batch), scalars, frozen)
        updates += 1
    host = {k: float(v) for k, v in jax.device_get(last).items() if np.ndim(v) == 0}
    return state, host, updates
