"""The CoEvolve methods' wiring in the main job, without a model: GRPO steps are played by the environment's
expert (a scripted history of successes and failures), so the rounds, their numbering on resume, the task list
drawn from the grown pool, the environments that play the pool's tasks, each method's own pool and the
per-round results entries, scalars and figure are checked in seconds."""

import dataclasses
import json
import types

import pytest
from coevolve_fixtures import failed
from test_experiment import tiny_config

from coevo_jax import coevolve, envs
from coevo_jax.coevolve.pool import PoolTask, TaskPool
from coevo_jax.data.records import write_trajectories
from coevo_jax.envs.base import TaskSpec, record_expert_trajectory
from coevo_jax.experiment import coevolve_loop, grpo, methods
from coevo_jax.experiment.coevolve_loop import CoEvolveLoop, rounds_due, training_tasks, with_pool_tasks
from coevo_jax.experiment.store import RunStore
from coevo_jax.reporting.figures import pool_makeup_figure
from coevo_jax.reporting.report import write_reports

ENV_KWARGS = {"seed": 0, "num_train": 16, "num_test_seen": 4, "num_test_unseen": 4}
CONFIG = coevolve.CoEvolveConfig(every_steps=2, max_signals=4, explorations_per_signal=1)
TASKS_PER_STEP = 6


def make_env():
    return envs.make("builtin", **ENV_KWARGS)


def eval_ids():
    env = make_env()
    return {t for split in ("test_seen", "test_unseen") for t in env.tasks(split)}


def play_step(run, store: RunStore, step: int) -> list[str]:
    """GRPO step `step` (0-based) of `run` played by the expert in the run's own environments: 2 episodes a
    task; at odd steps every third task fails both (forgetting, once seen) and every other one fails one
    (boundary); one episode ends in an environment error (unusable). Returns the drawn tasks."""
    tasks = grpo.step_tasks(run.tasks_at(step), TASKS_PER_STEP, seed=0, step=step)
    env, episodes = run.env_factory(), []
    try:
        for i, task in enumerate(tasks):
            expert = record_expert_trajectory(env, task, env.expert_steps(task))
            for k in range(2):
                episode = dataclasses.replace(expert, traj_id=f"{task}/{step}/{k}", agent="target")
                if step % 2 and (i % 3 == 0 or (i % 2 == 0 and k == 1)):
                    episode = failed(episode)
                episodes.append(episode)
        broken = dataclasses.replace(episodes[0], traj_id="broken", reward=0.0)
        episodes.append(dataclasses.replace(broken, extra={"terminate_reason": "env_error: Boom"}))
    finally:
        env.close()
    write_trajectories(store.path("rollouts", grpo.rollout_file(run.name, step + 1)), episodes)
    return tasks


def fake_phase(run, store, first_step: int, last_step: int, done=None) -> tuple[dict, list[list[str]]]:
    """What `grpo.grpo_phase` does around the steps of an iteration (`done` of them restored):
    `after_steps` once restored and after each step."""
    done = first_step if done is None else done
    run.after_steps(done)
    draws = []
    for step in range(done, last_step):
        draws.append(play_step(run, store, step))
        run.after_steps(step + 1)
    return run.summary(first_step, last_step), draws


def new_loop(workdir, method="coevolve", config=CONFIG) -> CoEvolveLoop:
    store = RunStore(str(workdir))
    train = make_env().tasks("train")
    return CoEvolveLoop(method, config, store, make_env, train, eval_ids(), seed=0)


def pool_json(path) -> dict:
    """A pool file without the rounds' timings."""
    data = json.loads(path.read_text())
    for report in data["rounds"]:
        report.pop("seconds")
    return data


# --- pure pieces ---------------------------------------------------------------------------------------------


def test_rounds_are_due_every_F_steps_and_numbered_by_the_pool():
    assert list(rounds_due(0, 0, 10)) == [] and list(rounds_due(9, 0, 10)) == []
    assert list(rounds_due(10, 0, 10)) == [0] and list(rounds_due(20, 1, 10)) == [1]
    assert list(rounds_due(20, 2, 10)) == []  # killed after the pool's save: nothing is redone
    assert list(rounds_due(21, 1, 10)) == [1]  # killed before it: the round is run, not skipped
    with pytest.raises(ValueError, match="later GRPO state"):
        rounds_due(19, 2, 10)


def _pool_task(task_id: str, round_index: int) -> PoolTask:
    spec = TaskSpec(task_id, "do it", {}, ("a", "b", "c"), "builtin")
    return PoolTask(spec, "boundary", "train_0", round_index, 1, True, task_id)


