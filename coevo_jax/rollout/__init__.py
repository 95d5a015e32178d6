"""Rollouts: actors that produce replies, and the host loop that drives environments."""

from coevo_jax.rollout.actors import ModelActor, PendingReplies, ScriptedActor, TurnRequest
from coevo_jax.rollout.loop import RolloutConfig, RolloutStats, run_rollouts, trajectory_id
from coevo_jax.rollout.turns import TurnCodec

__all__ = [
    "ModelActor",
    "PendingReplies",
    "RolloutConfig",
    "RolloutStats",
    "ScriptedActor",
    "TurnCodec",
    "TurnRequest",
    "run_rollouts",
    "trajectory_id",
]
