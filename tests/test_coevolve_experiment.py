"""The CoEvolve methods through the main job (slow): a tiny run of `grpo`, `coevolve` and `coevolve_no_verify`
on the built-in environment (2 iterations of one GRPO step, a round after every step), and a `coevolve` run
killed right after a pool save and again inside a round, resumed to the same results and pool.

The tiny policy's episodes are noise (no reward, no parseable action), so no signal could fire from them: the
rounds here also see, for every task a step drew, the expert's replay of it as one more episode of that step
(`_with_expert_episodes`, in environments holding the pool's tasks). Each drawn task then has a success and
failures in one step (a boundary signal), the rounds synthesize tasks, and the next step draws and plays them.
"""

import dataclasses
import json
import os

import numpy as np
import pytest
from test_experiment import tiny_config

from coevo_jax import envs
from coevo_jax.coevolve.pool import TaskPool
from coevo_jax.envs.base import record_expert_trajectory
from coevo_jax.experiment import coevolve_loop
from coevo_jax.experiment.run import run
from coevo_jax.experiment.tensorboard import read_scalars
from coevo_jax.reporting.results import load_results

ENV_KWARGS = {
    "seed": 0,
    "num_train": 8,
    "num_test_seen": 4,
    "num_test_unseen": 4,
    "budget_per_expert_step": 1,
    "budget_extra_steps": 1,
}
round_records = coevolve_loop.round_records


def _config(methods=("grpo", "coevolve", "coevolve_no_verify")):
    """`test_grpo_experiment`'s tiny GRPO run (2 iterations of one step of 2 tasks x 4 samples), a CoEvolve
    round after every step (`configs/tiny.py`) exploring up to 4 signals twice each."""
    return tiny_config(
        methods=methods,
        iterations=2,
        env={"kwargs": ENV_KWARGS, "eval_tasks": 2},
        grpo={"tasks_per_step": 2, "steps_per_iteration": 1, "batch_size": 8},
        coevolve={"explorations_per_signal": 2},
        rollout={"cache_len": 1000},
    )


def _with_expert_episodes(store, name, index, every_steps):
    """The round's episodes plus, per (task, step), the expert's replay of the task (see the module
    docstring)."""
    records = round_records(store, name, index, every_steps)
    pool = TaskPool.open(os.path.join(store.workdir, name))
    env = coevolve_loop.with_pool_tasks(lambda: envs.make("builtin", **ENV_KWARGS), pool)()
    experts = []
    for task, step in sorted({(r.task_id, r.iteration) for r in records}):
        expert = record_expert_trajectory(env, task, env.expert_steps(task))
        experts.append(
            dataclasses.replace(expert, traj_id=f"{task}/expert{step}", iteration=step, agent="target")
        )
    env.close()
    return records + experts


@pytest.fixture
def expert_episodes(monkeypatch):
    monkeypatch.setattr(coevolve_loop, "round_records", _with_expert_episodes)


