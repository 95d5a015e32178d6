"""The CoEvolve methods in the main job (`coevolve` and the ablations of `coevolve.ABLATIONS`): GRPO on a task
list that grows, one CoEvolve round every F GRPO steps.

A CoEvolve method trains exactly as `grpo` does (`experiment.grpo`: same GRPO config and number of steps,
from the SFT target policy, the same per-step seeds), through `CoEvolveLoop`, its `grpo.GrpoRun`:

* Pool: `<workdir>/<method>/coevolve_pool.json`, beside the method's GRPO state (`<workdir>/<method>/state`),
  so the ablations never share a pool; it resumes with the run.
* Schedule: round r (0-based) runs after GRPO step (r + 1) * F (F = `coevolve.every_steps`) on the usable
  episodes of steps r * F + 1 ... (r + 1) * F, each with its GRPO step as `iteration` (`round_records`).
  Rounds are numbered by the pool (`pool.num_rounds`), which saves itself at the end of a round, after that
  step's GRPO checkpoint. Once the GRPO state is restored, and after each step's checkpoint, the rounds due
  for the steps done that the pool lacks are run (`rounds_due`): a kill between the checkpoint and the pool's
  save redoes the round, a kill after the save finds it done; a round is never repeated or skipped.
* Tasks: step n draws from the environment's train tasks plus the pool's tasks of the rounds before it
  (`training_tasks`), uniformly without replacement (`grpo.step_tasks`), and every environment the rollout
  loop creates gets the pool's tasks (`with_pool_tasks`). Evaluation plays only its splits' own tasks, in
  environments without the pool's; a pool task under an evaluation task's id is an error.
* Records: each iteration's record lists the rounds that ran after its steps (`rounds`); `methods` puts them
  into results.json (`coevolve` of the iteration entry) and TensorBoard (`round_scalars`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Sequence

from coevo_jax import coevolve
from coevo_jax.coevolve import rounds
from coevo_jax.coevolve.pool import PROVENANCES, PoolTask, TaskPool
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment
from coevo_jax.experiment import processes
from coevo_jax.experiment.grpo import rollout_file
from coevo_jax.experiment.rollouts import usable
from coevo_jax.experiment.store import RunStore, read_json, write_json_atomic

log = logging.getLogger(__name__)


def rounds_due(steps_done: int, num_rounds: int, every_steps: int) -> range:
    """The rounds to run now: those after steps F, 2F, ... <= `steps_done` that the pool (`num_rounds`
    rounds) lacks. A pool ahead of the steps (a round for a step not done) is an error."""
    due = steps_done // every_steps
    if num_rounds > due:
        raise ValueError(
            f"the CoEvolve pool has {num_rounds} rounds but only {steps_done} GRPO steps are done "
            f"({due} rounds at one every {every_steps} steps): the pool belongs to a later GRPO state"
        )
    return range(num_rounds, due)


def training_tasks(
    train_tasks: Sequence[str], pool_tasks: Sequence[PoolTask], rounds: int, eval_tasks: Collection[str]
) -> list[str]:
    """The task list a GRPO step draws from: the train tasks, then the pool's tasks of rounds < `rounds` in
    the order they joined.

    One list, drawn uniformly (`grpo.step_tasks`), as the paper's task set D_t to which validated tasks are
    appended: a synthesized task is as likely as an original one, so the pool's share of a step grows with
    its size, and there is no quota the paper does not have. With an empty pool the list, and so the draw,
    is `grpo`'s. A pool task with the id of an evaluation task (`eval_tasks`) is a ValueError.
    """
    added = [t.spec.task_id for t in pool_tasks if t.round < rounds]
    leaked = sorted(set(added) & set(eval_tasks))
    if leaked:
        raise ValueError(f"CoEvolve pool tasks with evaluation task ids: {leaked[:5]}")
    return [*train_tasks, *added]


def with_pool_tasks(env_factory: Callable[[], Environment], pool: TaskPool) -> Callable[[], Environment]:
    """`env_factory` whose environments also play the pool's tasks as it is when each is made."""

    def make() -> Environment:
        env = env_factory()
        try:
            env.add_tasks(pool.specs(env.name))
        except BaseException:
            env.close()
            raise
        return env

    return make


def round_records(store: RunStore, name: str, index: int, every_steps: int) -> list[Trajectory]:
    """Round `index`'s input: the usable episodes of run `name`'s GRPO steps index * F + 1 ... (index + 1) * F,
    each with its step as `iteration`, by step and episode id (the files hold them in finishing order).

    Usable as in GRPO's groups: an episode cut by an environment error or the context limit is no evidence
    of the policy's skill (it would read as a forgetting signal)."""
    records = []
    for step in range(index * every_steps + 1, (index + 1) * every_steps + 1):
        episodes = read_trajectories(store.path("rollouts", rollout_file(name, step)))
        episodes = sorted(usable(episodes), key=lambda t: t.traj_id)
        records += [dataclasses.replace(t, iteration=step) for t in episodes]
    return records


