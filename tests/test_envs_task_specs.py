"""Added tasks (`Environment.add_tasks` with `TaskSpec`s): each environment plays them under its own reward,
keeps its own tasks as they were, and refuses a spec it cannot play or an id already taken."""

import json

import pytest

from coevo_jax.envs import TaskSpec
from coevo_jax.envs.base import Environment
from coevo_jax.envs.bfcl import BfclEnv
from coevo_jax.envs.builtin import BuiltinEnv
from coevo_jax.envs.intercode_sql import InterCodeSqlEnv


def _replay(env: Environment, task_id: str, actions) -> tuple[float, bool]:
    env.reset(task_id)
    reward, done = 0.0, False
    for action in actions:
        _, reward, done, _ = env.step(action)
    return reward, done


def _json_round_trip(spec: TaskSpec) -> TaskSpec:
    return TaskSpec.from_json(json.loads(json.dumps(spec.to_json())))


def test_the_default_environment_accepts_no_added_task():
    class Bare(Environment):
        name = "bare"
        instruction = ""
        splits = tasks = max_steps = reset = step = expert_trajectories = lambda *a: None

    with pytest.raises(NotImplementedError, match="bare"):
        Bare().add_tasks([])


# -- built-in ----------------------------------------------------------------------------------------------


def _builtin_spec(env: BuiltinEnv, task_id: str = "coevolve/heat-pear") -> TaskSpec:
    start = env.task("heat/0016").start  # the pear is in the hallway, the stove in the kitchen
    return TaskSpec(
        task_id=task_id,
        instruction="Your task is to make the pear hot. You are in the hallway.",
        state={
            "world": start.to_json(),
            "subgoals": [[["holding", "pear"]], [["inside", "pear", "stove"]], [["hot", "pear"]]],
        },
        solution=("pick up pear", "go to kitchen", "put pear in stove", "activate stove"),
        env="builtin",
    )


def test_builtin_plays_an_added_task_to_one_and_keeps_its_own_tasks():
    env = BuiltinEnv()
    own_before = {split: env.tasks(split) for split in env.splits()}
    spec = _json_round_trip(_builtin_spec(env))
    env.add_tasks([spec])
    assert env.reset(spec.task_id) == spec.instruction
    assert _replay(env, spec.task_id, spec.solution[:2]) == (pytest.approx(1 / 3), False)
    assert _replay(env, spec.task_id, spec.solution) == (1.0, True)
    assert env.max_steps(spec.task_id) == 2 * 4 + 5  # the solution is the added task's expert
    assert [s.action for s in env.expert_steps(spec.task_id)] == list(spec.solution)
    assert {split: env.tasks(split) for split in env.splits()} == own_before  # in no split
    assert env.expert_steps("heat/0016")[0].action == "go to kitchen"  # own tasks still planned


def test_builtin_refuses_taken_ids_and_specs_it_cannot_play():
    env = BuiltinEnv()
    spec = _builtin_spec(env)
    env.add_tasks([spec, spec])  # an equal spec again: nothing
    other = TaskSpec(spec.task_id, "other", spec.state, spec.solution)
    with pytest.raises(ValueError, match="already added"):
        env.add_tasks([other])
    with pytest.raises(ValueError, match="own tasks"):
        env.add_tasks([_builtin_spec(env, task_id="heat/0016")])
    bad_world = dict(spec.state, world=dict(spec.state["world"], room="attic"))
    bad_condition = dict(spec.state, subgoals=[[["teleported", "pear"]]])
    for index, state in enumerate((bad_world, bad_condition, {"world": spec.state["world"]})):
        with pytest.raises(ValueError, match="builtin"):
            env.add_tasks([TaskSpec(f"bad/{index}", "x", state, spec.solution)])


# -- InterCode-SQL ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sql_env(cache):
    env = InterCodeSqlEnv(cache_root=cache)
    yield env
    env.close()


SINGERS = "SELECT Name FROM singer WHERE Age > 30 ORDER BY Name"


