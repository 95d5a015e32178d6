"""GiGPO's step-level credit (arXiv 2505.10978) for the GRPO step (`grpo.advantage = "gigpo"`).

Besides the episode-level group advantage, the replies of a task's K episodes written from the same
environment state (the rollout loop's `extra["step_states"]`, `Environment.state_key`) form step-level groups;
each reply's value is the discounted return of the score's rises from it on (`extra["step_scores"]`), and its
step advantage that value normalised within its group. The pure functions are `losses.discounted_returns`
and `losses.step_group_advantages`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coevo_jax import losses
from coevo_jax.data.records import Trajectory
from coevo_jax.experiment.config import GRPOConfig


def _padded(n: int) -> int:
    """`n` rounded up to a power of two, so that the step functions compile for few shapes."""
    return 1 << max(n - 1, 0).bit_length()


def step_advantages(episodes: Sequence[Trajectory], cfg: GRPOConfig) -> list[np.ndarray]:
    """GiGPO's step-level advantage of each reply of each episode (one array per episode, one value a reply).

    A reply's value is the discounted return (`cfg.gamma`) of the rewards from it on (a step's reward is the
    rise of the environment's score, `extra["step_scores"]`); replies of one task's episodes written in the
    same state (`extra["step_states"]`) form a group, and each value is normalised within its group
    (`losses.step_group_advantages`, `cfg.advantage_scale`)."""
    scores = []
    for episode in episodes:
        if "step_scores" not in episode.extra or "step_states" not in episode.extra:
            raise ValueError(f"{episode.traj_id}: no per-step scores and states (rolled out by older code)")
        scores.append(np.asarray(episode.extra["step_scores"], np.float32))
    rows, width = _padded(len(episodes)), _padded(max(len(s) for s in scores))
    rewards, mask = np.zeros((rows, width), np.float32), np.zeros((rows, width), bool)
    for row, row_scores in enumerate(scores):
        rewards[row, : len(row_scores)] = np.diff(row_scores, prepend=np.float32(0.0))
        mask[row, : len(row_scores)] = True
    returns = np.asarray(losses.discounted_returns(rewards, mask, cfg.gamma))
    groups: dict[tuple[str, str], int] = {}
    ids = [
        groups.setdefault((episode.task_id, state), len(groups))
        for episode in episodes
        for state in episode.extra["step_states"]
    ]
    size = _padded(len(ids))
    values = np.zeros(size, np.float32)
    values[: len(ids)] = returns[mask]
    group_ids = np.arange(size, dtype=np.int32)  # the padding: groups of one, advantage 0
    group_ids[: len(ids)] = ids
    advantages = np.asarray(losses.step_group_advantages(values, group_ids, scale=cfg.advantage_scale))
    bounds = np.cumsum([0] + [len(s) for s in scores])
    return [advantages[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