def round_entry(report: dict, every_steps: int) -> dict:
    """A round's results.json entry: its report with the GRPO step it ran after (`step`)."""
    return {"step": (report["round"] + 1) * every_steps, **report}


def round_scalars(entry: dict) -> dict[str, float]:
    """A round's TensorBoard scalars: signals detected by kind, the counts of each stage, the pass rate,
    the pool's size and make-up."""
    values = {f"signals_{kind}": n for kind, n in entry["signals"].items()}
    values.update({k: entry[k] for k in ("explored", "synthesized", "duplicates", "verified", "added")})
    values.update(pass_rate=entry["pass_rate"], pool_size=entry["pool_size"])
    values.update({f"pool_{p}": entry["pool_makeup"].get(p, 0) for p in PROVENANCES})
    return values


class CoEvolveLoop:
    """One CoEvolve method's `grpo.GrpoRun` (see the module docstring)."""

    def __init__(
        self,
        method: str,
        config: coevolve.CoEvolveConfig,
        store: RunStore,
        env_factory: Callable[[], Environment],
        train_tasks: Sequence[str],
        eval_tasks: Collection[str],
        seed: int,
    ):
        self.name, self.config, self.store, self.seed = method, config.for_method(method), store, seed
        self.train_tasks, self.eval_tasks = list(train_tasks), frozenset(eval_tasks)
        self.make_env = env_factory
        self.pool = TaskPool.open(os.path.join(store.workdir, method))
        self.env_factory = with_pool_tasks(env_factory, self.pool)

    def tasks_at(self, step: int) -> list[str]:
        return training_tasks(
            self.train_tasks, self.pool.tasks, step // self.config.every_steps, self.eval_tasks
        )

    def after_steps(self, done: int) -> None:
        for index in rounds_due(done, self.pool.num_rounds, self.config.every_steps):
            records = round_records(self.store, self.name, index, self.config.every_steps)
            if processes.count() == 1:
                report = coevolve.round(records, self.pool, self.make_env, self.config, self.seed)
            else:
                report = self._round_on_processes(records)
            log.info(
                "%s round %d after step %d: signals %s, explored %d, synthesized %d, verified %d, pool %d",
                self.name,
                index,
                (index + 1) * self.config.every_steps,
                report.signals,
                report.explored,
                report.synthesized,
                report.verified,
                report.pool_size,
            )

    def _round_on_processes(self, records: Sequence[Trajectory]) -> coevolve.RoundReport:
        """The round with its explorations shared out: every process plans the same round, makes its share
        of the attempts (every count-th from its rank) and writes them down; process 0 takes them in the
        plan's order into the pool, which every process then reads back: the pool is the one 1 process
        makes."""
        start, count, rank = time.perf_counter(), processes.count(), processes.rank()
        plan = rounds.plan_round(records, self.pool, rounds.env_name(self.make_env), self.config, self.seed)
        mine = rounds.run_attempts(
            plan, self.pool, self.make_env, self.config, range(rank, len(plan.attempts), count)
        )
        parts = os.path.join(self.store.workdir, self.name, f"round{plan.index}_attempts")
        os.makedirs(parts, exist_ok=True)
        write_json_atomic(os.path.join(parts, f"process{rank}.json"), [a.to_json() for a in mine])

        def finish():
            attempts = [
                rounds.Attempt.from_json(a)
                for r in range(count)
                for a in read_json(os.path.join(parts, f"process{r}.json"))
            ]
            rounds.finish_round(plan, attempts, self.pool, self.config, time.perf_counter() - start)

        processes.on_primary(f"{self.name} round {plan.index}", finish)
        if not processes.is_primary():
            self.pool.reload()
        processes.barrier(f"{self.name} round {plan.index} read")
        if processes.is_primary():
            shutil.rmtree(parts, ignore_errors=True)
        return coevolve.RoundReport(**{k: v for k, v in self.pool.rounds[-1].items() if k != "pass_rate"})

    def summary(self, first_step: int, last_step: int) -> dict:
        """The rounds that ran after steps `first_step + 1 ... last_step`, as results.json entries."""
        every = self.config.every_steps
        reports = self.pool.rounds[first_step // every : last_step // every]
        return {"rounds": [round_entry(report, every) for report in reports]}
