"""MySQL 8's ONLY_FULL_GROUP_BY refusals (`full_group_by`): against every statement of InterCode's recorded
GPT-4 episodes and every gold query, and on small cases of MySQL's functional-dependence rules."""

import pytest

from coevo_jax.envs.intercode_sql.db import build_databases, load_schema
from coevo_jax.envs.intercode_sql.env import InterCodeSqlEnv
from coevo_jax.envs.intercode_sql.experts import load_episodes
from coevo_jax.envs.intercode_sql.full_group_by import TableKeys, group_by_refusal
from coevo_jax.envs.intercode_sql.server import tables_with_keys
from coevo_jax.envs.intercode_sql.sqlite_backend import table_keys

REFUSED = "this is incompatible with sql_mode=only_full_group_by"

# t: primary key id; u: composite primary key (a, b), unique NOT NULL code, unique nullable tag
TABLES = {
    "t": TableKeys(("id", "Name", "Kind", "u_a"), (frozenset({"id"}),)),
    "u": TableKeys(
        ("a", "b", "Code", "Tag", "Note"),
        (frozenset({"a", "b"}), frozenset({"code"})),
    ),
}


def refusal(sql):
    return group_by_refusal(sql, TABLES, "db")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT id, Name FROM t GROUP BY id",  # the primary key determines the row
        "SELECT t.Name, count(*) FROM t JOIN u ON t.u_a = u.a GROUP BY t.id",
        "SELECT x.Name FROM t AS x GROUP BY x.ID",  # names in any case, through an alias
        "SELECT Note FROM u GROUP BY a, b",  # the whole composite key
        "SELECT Note, Tag FROM u GROUP BY Code",  # a unique key over NOT NULL columns
        "SELECT u.Note FROM t JOIN u ON u.a = t.u_a AND u.b = t.id GROUP BY t.u_a, t.id",  # equalities
        "SELECT Kind, count(*) FROM t WHERE Kind = 'x'",  # equal to a constant
        "SELECT Kind, count(*) FROM t GROUP BY Kind ORDER BY count(*) DESC LIMIT 1",
        "SELECT Kind AS k, count(*) AS n FROM t GROUP BY Kind ORDER BY n, k",  # ORDER BY select aliases
        "SELECT upper(Kind), count(*) FROM t GROUP BY upper(Kind)",  # the grouped expression itself
        "SELECT Kind FROM t GROUP BY 1",
        "SELECT Name FROM t WHERE id IN (SELECT a FROM u GROUP BY a HAVING count(*) > 1)",
        "SELECT Name FROM t",  # not aggregated
        "SELECT count(*) FROM (SELECT Kind FROM t GROUP BY Kind) AS k",
        "SELECT Kind, (SELECT max(Note) FROM u WHERE u.a = t.id) FROM t GROUP BY Kind, id",
    ],
)
def test_what_mysql_answers_is_answered(sql):
    assert refusal(sql) is None


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "SELECT Name, Kind FROM t GROUP BY Kind",
            "Expression #1 of SELECT list is not in GROUP BY clause and contains nonaggregated column "
            "'db.t.Name' which is not functionally dependent on columns in GROUP BY clause; " + REFUSED,
        ),
        (
            "SELECT min(id), kind FROM T",
            "In aggregated query without GROUP BY, expression #2 of SELECT list contains nonaggregated column "
            "'db.t.Kind'; " + REFUSED,
        ),
        (
            "SELECT Note FROM u GROUP BY a",  # part of the key
            "Expression #1 of SELECT list is not in GROUP BY clause and contains nonaggregated column "
            "'db.u.Note' which is not functionally dependent on columns in GROUP BY clause; " + REFUSED,
        ),
        (
            "SELECT Note FROM u GROUP BY Tag",  # a unique key over a nullable column determines nothing
            "Expression #1 of SELECT list is not in GROUP BY clause and contains nonaggregated column "
            "'db.u.Note' which is not functionally dependent on columns in GROUP BY clause; " + REFUSED,
        ),
        (
            "SELECT Kind, count(*) FROM t GROUP BY Kind ORDER BY Name",
            "Expression #1 of ORDER BY clause is not in GROUP BY clause and contains nonaggregated column "
            "'db.t.Name' which is not functionally dependent on columns in GROUP BY clause; " + REFUSED,
        ),
        (
            "SELECT Name FROM t WHERE id = (SELECT a FROM u AS v GROUP BY b LIMIT 1)",  # in a subquery
            "Expression #1 of SELECT list is not in GROUP BY clause and contains nonaggregated column "
            "'db.v.a' which is not functionally dependent on columns in GROUP BY clause; " + REFUSED,
        ),
    ],
)
def test_what_mysql_refuses_is_refused_with_its_message(sql, message):
    assert refusal(sql) == message


