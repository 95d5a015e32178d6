"""Fake rollout histories for the CoEvolve tests: an environment's own expert trajectories replayed as the
rollouts of three training steps, with failures put in where a signal should fire."""

import dataclasses

from coevo_jax.data.records import Trajectory


def failed(trajectory: Trajectory, reward: float = 0.0, suffix: str = "fail") -> Trajectory:
    """The trajectory cut to its first half of actions, with a failing reward."""
    actions = max(1, len(trajectory.actions) // 2)
    messages = trajectory.messages[: trajectory.prompt_len + 2 * actions - 1]
    return dataclasses.replace(
        trajectory, traj_id=f"{trajectory.traj_id}_{suffix}", messages=messages, reward=reward
    )


def at_step(trajectory: Trajectory, step: int, suffix: str = "") -> Trajectory:
    return dataclasses.replace(
        trajectory, traj_id=f"{trajectory.traj_id}_s{step}{suffix}", iteration=step, agent="target"
    )


def fake_history(experts: list[Trajectory]) -> list[Trajectory]:
    """Step 0: every expert succeeds. Step 1: every third task fails (forgetting). Step 2: every fourth task
    has two rollouts, one success and one failure (boundary); the rest succeed."""
    records = [at_step(t, 0) for t in experts]
    records += [at_step(failed(t) if i % 3 == 0 else t, 1) for i, t in enumerate(experts)]
    for i, t in enumerate(experts):
        records.append(at_step(t, 2, "a"))
        if i % 4 == 0:
            records.append(at_step(failed(t), 2, "b"))
    return records
