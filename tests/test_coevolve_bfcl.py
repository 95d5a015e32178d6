"""BFCL's CoEvolve synthesizer: arguments, where each signal sends the exploration, the multi-turn tasks it
abstracts, verification by replay under BFCL's checker, and a whole round on fake rollouts."""

import random

import pytest
from coevolve_fixtures import fake_history

from coevo_jax import coevolve
from coevo_jax.coevolve.bfcl_synthesis import BfclSynthesizer, call_works, value_bank
from coevo_jax.coevolve.signals import Signal
from coevo_jax.coevolve.synthesis import replay_failure
from coevo_jax.envs.base import TaskSpec
from coevo_jax.envs.bfcl import BfclEnv

SYNTH = BfclSynthesizer()


@pytest.fixture(scope="module")
def env():
    env = BfclEnv()
    yield env
    env.close()


@pytest.fixture(scope="module")
def experts(env):
    return env.expert_trajectories("train", limit=12)


def explore(env, signal, seed):
    exploration = SYNTH.explore(env, signal, random.Random(seed), steps=16, exploration_id=str(seed))
    return exploration, SYNTH.abstract(env, exploration, min_steps=3)


def test_a_call_works_unless_it_is_refused_raises_or_answers_an_error():
    assert call_works('cd(folder=\'a\') -> {"current_working_directory": "a"}', "cd(folder='a')")
    assert call_works("ls() -> None", "ls()")
    assert not call_works('cd(folder=\'x\') -> {"error": "cd: x: No such directory"}', "cd(folder='x')")
    assert not call_works("mv() -> Error during execution: missing argument", "mv()")
    assert not call_works("Error: 'rmrf' is not one of the functions of this task", "rmrf()")


def test_the_value_bank_holds_ground_truth_arguments_of_train_tasks():
    bank = value_bank("multi_turn_base")
    assert "document" in bank[("cd", "folder")]  # multi_turn_base_0's first call (a train task)
    assert all(isinstance(values, tuple) and values for values in bank.values())


def test_each_signal_sends_the_exploration_where_it_points(env, experts):
    own_calls, calls, own_share = 0, 0, []
    for seed, trajectory in enumerate(experts[:6]):
        parent = env.task(trajectory.task_id)
        forgotten, _ = explore(env, Signal("forgetting", parent.task_id, 1, (trajectory,)), seed)
        assert forgotten.parent == parent.task_id
        boundary, _ = explore(env, Signal("boundary", parent.task_id, 1, (trajectory,)), seed)
        assert boundary.parent != parent.task_id
        assert env.task(boundary.parent).involved_classes == parent.involved_classes
        own = {call.split("(")[0] for turn in parent.ground_truth for call in turn}
        called = [s.action[1:].split("(")[0] for s in forgotten.steps]
        own_calls, calls = own_calls + sum(name in own for name in called), calls + len(called)
        own_share.append(len(own) / len(parent.functions))
    # its own functions are favoured: called well over their share of the task's functions
    assert own_calls / calls > 2.5 * sum(own_share) / len(own_share)
    names = {"get_stock_info"}
    rare_task = next(t for t in env.tasks("train") if "TradingBot" in env.task(t).involved_classes)
    rare, spec = explore(env, Signal("rare", rare_task, 1, experts[:1], patterns=tuple(names)), 0)
    assert sum(s.action.startswith("[get_stock_info(") for s in rare.steps) >= 5
    assert isinstance(spec, str) or "get_stock_info(" in "".join(spec.solution)
    assert len({explore(env, None, seed)[0].parent for seed in range(8)}) >= 6


def test_abstraction_turns_the_calls_that_worked_into_turns_with_their_ground_truth(env, experts):
    trajectory = experts[0]
    signal = Signal("forgetting", trajectory.task_id, 1, (trajectory,))
    exploration, spec = next(
        (e, s) for e, s in (explore(env, signal, seed) for seed in range(20)) if not isinstance(s, str)
    )
    worked = [s.action[1:-1] for s in exploration.steps if s.ok]
    truth = spec.state["ground_truth"]
    assert [c for turn in truth for c in turn] == worked[: len([c for turn in truth for c in turn])]
    assert len(spec.state["questions"]) == len(truth) and all(1 <= len(turn) <= 2 for turn in truth)
    assert spec.solution == tuple(a for turn in truth for a in (f"[{', '.join(turn)}]", "[]"))
    assert spec.task_id.startswith("multi_turn_base_coevolve")
    assert spec.state["initial_config"] == env.task(trajectory.task_id).initial_config
    assert SYNTH.verify(BfclEnv(), spec) is None


def test_verification_replays_under_bfcls_checker(env):
    parent = env.task("multi_turn_base_0")
    truth = [["cd(folder='document')", "mkdir(dir_name='drafts')"], ["cd(folder='drafts')"]]

    def spec(turns, name):
        state = {
            "involved_classes": list(parent.involved_classes),
            "initial_config": parent.initial_config,
            "questions": ["do it"] * len(turns),
            "ground_truth": turns,
        }
        solution = tuple(a for turn in turns for a in (f"[{', '.join(turn)}]", "[]"))
        return TaskSpec(f"multi_turn_base_coevolve{name}", "do it", state, solution, "bfcl")

    fresh = BfclEnv()
    assert SYNTH.verify(fresh, spec(truth, "ok")) is None
    failing = [truth[0], ["cd(folder='nowhere')"]]
    assert SYNTH.verify(fresh, spec(failing, "bad")) == "a reference call fails on replay"
    assert replay_failure(fresh, spec(failing, "bad")) is None  # the checker alone would pass it


def test_a_round_on_bfcl_adds_tasks_bfcls_checker_passes(experts, tmp_path):
    config = coevolve.CoEvolveConfig(max_signals=6, min_seen=10)
    pool = coevolve.TaskPool.open(str(tmp_path))
    report = coevolve.round(fake_history(experts), pool, BfclEnv, config, seed=0)
    assert report.signals["forgetting"] == 4 and report.signals["boundary"] == 3
    assert report.explored == 12 and report.added == len(pool) >= 6
    fresh = BfclEnv()
    for task in pool.tasks:
        assert replay_failure(fresh, task.spec) is None


def test_an_llm_action_sequence_becomes_one_turn_of_its_calls(env):
    actions = ["[cd(folder='document')]", "mkdir(dir_name='drafts')", "[ls()]"]
    spec = SYNTH.task_from_actions(env, "multi_turn_base_0", actions, "Make drafts and list.", min_steps=3)
    assert spec.state["questions"] == ["Make drafts and list."]
    assert spec.state["ground_truth"] == [["cd(folder='document')", "mkdir(dir_name='drafts')", "ls()"]]
    assert SYNTH.verify(BfclEnv(), spec) is None
    refused = SYNTH.task_from_actions(env, "multi_turn_base_0", ["[rm -rf]", *actions], "x", min_steps=3)
    assert refused == "an action is not a call list of the task's functions"