def test_the_task_list_is_the_train_tasks_then_the_pool_tasks_of_earlier_rounds():
    train = [f"t{i}" for i in range(10)]
    pool = [_pool_task("p0", 0), _pool_task("p1", 0), _pool_task("p2", 1)]
    assert training_tasks(train, pool, 0, set()) == train  # before any round: grpo's list, so grpo's draw
    assert training_tasks(train, pool, 1, set()) == [*train, "p0", "p1"]
    assert training_tasks(train, pool, 2, set()) == [*train, "p0", "p1", "p2"]
    drawn = {t for s in range(20) for t in grpo.step_tasks(training_tasks(train, pool, 2, ()), 4, 0, s)}
    assert {"p0", "p1", "p2"} <= drawn
    with pytest.raises(ValueError, match="evaluation task ids: \\['p1'\\]"):
        training_tasks(train, pool, 1, {"p1", "e0"})


def test_environments_made_by_the_wrapper_play_the_pool_tasks_of_when_they_are_made(tmp_path):
    loop = new_loop(tmp_path)
    fake_phase(loop, loop.store, 0, 2)  # one round
    assert len(loop.pool) > 0
    task = loop.pool.tasks[0].spec.task_id
    before = loop.env_factory()
    with pytest.raises(ValueError):
        make_env().reset(task)  # the plain factory's environments (evaluation) do not have it
    assert loop.env_factory().reset(task) and before.reset(task)
    later = _pool_task("coevolve/zzz", 1)
    later = dataclasses.replace(
        later, spec=dataclasses.replace(loop.pool.tasks[0].spec, task_id="coevolve/z")
    )
    loop.pool.add([later])
    loop.env_factory().reset("coevolve/z")
    with pytest.raises(ValueError):
        before.reset("coevolve/z")

    closed = []

    class Refusing:
        name = "builtin"

        def add_tasks(self, specs):
            raise ValueError("no")

        def close(self):
            closed.append(True)

    with pytest.raises(ValueError, match="no"):
        with_pool_tasks(Refusing, loop.pool)()
    assert closed == [True]


# --- the loop ------------------------------------------------------------------------------------------------