@pytest.fixture(scope="module")
def coevolve_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("coevolve_run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(coevolve_loop, "round_records", _with_expert_episodes)
        return run(_config(), str(workdir)), workdir


def _without_timings(value):
    """Results or a pool file without the rounds' `seconds`."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


@pytest.mark.slow  # minutes on a busy 2-core CPU, compilation mostly
def test_coevolve_runs_rounds_in_the_main_job_and_reports_them(coevolve_run, expert_episodes):
    results, workdir = coevolve_run
    assert list(results["methods"]) == ["GRPO", "CoEvolve", "CoEvolve (no verification)"]
    for title, method in (("CoEvolve", "coevolve"), ("CoEvolve (no verification)", "coevolve_no_verify")):
        iterations = results["methods"][title]["iterations"]
        assert [e["iteration"] for e in iterations] == [0, 1, 2]
        rounds = [r for e in iterations[1:] for r in e["coevolve"]]
        assert [(r["round"], r["step"]) for r in rounds] == [(0, 1), (1, 2)]
        for entry in rounds:
            assert entry["signals"].get("boundary", 0) > 0 and entry["explored"] > 0
            assert entry["pool_size"] == sum(entry["pool_makeup"].values())
        assert rounds[0]["added"] > 0 and rounds[1]["pool_size"] >= rounds[0]["pool_size"]
        assert (rounds[0]["pass_rate"] is None) == (method == "coevolve_no_verify")
        # the method's own pool and GRPO state, beside each other
        pool = TaskPool.open(str(workdir / method))
        assert pool.num_rounds == 2 and len(pool) == rounds[-1]["pool_size"]
        assert all(t.verified == (method == "coevolve") for t in pool.tasks)
        history = json.loads((workdir / method / "history.json").read_text())
        assert [h["step"] for h in history] == [1, 2] and (workdir / method / "state").is_dir()
        # step 2 drew a task of round 0's, and the model played it in the run's environments
        step2 = [json.loads(line) for line in (workdir / "rollouts" / f"{method}_step2_explore.jsonl").open()]
        round0 = {t.spec.task_id for t in pool.tasks if t.round == 0}
        assert {r["task_id"] for r in step2} & round0
        scalars = read_scalars(workdir / "tensorboard")
        assert [step for step, _ in scalars[f"coevolve/{method}/pool_size"]] == [1, 2]
        assert [v for _, v in scalars[f"coevolve/{method}/pool_size"]] == [r["pool_size"] for r in rounds]
    # GRPO and CoEvolve, the same seeds: until a round adds a task they play and train on the same episodes
    grpo_history = json.loads((workdir / "grpo" / "history.json").read_text())
    coevolve_history = json.loads((workdir / "coevolve" / "history.json").read_text())
    assert grpo_history[0] == coevolve_history[0] and np.isfinite(coevolve_history[1]["loss"])
    assert not (workdir / "policies" / "sft_failure").exists()  # only the coevo methods need one
    for name in ("table.md", "reward_curves.png", "pool_makeup.png"):
        assert (workdir / name).stat().st_size > 0
    assert "| CoEvolve |" in (workdir / "table.md").read_text()
    assert load_results(workdir / "results.json")["methods"].keys() == results["methods"].keys()
    assert run(_config(), str(workdir))["methods"] == results["methods"]  # a rerun does nothing new


class SimulatedKill(Exception):
    pass


@pytest.mark.slow  # a coevolve run killed twice and resumed twice
def test_a_coevolve_run_killed_around_its_pool_saves_resumes_to_the_same_results(
    coevolve_run, expert_episodes, tmp_path, monkeypatch
):
    results, workdir = coevolve_run
    finish_round = TaskPool.finish_round

    def killed(at_round, before_save):
        def finish(pool, report, tasks, memory):
            if report["round"] == at_round and before_save:
                raise SimulatedKill
            added = finish_round(pool, report, tasks, memory)
            if report["round"] == at_round:
                raise SimulatedKill
            return added

        return finish

    config = _config(methods=("coevolve",))
    # right after round 0's save: the pool is a round ahead of iteration 1's record, step 2 not begun
    monkeypatch.setattr(TaskPool, "finish_round", killed(0, before_save=False))
    with pytest.raises(SimulatedKill):
        run(config, str(tmp_path))
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert (
        "train/coevolve_it1_target" not in stages
        and TaskPool.open(str(tmp_path / "coevolve")).num_rounds == 1
    )
    # in round 1, before its save: step 2 is checkpointed, the round is not
    monkeypatch.setattr(TaskPool, "finish_round", killed(1, before_save=True))
    with pytest.raises(SimulatedKill):
        run(config, str(tmp_path))
    assert json.loads((tmp_path / "coevolve" / "history.json").read_text())[-1]["step"] == 2
    assert TaskPool.open(str(tmp_path / "coevolve")).num_rounds == 1
    monkeypatch.setattr(TaskPool, "finish_round", finish_round)
    resumed = run(config, str(tmp_path))
    assert _without_timings(resumed["methods"]["CoEvolve"]) == _without_timings(
        results["methods"]["CoEvolve"]
    )
    pool, expected = (
        json.loads((d / "coevolve" / "coevolve_pool.json").read_text()) for d in (tmp_path, workdir)
    )
    assert _without_timings(pool) == _without_timings(expected)
    assert (tmp_path / "pool_makeup.png").stat().st_size > 0