@pytest.mark.parametrize(
    "sql",
    [
        "WITH c AS (SELECT Kind FROM t) SELECT Kind, count(*) FROM c",  # a CTE
        "SELECT Name, Kind FROM t GROUP BY Kind WITH ROLLUP",
        "SELECT Name, rank() OVER (ORDER BY id), count(*) FROM t GROUP BY Kind",  # window functions
        "SELECT Missing, count(*) FROM t GROUP BY Kind",  # MySQL's "Unknown column" comes first
        "SELECT * FROM t GROUP BY Kind",
        "SELECT Name FROM other.t GROUP BY Kind",  # another database's table
        "SELECT Name FROM t NATURAL JOIN u GROUP BY Kind",
        "SELECT Name, count(*) FROM (t) GROUP BY Kind (",  # unbalanced
        "SELECT Name, count(" + "(" * 100_000 + "id" + ")" * 100_000 + ") FROM t GROUP BY Kind",  # too deep
    ],
)
def test_what_the_reading_does_not_model_is_left_to_the_server(sql):
    assert refusal(sql) is None


def test_keys_from_the_server_catalogue_and_the_dump_catalogue(tables_by_db):
    columns = [("T", "id", "NO"), ("T", "code", "NO"), ("T", "tag", "YES"), ("T", "x", "YES")]
    keys = [("T", "PRIMARY", "id"), ("T", "c", "code"), ("T", "g", "tag")]
    assert tables_with_keys(columns, keys) == {
        "t": TableKeys(("id", "code", "tag", "x"), (frozenset({"id"}), frozenset({"code"})))
    }
    assert tables_by_db["flight_2"]["flights"].keys == (frozenset({"airline", "flightno"}),)


@pytest.fixture(scope="module")
def tables_by_db(cache):
    schema = load_schema(build_databases(root=cache))
    return {db: {t: table_keys(cols) for t, cols in tables.items()} for db, tables in schema.items()}


def test_the_recorded_refusals_and_only_those(tables_by_db, cache):
    """Every GPT-4 action of InterCode's 1,034 episodes: refused exactly where InterCode's MySQL refused it
    for ONLY_FULL_GROUP_BY (8 actions), with MySQL's message word for word."""
    env = InterCodeSqlEnv(cache_root=cache)
    refused = 0
    for episode in load_episodes():
        db = env.record(episode.task_id)["db"].lower()
        for action, observation in zip(episode.actions, episode.observations, strict=True):
            ours = group_by_refusal(action, tables_by_db[db], db)
            if "only_full_group_by" in observation:
                assert observation == f"Error executing query: {ours}", (episode.task_id, action)
                refused += 1
            else:
                assert ours is None, (episode.task_id, action, ours)
    assert refused == 8
    env.close()


def test_refused_gold_queries_agree_with_the_recorded_rewards(tables_by_db, cache):
    """A gold query MySQL refused has no rows, so InterCode scored only empty outputs above 0 on its task."""
    env = InterCodeSqlEnv(cache_root=cache)
    refused = set()
    for episode in load_episodes():
        record = env.record(episode.task_id)
        db = record["db"].lower()
        if group_by_refusal(record["gold"], tables_by_db[db], db) is not None:
            refused.add(episode.task_id)
            for observation, reward in zip(episode.observations, episode.rewards, strict=True):
                assert reward == 0.0 or observation == "[]", (episode.task_id, observation, reward)
    assert len(refused) == 11
    env.close()