def test_sql_plays_an_added_question_scored_against_its_gold_query(sql_env):
    spec = TaskSpec(
        "coevolve_singers",
        "Which singers are older than 30?",
        {"db": "concert_singer", "gold": SINGERS},
        ("submit",),
    )
    sql_env.add_tasks([_json_round_trip(spec)])
    assert (
        sql_env.reset(spec.task_id) == "Database: concert_singer\nQuestion: Which singers are older than 30?"
    )
    assert _replay(sql_env, spec.task_id, [SINGERS, "submit"]) == (1.0, True)
    assert _replay(sql_env, spec.task_id, ["SELECT Name FROM singer", "submit"])[0] < 1.0
    assert sql_env.max_steps(spec.task_id) == 10
    assert sql_env.record("0")["db"] != "" and "coevolve_singers" not in sql_env.tasks("train")
    with pytest.raises(ValueError, match="unknown database"):
        sql_env.add_tasks([TaskSpec("coevolve_x", "q", {"db": "nowhere", "gold": SINGERS}, ("submit",))])
    with pytest.raises(ValueError, match="own tasks"):
        sql_env.add_tasks([TaskSpec("3", "q", {"db": "concert_singer", "gold": SINGERS}, ("submit",))])


def test_sql_run_with_a_reversed_scan_changes_only_an_unordered_result(sql_env):
    unordered = "SELECT Name FROM singer"
    forward, backward = (
        sql_env.run("concert_singer", unordered),
        sql_env.run("concert_singer", unordered, reverse_scan=True),
    )
    assert sorted(forward) == sorted(backward) and forward != backward
    assert sql_env.run("concert_singer", SINGERS) == sql_env.run("concert_singer", SINGERS, reverse_scan=True)
    assert sql_env.run("nowhere", SINGERS).startswith("Error executing query")
    assert ("singer",) in sql_env.run("concert_singer", "SHOW TABLES")  # answered as in an episode
    assert sql_env.run("concert_singer", "DESCRIBE singer")[0][:2] == ("Singer_ID", b"int")
    assert sql_env.run("concert_singer", "USE pets_1") is None and sql_env.run("pets_1", "SHOW TABLES")


# -- BFCL ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bfcl_env():
    env = BfclEnv()
    yield env
    env.close()


def _bfcl_spec(env: BfclEnv, task_id: str = "multi_turn_base_coevolve1") -> TaskSpec:
    parent = env.task("multi_turn_base_0")
    truth = [["cd(folder='document')", "mkdir(dir_name='drafts')"], ["ls()"]]
    return TaskSpec(
        task_id=task_id,
        instruction="Make a drafts folder in document, then list what is there.",
        state={
            "involved_classes": list(parent.involved_classes),
            "initial_config": parent.initial_config,
            "questions": ["Go to document and make a folder drafts.", "What is in this folder now?"],
            "ground_truth": truth,
        },
        solution=(f"[{', '.join(truth[0])}]", "[]", "[ls()]", "[]"),
        env="bfcl",
    )


def test_bfcl_plays_an_added_task_under_its_checker(bfcl_env):
    spec = _json_round_trip(_bfcl_spec(bfcl_env))
    bfcl_env.add_tasks([spec])
    text = bfcl_env.reset(spec.task_id)
    assert "cd(folder: str)" in text and text.endswith("User: Go to document and make a folder drafts.")
    assert _replay(bfcl_env, spec.task_id, spec.solution) == (1.0, True)
    wrong = ("[cd(folder='document'), mkdir(dir_name='other')]", "[]", "[ls()]", "[]")
    assert _replay(bfcl_env, spec.task_id, wrong) == (0.0, True)
    assert spec.task_id not in bfcl_env.tasks("train") + bfcl_env.tasks("test")
    assert len(bfcl_env.tasks("train")) == 150


def test_bfcl_refuses_an_id_without_its_category_and_a_malformed_state(bfcl_env):
    with pytest.raises(ValueError, match="category"):
        bfcl_env.add_tasks([_bfcl_spec(bfcl_env, task_id="coevolve_1")])
    spec = _bfcl_spec(bfcl_env, task_id="multi_turn_base_coevolve2")
    for state in (
        dict(spec.state, involved_classes=["NoSuchAPI"]),
        dict(spec.state, ground_truth=[["ls()"]]),
        dict(spec.state, questions=[]),
    ):
        with pytest.raises(ValueError, match="bfcl"):
            bfcl_env.add_tasks([TaskSpec(spec.task_id, spec.instruction, state, spec.solution)])
