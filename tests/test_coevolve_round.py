"""`coevolve.round` on the built-in environment, its experts replayed as a fake rollout history: counts,
verification, provenance, resume, seeding and the ablation switches."""

import dataclasses
import json

import pytest
from coevolve_fixtures import fake_history

from coevo_jax import coevolve
from coevo_jax.coevolve import rounds
from coevo_jax.coevolve.builtin_synthesis import BuiltinSynthesizer
from coevo_jax.coevolve.pool import TaskPool
from coevo_jax.coevolve.synthesis import replay_failure
from coevo_jax.envs.builtin import BuiltinEnv

CONFIG = coevolve.CoEvolveConfig(max_signals=6, explorations_per_signal=2, min_seen=20)


def make_env():
    return BuiltinEnv(num_train=40, num_dev=7, num_dev_unseen=3, num_test_seen=7, num_test_unseen=3)


@pytest.fixture(scope="module")
def records():
    env = make_env()
    return fake_history(env.expert_trajectories("train", limit=24))


def test_a_round_adds_verified_tasks_that_a_fresh_environment_plays_to_one(records, tmp_path):
    pool = TaskPool.open(str(tmp_path))
    report = coevolve.round(records, pool, make_env, CONFIG, seed=0)
    # fake_history: tasks 0, 3, ..., 21 fail at step 1 (8 forgetting), 0, 4, ..., 20 split at step 2 (6 boundary)
    assert report.signals["forgetting"] == 8 and report.signals["boundary"] == 6
    assert sum(report.explored_signals.values()) == 6 and report.explored == 12
    assert report.explored == report.synthesized + sum(report.not_synthesized.values())
    assert report.synthesized == report.duplicates + report.verified + sum(
        report.failed_verification.values()
    )
    assert report.verified == report.added == len(pool) > 0 and report.pass_rate == 1.0
    assert report.pool_size == len(pool) and sum(report.pool_makeup.values()) == len(pool)
    fresh = make_env()
    for task in pool.tasks:
        assert task.verified and task.round == 0 and task.signal in ("forgetting", "boundary", "rare")
        assert task.parent_task in make_env().tasks("train") and len(task.spec.solution) >= 3
        assert replay_failure(fresh, task.spec) is None
    assert set(report.task_ids) == {t.spec.task_id for t in pool.tasks}


def test_the_same_seed_gives_the_same_pool_and_another_seed_another(records, tmp_path):
    pools = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        pool = TaskPool.open(str(tmp_path / name))
        coevolve.round(records, pool, make_env, CONFIG, seed=seed)
        pools.append([t.spec.to_json() for t in pool.tasks])
    assert pools[0] == pools[1] and pools[0] != pools[2]


def test_the_pool_resumes_with_its_signal_memory_and_never_adds_a_task_twice(records, tmp_path):
    pool = TaskPool.open(str(tmp_path))
    first = coevolve.round([r for r in records if r.iteration == 0], pool, make_env, CONFIG, seed=0)
    assert first.signals == {} and first.explored == 0 and pool.num_rounds == 1
    resumed = TaskPool.open(str(tmp_path))
    assert resumed.memory == pool.memory and len(resumed.memory.scores) == 24
    later = [r for r in records if r.iteration > 0]
    second = coevolve.round(later, resumed, make_env, CONFIG, seed=0)
    # the forgetting at step 1 needs step 0's scores, which only the pool's memory holds
    assert second.round == 1 and second.signals["forgetting"] == 8 and second.signals["boundary"] == 6
    again = TaskPool.open(str(tmp_path))
    assert again.num_rounds == 2 and len(again) == second.added > 0
    known = again.tasks[0].spec

    class Known(BuiltinSynthesizer):  # finds only a task the pool already holds
        def abstract(self, env, exploration, *, min_steps):
            return known

    third = coevolve.round(later, again, make_env, CONFIG, seed=0, synthesizer=Known())
    assert third.added == 0 and third.duplicates == third.synthesized == 12 and len(again) == second.added


def test_ablations_one_signal_no_verification_and_unguided_exploration(records, tmp_path):
    only = coevolve.round(records, TaskPool(), make_env, CONFIG.for_method("coevolve_boundary"), seed=0)
    assert set(only.signals) == {"boundary"} == set(only.explored_signals)
    pool = TaskPool()
    unverified = coevolve.round(records, pool, make_env, CONFIG.for_method("coevolve_no_verify"), seed=0)
    assert unverified.verified == 0 and unverified.pass_rate is None and unverified.added > 0
    assert not any(t.verified for t in pool.tasks)
    pool = TaskPool()
    unguided = coevolve.round(records, pool, make_env, CONFIG.for_method("coevolve_unguided"), seed=0)
    assert unguided.explored == 12 and {t.signal for t in pool.tasks} == {"unguided"}
    assert all(t.step is None for t in pool.tasks)


class BrokenSolutions(BuiltinSynthesizer):
    """Abstracts as usual, then drops the last step of the solution: verification must catch every one."""

    def abstract(self, env, exploration, *, min_steps):
        spec = super().abstract(env, exploration, min_steps=min_steps)
        return spec if isinstance(spec, str) else dataclasses.replace(spec, solution=spec.solution[:-1])


class Exploding(BuiltinSynthesizer):
    def explore(self, env, signal, rng, *, steps, exploration_id):
        raise RuntimeError("the environment fell over")


def test_failing_tasks_are_dropped_and_counted_and_errors_never_end_the_round(records):
    pool = TaskPool()
    report = coevolve.round(records, pool, make_env, CONFIG, seed=0, synthesizer=BrokenSolutions())
    checked = report.synthesized - report.duplicates
    assert checked > 0 and report.failed_verification == {"replay scores below 1": checked}
    assert report.verified == report.added == len(pool) == 0 and report.pass_rate == 0.0
    report = coevolve.round(records, TaskPool(), make_env, CONFIG, seed=0, synthesizer=Exploding())
    assert report.not_synthesized == {"error: RuntimeError": 12} and report.added == 0


@pytest.mark.parametrize("shares", [2, 3])
def test_a_round_shared_out_over_processes_gives_the_one_process_pool(records, tmp_path, shares):
    """What N processes do (`experiment.coevolve_loop`): each makes every N-th attempt of the same plan, its
    outcomes pass through JSON, and the merge in the plan's order (duplicates across shares found there)
    gives the pool and report of one process's round."""
    whole = TaskPool.open(str(tmp_path / "one"))
    expected = coevolve.round(records, whole, make_env, CONFIG, seed=0)
    split = TaskPool.open(str(tmp_path / "split"))
    plan = rounds.plan_round(records, split, "builtin", CONFIG, seed=0)
    attempts = []
    for share in range(shares):
        mine = rounds.run_attempts(plan, split, make_env, CONFIG, range(share, len(plan.attempts), shares))
        attempts += [rounds.Attempt.from_json(json.loads(json.dumps(a.to_json()))) for a in mine]
    report = rounds.finish_round(plan, attempts, split, CONFIG, seconds=0.0)
    assert dataclasses.replace(report, seconds=0.0) == dataclasses.replace(expected, seconds=0.0)
    assert [t.to_json() for t in split.tasks] == [t.to_json() for t in whole.tasks]
    assert split.memory.to_json() == whole.memory.to_json()
    reread = TaskPool.open(str(tmp_path / "split"))
    split.reload()
    assert [t.to_json() for t in split.tasks] == [t.to_json() for t in reread.tasks]
