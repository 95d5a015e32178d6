"""Exploration and evaluation episodes of a policy, and the summaries the reports are built from.

Exploration samples (`rollout.temperature`) on the train tasks; evaluation is greedy on a test split. Both
stream to a JSONL file in the workdir, so a killed run resumes mid-rollout without replaying finished
episodes. Trajectories that ended in an environment error or at the context limit are kept in the file
but left out of pair building (`usable`).

On N processes (`experiment.processes`) the tasks are split: process r plays tasks r, r + N, r + 2N, ... of
the list with its own actor on its own devices (`PolicySetup.rollout_mesh`), streaming to its own file
(`part_path`, resumed episode by episode like the single file). Once all have finished, process 0 merges the
parts into the stage's file, in task and sample order, and every process reads that file: all of them hold
the same trajectories in the same order. An episode's replies do not depend on which process or batch
plays it (each is sampled with a key of its own episode, `rollout.actors`), so the episodes are those one
process plays, up to the last bits of float32 sums over differently composed decode batches. The split
costs a balance: a process with longer episodes keeps the others waiting at the merge, and within a
process its own slots only are filled (an even share needs tasks x samples >= N x `rollout.rows`). The
alternative, one decode batch spread over all processes, would keep every process in lockstep at every
turn (the same number of decode calls, with the same shapes) for no gain in what is computed.
"""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Callable, Sequence

from coevo_jax.atomic_files import atomic_path
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory, write_trajectories
from coevo_jax.envs.base import Environment
from coevo_jax.experiment import processes
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


def pairable(trajectories: Sequence[Trajectory], *, context_limited: bool) -> list[Trajectory]:
    """The episodes a DPO phase may pair: the usable ones, and with `context_limited` (`dpo.pair_context_limited`)
    also those cut at the context limit, whose messages end at their last complete turn and whose reward is
    the environment's score there."""
    return [t for t in trajectories if is_usable(t) or (context_limited and _ended_at_context_limit(t))]


def _ended_at_context_limit(trajectory: Trajectory) -> bool:
    return str(trajectory.extra.get("terminate_reason", "")) == "context_limit"


def summarize(trajectories: Sequence[Trajectory], success_threshold: float = 1.0) -> dict:
    """Episodes, average reward, success rate, the failures' count and average reward, replies with no
    parsable action (`invalid_format`), and the mean of each of the environment's episode metrics
    (`metrics`, present when the episodes have any)."""
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
        "invalid_format": sum(int(t.extra.get("invalid_format", 0)) for t in trajectories),
        "terminations": reasons,
        **({"metrics": {k: sum(v) / len(v) for k, v in measured.items()}} if measured else {}),
    }


def failed_by_both(
    first: Sequence[Trajectory], second: Sequence[Trajectory], success_threshold: float = 1.0
) -> int:
    """The tasks on which each of two agents' explorations failed at least once: only there can a failure of
    one be paired with a failure of the other (eq. 6)."""
    failed = [{t.task_id for t in episodes if t.reward < success_threshold} for episodes in (first, second)]
    return len(failed[0] & failed[1])


def summarize_eval(trajectories: Sequence[Trajectory]) -> dict:
    """`summarize` of an evaluation (one greedy episode per task), with each task's reward (`task_rewards`,
    in split order) so that two policies' decisions can be compared task by task."""
    return {**summarize(trajectories), "task_rewards": {t.task_id: round(t.reward, 6) for t in trajectories}}


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
    """Episodes of `params` on `task_ids` streamed to `path` (resumed if it exists); all of them returned,
    in task and sample order. On several processes each plays its share (see the module docstring).

    `temperature` (GRPO) samples softmax(logits / temperature) without top-p, instead of `rollout`'s."""
    spec = setup.cfg.rollout
    config = RolloutConfig(
        agent=agent,
        iteration=iteration,
        samples_per_task=samples_per_task,
        env_workers=spec.env_workers,
        show_progress=setup.cfg.show_progress,
    )
    actor = lambda: setup.actor(params, greedy=greedy, seed=seed, temperature=temperature)
    if processes.count() == 1:
        return run_rollouts(env_factory, actor(), list(task_ids), path, config)[0]
    wanted = [(task, sample) for task in task_ids for sample in range(samples_per_task)]
    if not _holds(path, wanted, config):  # the same answer on every process: only the merge below writes it
        count, rank = processes.count(), processes.rank()
        run_rollouts(env_factory, actor(), list(task_ids)[rank::count], part_path(path, rank, count), config)
        parts = [part_path(path, r, count) for r in range(count)]
        processes.on_primary(f"merge {path}", lambda: _merge(path, parts))
        if processes.is_primary():
            shutil.rmtree(os.path.dirname(os.path.dirname(parts[0])), ignore_errors=True)
    return _select(read_trajectories(path), wanted, config)


def part_path(path: str, rank: int, count: int) -> str:
    """Process `rank`'s own file of the rollout file `path` when `count` processes split it."""
    directory, name = os.path.split(path)
    stage = name.removesuffix(".jsonl")
    return os.path.join(f"{directory}_by_process", stage, f"{rank}of{count}", name)


def _key(trajectory: Trajectory) -> tuple[str, int]:
    return trajectory.task_id, int(trajectory.sampling.get("sample", 0))


def _select(trajectories: Sequence[Trajectory], wanted: Sequence[tuple[str, int]], cfg: RolloutConfig):
    """The episodes of `cfg`'s agent and iteration that are `wanted` (task, sample), in that order."""
    mine = {_key(t): t for t in trajectories if t.agent == cfg.agent and t.iteration == cfg.iteration}
    return [mine[key] for key in wanted if key in mine]


def _holds(path: str, wanted: Sequence[tuple[str, int]], cfg: RolloutConfig) -> bool:
    """Whether the rollout file `path` exists with every wanted episode."""
    return os.path.exists(path) and len(_select(read_trajectories(path), wanted, cfg)) == len(wanted)


def _merge(path: str, parts: Sequence[str]) -> None:
    """Writes `path` (atomically) with its own episodes, if any, and those of `parts`, each once, sorted by
    task and sample."""
    merged: dict[str, Trajectory] = {}
    for source in [path, *parts]:
        for trajectory in read_trajectories(source) if os.path.exists(source) else []:
            merged.setdefault(trajectory.traj_id, trajectory)
    write_atomic(path, sorted(merged.values(), key=_key))


def write_atomic(path: str, trajectories: Sequence[Trajectory]) -> None:
    """Writes the rollout file `path` whole or not at all (no half-written file after a crash)."""
    with atomic_path(path) as tmp:
        write_trajectories(tmp, trajectories)
