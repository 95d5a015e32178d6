"""Exploration and evaluation episodes of a policy, and the summaries the reports are built from.

Exploration samples (`rollout.temperature`) on the train tasks; evaluation is greedy on a test split. Both
stream to a JSONL file in the workdir, so a killed run resumes mid-rollout without replaying finished
episodes. Trajectories that ended in an environment error or at the context limit are kept in the file
but left out of pair building (`usable`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment
from coevo_jax.experiment.policy import PolicySetup
from coevo_jax.rollout import RolloutConfig, run_rollouts

UNUSABLE_REASONS = ("env_error", "context_limit")


def stage_seed(seed: int, name: str) -> int:
    """A sampling seed that depends only on the run seed and the stage name (stable across resumes)."""
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def is_usable(trajectory: Trajectory) -> bool:
    """False for episodes cut short by the environment failing or by the context limit."""
    reason = str(trajectory.extra.get("terminate_reason", ""))
    return not reason.startswith(UNUSABLE_REASONS)


def usable(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    return [t for t in trajectories if is_usable(t)]


def summarize(trajectories: Sequence[Trajectory], success_threshold: float = 1.0) -> dict:
    """Episodes, average reward, success rate, the failures' count and average reward, and the mean of each
    of the environment's episode metrics (`metrics`, present when the episodes have any)."""
    rewards = [t.reward for t in trajectories]
    failures = [r for r in rewards if r < success_threshold]
    reasons: dict[str, int] = {}
    for t in trajectories:
        reason = str(t.extra.get("terminate_reason", "")).split(":")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    n = max(len(rewards), 1)
    measured: dict[str, list[float]] = {}
    for t in trajectories:
        for key, value in t.extra.get("metrics", {}).items():
            measured.setdefault(key, []).append(float(value))
    return {
        "episodes": len(rewards),
        "avg_reward": sum(rewards) / n,
        "success_rate": (len(rewards) - len(failures)) / n,
        "failures": len(failures),
        "failure_avg_reward": sum(failures) / len(failures) if failures else None,
        "unusable": sum(not is_usable(t) for t in trajectories),
        "terminations": reasons,
        **({"metrics": {k: sum(v) / len(v) for k, v in measured.items()}} if measured else {}),
    }


def play(
    setup: PolicySetup,
    params: dict,
    env_factory: Callable[[], Environment],
    task_ids: Sequence[str],
    path: str,
    *,
    greedy: bool,
    samples_per_task: int,
    seed: int,
    agent: str,
    iteration: int | None,
    temperature: float | None = None,
) -> list[Trajectory]:
    """Episodes of `params` on `task_ids` streamed to `path` (resumed if it exists); all of them returned.

    `temperature` (GRPO) samples softmax(logits / temperature) without top-p, instead of `rollout`'s."""
    spec = setup.cfg.rollout
    actor = setup.actor(params, greedy=greedy, seed=seed, temperature=temperature)
    trajectories, _ = run_rollouts(
        env_factory,
        actor,
        list(task_ids),
        path,
        RolloutConfig(
            agent=agent,
            iteration=iteration,
            samples_per_task=samples_per_task,
            env_workers=spec.env_workers,
            show_progress=setup.cfg.show_progress,
        ),
    )
    return trajectories
