"""One CoEvolve round: signals from the recent rollouts -> exploration -> abstraction -> verification -> pool.

`round(records, pool, env_factory, config, seed)` is the one call the main job makes every F training steps
(`config.every_steps`), with the rollouts sampled since the last round (each carrying its training step as
`iteration`). It
1. detects the signals of `config.signals` after the pool's signal memory (`signals.detect`);
2. picks at most `config.max_signals` of them, one per (kind, task) (its latest step), the kinds taking turns
   in a seeded order; the others are counted only;
3. explores each `config.explorations_per_signal` times for `config.exploration_steps` steps in an
   environment from `env_factory` that holds the pool's tasks (a signal may point at one), and abstracts each
   exploration into at most one task (`config.synthesizer`: the environment's programmatic synthesizer, or the
   LLM path of `llm`);
4. drops tasks already in the pool or found twice this round, and verifies the rest by execution in a second
   environment from `env_factory` that explored nothing (skipped with `config.verify=False`);
5. adds the verified tasks to the pool with their provenance and saves it (`pool.TaskPool.finish_round`).

The report counts each stage (`RoundReport`): signals by kind, explorations run, tasks synthesized,
duplicates, tasks verified, the pass rate (verified / synthesized and new), what was dropped and why, and the
pool's size and make-up: the main job writes it into `results.json`. Everything is seeded by (seed, round,
signal, run): the same inputs give the same pool. An exception inside one exploration is logged and counted
(`error: <type>`), never fatal to the run.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence

from coevo_jax.coevolve.config import CoEvolveConfig
from coevo_jax.coevolve.patterns import trajectory_patterns
from coevo_jax.coevolve.pool import PoolTask, TaskPool
from coevo_jax.coevolve.signals import SIGNAL_KINDS, Signal, SignalMemory, detect
from coevo_jax.coevolve.synthesis import Synthesizer, spec_digest, synthesizer_for
from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment, TaskSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RoundReport:
    """What one round did (see the module docstring); `to_json` is its `results.json` entry."""

    round: int
    rollouts: int
    signals: dict[str, int]  # detected, by kind
    explored_signals: dict[str, int]  # of those, explored, by kind
    explored: int  # exploration runs
    synthesized: int  # tasks abstracted from them
    duplicates: int  # of those, already in the pool or found earlier this round
    verified: int  # of the new ones, those that passed verification (0 when verification is off)
    added: int  # tasks that joined the pool
    not_synthesized: dict[str, int]  # exploration runs that gave no task, by reason
    failed_verification: dict[str, int]  # new tasks dropped by verification, by reason
    pool_size: int
    pool_makeup: dict[str, int]  # pool tasks by provenance after the round
    seconds: float
    task_ids: tuple[str, ...] = ()

    @property
    def pass_rate(self) -> float | None:
        """Verified / new synthesized tasks (None when none were checked)."""
        checked = self.verified + sum(self.failed_verification.values())
        return self.verified / checked if checked else None

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "task_ids": list(self.task_ids), "pass_rate": self.pass_rate}


def select_signals(signals: Sequence[Signal], limit: int, rng: random.Random) -> list[Signal]:
    """At most `limit` signals, one per (kind, task) at its latest step, the kinds taking turns."""
    latest: dict[tuple[str, str], Signal] = {}
    for signal in signals:
        key = (signal.kind, signal.task_id)
        if key not in latest or signal.step >= latest[key].step:
            latest[key] = signal
    queues = {kind: [s for s in latest.values() if s.kind == kind] for kind in SIGNAL_KINDS}
    for queue in queues.values():
        rng.shuffle(queue)
    order = [kind for kind in SIGNAL_KINDS if queues[kind]]
    rng.shuffle(order)
    chosen = []
    while len(chosen) < limit and any(queues[k] for k in order):
        for kind in order:
            if queues[kind] and len(chosen) < limit:
                chosen.append(queues[kind].pop())
    return chosen


def _synthesizer(env: Environment, config: CoEvolveConfig) -> Synthesizer:
    if config.synthesizer == "llm":
        from coevo_jax.coevolve.llm import LlmSynthesizer  # loads a model: only when asked for

        return LlmSynthesizer.from_config(env.name, config)
    return synthesizer_for(env.name)


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """What a round will explore, the same on every process: the signals detected in its records, the
    signals' memory after them, the chosen signals and one attempt (signal, run, seed key) per exploration."""

    index: int
    rollouts: int
    signals: tuple[Signal, ...]
    memory: SignalMemory
    chosen: tuple[Signal, ...]
    attempts: tuple[tuple[Signal, int, str], ...]


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One exploration's outcome (JSON-able, so processes can pass it on): whether it explored, the task it
    abstracted (or why none: `failure`), the verification's verdict where it ran (`checked`; not for a task
    already in the pool or found earlier by the same process), and an error raised while verifying."""

    position: int
    explored: bool
    failure: str | None = None  # no task: the synthesizer's reason or `error: <type>`
    spec: TaskSpec | None = None
    digest: str = ""
    parent: str = ""
    checked: bool = False
    verify_reason: str | None = None
    error: str | None = None  # raised by the verification

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "spec": None if self.spec is None else self.spec.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> Attempt:
        spec = None if data["spec"] is None else TaskSpec.from_json(data["spec"])
        return cls(**{**data, "spec": spec})


def env_name(env_factory: Callable[[], Environment]) -> str:
    """The name of the environments `env_factory` makes (one is made and closed)."""
    probe = env_factory()
    try:
        return probe.name
    finally:
        probe.close()


def plan_round(
    records: Sequence[Trajectory], pool: TaskPool, env_name: str, config: CoEvolveConfig, seed: int
) -> RoundPlan:
    """Steps 1-2 of round `pool.num_rounds` (see the module docstring): signals and the attempts to make."""
    index = pool.num_rounds
    signals, memory = detect(
        records,
        pool.memory,
        lambda t: trajectory_patterns(t, env_name),
        kinds=config.signals,
        window=config.window,
        theta=config.theta,
        min_seen=config.min_seen,
    )
    chosen = select_signals(signals, config.max_signals, random.Random(f"{seed}/round/{index}"))
    attempts = tuple(
        (signal, run, f"{seed}/{index}/{signal.kind}/{signal.task_id}/{signal.step}/{run}")
        for signal in chosen
        for run in range(config.explorations_per_signal)
    )
    return RoundPlan(index, len(records), tuple(signals), memory, tuple(chosen), attempts)


def run_attempts(
    plan: RoundPlan,
    pool: TaskPool,
    env_factory: Callable[[], Environment],
    config: CoEvolveConfig,
    positions: Sequence[int],
    synthesizer: Synthesizer | None = None,
) -> list[Attempt]:
    """Step 3-4's work for the attempts at `positions` of the plan (all of them on one process, a share on
    several): explore, abstract, and verify each new task. One failing attempt is logged, never fatal."""
    explore_env, verify_env = env_factory(), env_factory()
    outcomes, digests = [], set()
    try:
        for env in (explore_env, verify_env):
            env.add_tasks(pool.specs(env.name))
        synthesizer = synthesizer or _synthesizer(explore_env, config)
        for position in positions:
            signal, _, key = plan.attempts[position]
            explored, spec, digest, parent = False, None, "", ""
            try:
                exploration = synthesizer.explore(
                    explore_env,
                    signal if config.guided else None,
                    random.Random(key),
                    steps=config.exploration_steps,
                    exploration_id=key,
                )
                explored, parent = True, exploration.parent
                spec = synthesizer.abstract(explore_env, exploration, min_steps=config.min_solution_steps)
                if isinstance(spec, str):
                    outcomes.append(Attempt(position, True, failure=spec))
                    continue
                digest = spec_digest(spec.env, spec.state, spec.solution)
                if digest in pool or digest in digests:  # a duplicate: not verified again
                    outcomes.append(Attempt(position, True, spec=spec, digest=digest, parent=parent))
                    continue
                digests.add(digest)
                reason = synthesizer.verify(verify_env, spec) if config.verify else None
            except Exception as error:  # one bad exploration must not end a training run
                log.exception("coevolve round %d: %s failed", plan.index, key)
                failure = f"error: {type(error).__name__}"
                if isinstance(spec, TaskSpec):  # raised by the verification
                    outcomes.append(
                        Attempt(position, True, spec=spec, digest=digest, parent=parent, error=failure)
                    )
                else:
                    outcomes.append(Attempt(position, explored, failure=failure))
                continue
            outcomes.append(Attempt(position, True, None, spec, digest, parent, True, reason))
    finally:
        explore_env.close()
        verify_env.close()
    return outcomes


def finish_round(
    plan: RoundPlan, attempts: Sequence[Attempt], pool: TaskPool, config: CoEvolveConfig, seconds: float
) -> RoundReport:
    """Step 5: the attempts taken in the plan's order (duplicates across processes found here), the verified
    new tasks added to the pool, the pool saved; the round's report."""
    counts, not_synthesized, failed = Counter(), Counter(), Counter()
    accepted: list[PoolTask] = []
    digests = set()
    for attempt in sorted(attempts, key=lambda a: a.position):
        signal = plan.attempts[attempt.position][0]
        counts["explored"] += attempt.explored
        if attempt.spec is None:
            not_synthesized[attempt.failure] += 1
            continue
        counts["synthesized"] += 1
        if attempt.digest in pool or attempt.digest in digests:
            counts["duplicates"] += 1
            continue
        digests.add(attempt.digest)
        if attempt.error is not None:
            not_synthesized[attempt.error] += 1
            continue
        if not attempt.checked:
            raise RuntimeError(f"coevolve round {plan.index}: attempt {attempt.position} was never verified")
        if attempt.verify_reason is not None:
            failed[attempt.verify_reason] += 1
            continue
        counts["verified"] += int(config.verify)
        provenance = signal.kind if config.guided else "unguided"
        step = signal.step if config.guided else None
        accepted.append(
            PoolTask(
                attempt.spec, provenance, attempt.parent, plan.index, step, config.verify, attempt.digest
            )
        )
    makeup = Counter(t.signal for t in pool.tasks) + Counter(t.signal for t in accepted)
    report = RoundReport(
        round=plan.index,
        rollouts=plan.rollouts,
        signals=dict(Counter(s.kind for s in plan.signals)),
        explored_signals=dict(Counter(s.kind for s in plan.chosen)),
        explored=counts["explored"],
        synthesized=counts["synthesized"],
        duplicates=counts["duplicates"],
        verified=counts["verified"],
        added=len(accepted),
        not_synthesized=dict(not_synthesized),
        failed_verification=dict(failed),
        pool_size=len(pool) + len(accepted),
        pool_makeup=dict(makeup),
        seconds=seconds,
        task_ids=tuple(t.spec.task_id for t in accepted),
    )
    pool.finish_round(report.to_json(), accepted, plan.memory)
    return report


def round(  # noqa: A001 (the one public verb of the module: `coevolve.round`)
    records: Sequence[Trajectory],
    pool: TaskPool,
    env_factory: Callable[[], Environment],
    config: CoEvolveConfig,
    seed: int,
    synthesizer: Synthesizer | None = None,
) -> RoundReport:
    """Runs round `pool.num_rounds` on `records` (see the module docstring) in this process; the pool is
    updated and saved. `synthesizer` overrides the one `config` names (the LLM path's, built once and reused,
    or a test's)."""
    start = time.perf_counter()
    plan = plan_round(records, pool, env_name(env_factory), config, seed)
    attempts = run_attempts(plan, pool, env_factory, config, range(len(plan.attempts)), synthesizer)
    return finish_round(plan, attempts, pool, config, time.perf_counter() - start)
