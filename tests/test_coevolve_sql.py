"""InterCode-SQL's CoEvolve synthesizer: templates, where each signal sends the exploration, verification by
execution (rows, row order, test answers, replay), and a whole round on fake rollouts."""

import random

import pytest
from coevolve_fixtures import fake_history

from coevo_jax import coevolve
from coevo_jax.coevolve.patterns import sql_statement_patterns
from coevo_jax.coevolve.signals import Signal
from coevo_jax.coevolve.sql_synthesis import SqlSynthesizer
from coevo_jax.coevolve.sql_templates import TEMPLATES, Schema, tables_of
from coevo_jax.coevolve.synthesis import replay_failure
from coevo_jax.envs.base import TaskSpec
from coevo_jax.envs.intercode_sql import InterCodeSqlEnv
from coevo_jax.envs.intercode_sql.env import UNSEEN_DATABASES
from coevo_jax.envs.intercode_sql.experts import load_episodes, replay_experts

SYNTH = SqlSynthesizer()


@pytest.fixture(scope="module")
def env(cache):
    env = InterCodeSqlEnv(cache_root=cache)
    yield env
    env.close()


@pytest.fixture(scope="module")
def experts(env):
    wanted = set(env.tasks("train"))
    episodes = [e for e in load_episodes() if e.task_id in wanted][:40]
    return replay_experts(env, "train", episodes)[0][:16]


def explore(env, signal, seed):
    exploration = SYNTH.explore(env, signal, random.Random(seed), steps=16, exploration_id=str(seed))
    return exploration, SYNTH.abstract(env, exploration, min_steps=3)


def test_every_template_writes_the_clause_kinds_it_declares(env):
    schema = Schema()
    for table in ("singer", "concert", "singer_in_concert", "stadium"):
        schema.tables[table] = [
            (r[0], r[1].decode().startswith("int")) for r in env.run("concert_singer", f"DESCRIBE {table}")
        ]
        for column, _ in schema.tables[table]:
            schema.values[(table, column)] = [
                r[0] for r in env.run("concert_singer", f"SELECT DISTINCT {column} FROM {table} LIMIT 6")
            ]
    built = 0
    for template in TEMPLATES:
        for seed in range(5):
            found = template.build(schema, random.Random(seed))
            if found is None:
                continue
            sql, question = found
            assert sql_statement_patterns(sql) == template.kinds, (template.name, sql)
            assert isinstance(env.run("concert_singer", sql), list), sql
            assert question.endswith(("?", "."))
            built += 1
    assert built >= 5 * len(TEMPLATES) - 5


def test_each_signal_sends_the_exploration_where_it_points(env, experts):
    for seed, trajectory in enumerate(experts[:8]):
        record = env.record(trajectory.task_id)
        forgotten, _ = explore(env, Signal("forgetting", trajectory.task_id, 1, (trajectory,)), seed)
        assert forgotten.context["db"] == record["db"].lower()
        assert forgotten.steps[0].action == "SHOW TABLES"
        described = [s.action.split()[1] for s in forgotten.steps if s.action.startswith("DESCRIBE")]
        assert described[: len(tables_of(record["gold"]))] == tables_of(record["gold"])[:3]
        boundary, _ = explore(env, Signal("boundary", trajectory.task_id, 1, (trajectory,)), seed)
        assert boundary.context["db"] not in (record["db"].lower(), *UNSEEN_DATABASES)
        rare, spec = explore(
            env, Signal("rare", trajectory.task_id, 1, (trajectory,), patterns=("between",)), seed
        )
        assert all("BETWEEN" in q["sql"] for q in rare.context["queries"])
        assert isinstance(spec, str) or "between" in sql_statement_patterns(spec.state["gold"])
    unguided = {explore(env, None, seed)[0].context["db"] for seed in range(12)}
    assert len(unguided) >= 5 and not unguided & set(UNSEEN_DATABASES)


def _spec(gold, db="concert_singer"):
    return TaskSpec(
        f"coevolve_{abs(hash(gold))}",
        "q?",
        {"db": db, "gold": gold},
        ("DESCRIBE singer", gold, "submit"),
        "intercode_sql",
    )


def test_verification_needs_rows_in_an_order_the_scan_does_not_decide(env):
    assert SYNTH.verify(env, _spec("SELECT Name FROM singer ORDER BY Name")) is None
    assert SYNTH.verify(env, _spec("SELECT Name FROM singer")) == "row order depends on the scan"
    assert (
        SYNTH.verify(env, _spec("SELECT Name FROM singer WHERE Age > 1000 ORDER BY Name")) == "empty result"
    )
    assert SYNTH.verify(env, _spec("SELECT Nme FROM singer")) == "reference query fails"
    test_task = next(t for t in env.tasks("test_seen") if env.gold_rows(t))
    record = env.record(test_task)
    assert SYNTH.verify(env, _spec(record["gold"], record["db"])) == "answer of a test task"
    broken = _spec("SELECT Name FROM singer ORDER BY Name")
    broken = TaskSpec(broken.task_id + "b", "q?", broken.state, ("SELECT Age FROM singer", "submit"))
    assert SYNTH.verify(env, broken) == replay_failure(env, broken) == "replay scores below 1"


def test_a_round_on_sql_adds_playable_questions(experts, cache, tmp_path):
    records = fake_history(experts)
    config = coevolve.CoEvolveConfig(max_signals=6, min_seen=10)
    pool = coevolve.TaskPool.open(str(tmp_path))
    report = coevolve.round(records, pool, lambda: InterCodeSqlEnv(cache_root=cache), config, seed=0)
    assert report.signals["forgetting"] == 6 and report.signals["boundary"] == 4
    assert report.explored == 12 and report.added == len(pool) >= 8
    fresh = InterCodeSqlEnv(cache_root=cache)
    for task in pool.tasks:
        assert replay_failure(fresh, task.spec) is None
        assert task.spec.solution[-1] == "submit" and task.spec.solution[-2] == task.spec.state["gold"]
    fresh.close()


def test_an_llm_action_sequence_becomes_a_question_with_its_last_query_as_gold(env, cache):
    parent = next(t for t in env.tasks("train") if env.record(t)["db"] == "concert_singer")
    actions = ["SHOW TABLES", "DESCRIBE singer", "SELECT Name FROM singer ORDER BY Name;", "submit"]
    spec = SYNTH.task_from_actions(env, parent, actions, "Name every singer.", min_steps=3)
    assert spec.state == {"db": "concert_singer", "gold": "SELECT Name FROM singer ORDER BY Name"}
    assert spec.solution == ("SHOW TABLES", "DESCRIBE singer", spec.state["gold"], "submit")
    assert SYNTH.verify(InterCodeSqlEnv(cache_root=cache), spec) is None
    assert (
        SYNTH.task_from_actions(env, parent, ["SHOW TABLES"] * 3, "q", min_steps=3)
        == "no query in the action sequence"
    )
    assert SYNTH.task_from_actions(env, parent, actions, " ", min_steps=3) == "no question"