def test_a_round_runs_after_every_F_steps_on_those_steps_and_its_tasks_are_drawn_and_played(tmp_path):
    loop = new_loop(tmp_path)
    first, draws_1 = fake_phase(loop, loop.store, 0, 3)  # an iteration of 3 steps: round 0 after step 2
    second, draws_2 = fake_phase(loop, loop.store, 3, 6)  # rounds 1 and 2 after steps 4 and 6
    assert [r["round"] for r in first["rounds"]] == [0] and [r["step"] for r in first["rounds"]] == [2]
    assert [r["round"] for r in second["rounds"]] == [1, 2] and [r["step"] for r in second["rounds"]] == [
        4,
        6,
    ]
    assert (tmp_path / "coevolve" / "coevolve_pool.json").exists() and loop.pool.num_rounds == 3
    for entry in first["rounds"] + second["rounds"]:
        assert entry["rollouts"] == 2 * 2 * TASKS_PER_STEP  # two steps' usable episodes (not the broken one)
        assert entry["explored"] == sum(entry["explored_signals"].values()) * CONFIG.explorations_per_signal
    records = coevolve_loop.round_records(loop.store, "coevolve", 1, 2)
    assert {r.iteration for r in records} == {3, 4} and all(r.traj_id != "broken" for r in records)
    assert records == sorted(records, key=lambda r: (r.iteration, r.traj_id))
    assert first["rounds"][0]["signals"]["boundary"] > 0 and len(loop.pool) > 0
    # pool tasks join the draw from the step after their round, and the run's environments play them
    pool_ids = {t.spec.task_id: t.round for t in loop.pool.tasks}
    for step, tasks in enumerate(draws_1 + draws_2):
        assert all(pool_ids[t] < step // 2 for t in tasks if t in pool_ids)
        assert not set(tasks) & eval_ids()
    assert any(t in pool_ids for tasks in draws_2 for t in tasks)


class SimulatedKill(Exception):
    pass


def test_a_loop_killed_before_or_after_the_pools_save_resumes_to_the_same_pool(tmp_path, monkeypatch):
    reference = new_loop(tmp_path / "a")
    fake_phase(reference, reference.store, 0, 6)

    workdir = tmp_path / "b"
    loop = new_loop(workdir)
    fake_phase(loop, loop.store, 0, 3)  # round 0
    play_step(loop, loop.store, 3)  # step 4 done and checkpointed; killed in round 1, before its save
    finish_round = TaskPool.finish_round
    monkeypatch.setattr(TaskPool, "finish_round", lambda *a: (_ for _ in ()).throw(SimulatedKill()))
    with pytest.raises(SimulatedKill):
        loop.after_steps(4)
    monkeypatch.setattr(TaskPool, "finish_round", finish_round)
    assert TaskPool.open(str(workdir / "coevolve")).num_rounds == 1

    resumed = new_loop(workdir)  # a new process at step 4: redoes round 1, then steps 5 and 6 and round 2
    summary, _ = fake_phase(resumed, resumed.store, 3, 6, done=4)
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    again = new_loop(workdir)  # killed right after round 2's save: nothing is redone
    assert fake_phase(again, again.store, 3, 6, done=6)[0]["rounds"] == summary["rounds"]
    assert again.pool.num_rounds == 3
    assert pool_json(workdir / "coevolve" / "coevolve_pool.json") == pool_json(
        tmp_path / "a" / "coevolve" / "coevolve_pool.json"
    )
    with pytest.raises(ValueError, match="later GRPO state"):
        again.after_steps(5)


# --- the method runner, results entries, scalars and figure ---------------------------------------------------


def _fake_stages(tmp_path, steps_per_iteration=3, **coevolve_fields):
    cfg = tiny_config(
        env={"kwargs": ENV_KWARGS},
        grpo={"steps_per_iteration": steps_per_iteration},
        coevolve={"every_steps": 2, "max_signals": 4, "explorations_per_signal": 1, **coevolve_fields},
    )
    store, scalars = RunStore(str(tmp_path)), []

    def train_grpo(name, start, iteration, run=None):
        first = (iteration - 1) * steps_per_iteration
        summary, _ = fake_phase(run, store, first, first + steps_per_iteration)
        return name, {"steps": steps_per_iteration, "history": [], **summary}

    return types.SimpleNamespace(
        setup=types.SimpleNamespace(cfg=cfg),
        store=store,
        env_factory=make_env,
        train_tasks=make_env().tasks("train"),
        train_grpo=train_grpo,
        evaluate=lambda policy: {"test_seen": {"avg_reward": 0.5, "success_rate": 0.25, "episodes": 4}},
        on_scalars=lambda tag, step, values: scalars.append((tag, step, values)),
        scalars=scalars,
    )


def test_each_method_records_its_rounds_in_results_and_tensorboard_with_its_own_pool(tmp_path):
    stages = _fake_stages(tmp_path)
    results = {"env": "builtin", "splits": ["test_seen"], "methods": {}}
    for method, title in (("coevolve", "CoEvolve"), ("coevolve_no_verify", "No verify")):
        entries = methods.METHOD_RUNNERS[method](stages, 2, lambda entry: None)
        results["methods"][title] = {"iterations": entries}
        assert [e["iteration"] for e in entries] == [0, 1, 2] and "coevolve" not in entries[0]
        rounds = [r for e in entries[1:] for r in e["coevolve"]]
        assert [r["round"] for r in rounds] == [0, 1, 2] and [r["step"] for r in rounds] == [2, 4, 6]
        assert all("rounds" not in e["train"]["target"] for e in entries[1:])
        for entry in rounds:
            assert {"signals", "explored", "synthesized", "verified", "pass_rate", "pool_size"} <= set(entry)
        pool = TaskPool.open(str(tmp_path / method))  # each method its own pool
        assert pool.num_rounds == 3 and len(pool) == rounds[-1]["pool_size"] > 0
        assert all(t.verified == (method == "coevolve") for t in pool.tasks)
        assert all(r["pass_rate"] is None for r in rounds) == (method == "coevolve_no_verify")
        logged = [(step, v) for tag, step, v in stages.scalars if tag == f"coevolve/{method}"]
        assert [step for step, _ in logged] == [2, 4, 6]
        assert [v["pool_size"] for _, v in logged] == [r["pool_size"] for r in rounds]
    figure = pool_makeup_figure(results)
    assert [ax.get_title() for ax in figure.axes] == ["CoEvolve", "No verify"]
    heights = {}
    for patch in figure.axes[0].patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        heights[x] = heights.get(x, 0) + patch.get_height()
    expected = {
        r["step"]: r["pool_size"]
        for e in results["methods"]["CoEvolve"]["iterations"][1:]
        for r in e["coevolve"]
    }
    assert heights == expected
    paths = write_reports(results, tmp_path)
    assert paths["pool_makeup"].stat().st_size > 0
    del results["methods"]["CoEvolve"], results["methods"]["No verify"]
    results["methods"]["GRPO"] = {"iterations": [{"iteration": 0, "eval": {}}]}
    (tmp_path / "other").mkdir()
    assert "pool_makeup" not in write_reports(results, tmp_path / "other")


def test_unguided_exploration_and_one_signal_alone_through_the_method_runner(tmp_path):
    stages = _fake_stages(tmp_path, steps_per_iteration=2)
    methods.METHOD_RUNNERS["coevolve_unguided"](stages, 2, lambda entry: None)
    methods.METHOD_RUNNERS["coevolve_boundary"](stages, 2, lambda entry: None)
    unguided = TaskPool.open(str(tmp_path / "coevolve_unguided"))
    assert len(unguided) > 0 and {t.signal for t in unguided.tasks} == {"unguided"}
    boundary = TaskPool.open(str(tmp_path / "coevolve_boundary"))
    assert set().union(*(r["signals"] for r in boundary.rounds)) == {"boundary"}
    assert {t.signal for t in boundary.tasks} == {"boundary"}
