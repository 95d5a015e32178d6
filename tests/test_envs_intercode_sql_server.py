"""InterCode-SQL's server backend: MySQL 8's ways on MariaDB (unsorted GROUP BY, messages, repeatable ties,
row values), and the per-statement guarantees a server needs (its own time limit kept when the agent lifts it,
results read row by row, a dropped connection reopened, a fresh session per episode).

Tests that need the server skip without one, except under CI (`mariadb_fixtures`); the hostile actions and
writes run on both backends in `test_envs_intercode_sql.py`.
"""

import threading
import time

import pytest
from mariadb_fixtures import require_backend

from coevo_jax.envs.intercode_sql.db import build_databases, load_schema
from coevo_jax.envs.intercode_sql.env import InterCodeSqlEnv
from coevo_jax.envs.intercode_sql.experts import load_episodes
from coevo_jax.envs.intercode_sql.group_by import unsorted_group_by
from coevo_jax.envs.intercode_sql.sandbox import TruncatedRows
from coevo_jax.envs.intercode_sql.server import (
    MYSQL_SOCKET_ENV,
    MYSQL_SQL_MODE,
    SOCKET_ENV,
    SQL_MODE,
    MariaDbBackend,
    MySqlBackend,
    ServerSession,
    ServerUnavailable,
    default_socket,
)
from coevo_jax.envs.intercode_sql.sqlite_backend import table_keys
from coevo_jax.envs.intercode_sql.statements import mariadb_error_message


# -- without a server ------------------------------------------------------------------------------------------
def test_group_by_gets_order_by_null_where_nothing_orders_it():
    cases = {
        "SELECT a, count(*) FROM t GROUP BY a": "SELECT a, count(*) FROM t GROUP BY a ORDER BY NULL",
        "select a from t group by a limit 1;": "select a from t group by a ORDER BY NULL limit 1;",
        "SELECT a FROM t GROUP BY a HAVING count(*) > 1 -- note": (
            "SELECT a FROM t GROUP BY a HAVING count(*) > 1 ORDER BY NULL -- note"
        ),
        "SELECT * FROM (SELECT a FROM t GROUP BY a) x WHERE b IN (SELECT c FROM u GROUP BY c)": (
            "SELECT * FROM (SELECT a FROM t GROUP BY a ORDER BY NULL) x "
            "WHERE b IN (SELECT c FROM u GROUP BY c ORDER BY NULL)"
        ),
    }
    for sql, expected in cases.items():
        assert unsorted_group_by(sql) == expected
    unchanged = (
        "SELECT a FROM t GROUP BY a ORDER BY count(*) DESC LIMIT 1",
        "SELECT a FROM t GROUP BY a UNION SELECT b FROM u",  # an ORDER BY there would order the union
        "SELECT 'GROUP BY', `group by` FROM t /* GROUP BY */",
        "SELECT GROUP_CONCAT(x ORDER BY y) FROM t",
        "SELECT a FROM t ORDER BY a",
    )
    for sql in unchanged:
        assert unsorted_group_by(sql) == sql
    long = "SELECT a FROM t GROUP BY a" + " AND (b)" * 20_000
    start = time.monotonic()
    assert unsorted_group_by(long).endswith("ORDER BY NULL") and time.monotonic() - start < 2.0


def test_mariadb_messages_read_as_mysqls():
    assert mariadb_error_message("Unknown column 'x' in 'SELECT'") == "Unknown column 'x' in 'field list'"
    assert mariadb_error_message("Unknown column 'a.x' in 'ON'") == "Unknown column 'a.x' in 'on clause'"
    assert (
        mariadb_error_message("Column 'id' in WHERE is ambiguous")
        == "Column 'id' in where clause is ambiguous"
    )
    assert mariadb_error_message(
        "execute command denied to user 'coevo_reader'@'localhost' for routine 'pets_1.printf'"
    ) == ("FUNCTION pets_1.printf does not exist")
    assert "MySQL server version" in mariadb_error_message(
        "You have an error in your SQL syntax; check the manual that corresponds to your MariaDB server version"
    )
    assert mariadb_error_message("Unknown column 'x' in 'ELSEWHERE'") == "Unknown column 'x' in 'ELSEWHERE'"


def test_without_a_server_the_error_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path / "elsewhere.sock"))
    assert default_socket() == tmp_path / "elsewhere.sock"
    with pytest.raises(ServerUnavailable, match=r"elsewhere\.sock.*bash launch/mariadb\.sh start"):
        MariaDbBackend(timeout_s=1.0, max_rows=10, max_result_bytes=100)
    monkeypatch.delenv(SOCKET_ENV)
    monkeypatch.setenv("COEVO_JAX_CACHE", str(tmp_path))
    assert default_socket() == tmp_path / "mariadb" / "mysqld.sock"  # where launch/mariadb.sh puts it


def test_a_mysql_server_is_found_and_missed_the_same_way(tmp_path, monkeypatch):
    monkeypatch.setenv(MYSQL_SOCKET_ENV, str(tmp_path / "mine.sock"))
    assert default_socket("mysql") == tmp_path / "mine.sock"
    with pytest.raises(ServerUnavailable, match=r"no MySQL server .*mine\.sock.*bash launch/mysql\.sh start"):
        InterCodeSqlEnv(backend="mysql")
    monkeypatch.delenv(MYSQL_SOCKET_ENV)
    monkeypatch.setenv("COEVO_JAX_CACHE", str(tmp_path))
    assert default_socket("mysql") == tmp_path / "mysql" / "mysqld.sock"  # where launch/mysql.sh puts it


def test_sessions_set_each_servers_own_limit_and_mode():
    """MariaDB: MySQL 8's sql_mode less ONLY_FULL_GROUP_BY (decided by full_group_by), seconds, temporary
    tables on disk; MySQL: its own default sql_mode with ONLY_FULL_GROUP_BY, milliseconds."""
    limits = dict(user="u", timeout_s=1.5, max_rows=10, max_result_bytes=100, killer=None)
    mariadb = ServerSession(default_socket(), **limits)._session_settings()
    assert mariadb == (
        "SET SESSION max_statement_time = %s, sql_mode = %s, tmp_memory_table_size = 0",
        (1.5, SQL_MODE),
    )
    mysql = ServerSession(default_socket("mysql"), **limits, server="mysql")._session_settings()
    assert mysql == ("SET SESSION max_execution_time = %s, sql_mode = %s", (1500, MYSQL_SQL_MODE))
    assert MYSQL_SQL_MODE.split(",")[0] == "ONLY_FULL_GROUP_BY" and "ONLY_FULL_GROUP_BY" not in SQL_MODE


class _Recorder:
    def __init__(self):
        self.statements = []

    def execute(self, db, sql):
        self.statements.append((db, sql))
        return [("row",)]


def test_a_mysql_server_gets_the_statement_as_it_is():
    """No GROUP BY refusal of our own and no ORDER BY NULL added: MySQL decides both itself."""
    backend = MySqlBackend.__new__(MySqlBackend)  # no connection needed to see what would be sent
    runner = _Recorder()
    statement = "SELECT name, count(*) FROM singer GROUP BY country"  # MySQL refuses it; not our check here
    assert backend._run(runner, "concert_singer", statement) == [("row",)]
    assert runner.statements == [("concert_singer", statement)]
    mariadb = MariaDbBackend.__new__(MariaDbBackend)
    mariadb._tables = {"concert_singer": {}}
    grouped = "SELECT country, count(*) FROM singer GROUP BY country"
    mariadb._run(runner, "concert_singer", grouped)
    assert (
        runner.statements[-1] == ("concert_singer", unsorted_group_by(grouped)) != ("concert_singer", grouped)
    )


# -- on the server -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server_env(cache):
    require_backend("mariadb")
    environment = InterCodeSqlEnv(cache_root=cache, backend="mariadb", query_timeout_s=1.0)
    yield environment
    environment.close()


def test_the_time_limit_holds_when_the_agent_lifts_its_own(server_env):
    server_env.reset("0")
    assert server_env.step("SET SESSION max_statement_time = 0")[0] == "None"
    start = time.monotonic()
    observation = server_env.step("SELECT SLEEP(5)")[0]
    assert time.monotonic() - start < 2.5  # the watchdog's KILL QUERY, 0.5 s after the limit
    assert observation.endswith("maximum statement execution time exceeded")
    assert server_env.step("SELECT count(*) FROM people")[0] == "[(7,)]"


def test_a_dropped_connection_is_reopened_and_the_action_answered(server_env):
    """Killed between statements, or its statement interrupted by another session of the same account."""
    import pymysql

    killer = pymysql.connect(unix_socket=str(default_socket()), user="coevo_reader", autocommit=True)

    def kill(what: str, connection_id: int, after_s: float = 0.0) -> threading.Timer:
        def run():
            with killer.cursor() as cursor:
                cursor.execute(f"KILL {what} {connection_id}")

        timer = threading.Timer(after_s, run)
        timer.start()
        return timer

    server_env.reset("0")
    [(connection_id,)] = server_env.execute("SELECT CONNECTION_ID()")
    kill("CONNECTION", connection_id).join()
    assert server_env.step("SELECT count(*) FROM people")[0] == "[(7,)]"
    [(reconnected,)] = server_env.execute("SELECT CONNECTION_ID()")
    assert reconnected != connection_id
    interrupting = kill("QUERY", reconnected, after_s=0.2)
    assert server_env.step("SELECT SLEEP(0.5), count(*) FROM people")[0] == "[(0, 7)]"  # run again
    interrupting.join()
    killer.close()


def test_results_are_read_row_by_row_and_cut_at_their_size(server_env):
    backend = MariaDbBackend(timeout_s=5.0, max_rows=100_000, max_result_bytes=1_000_000)
    start = time.monotonic()
    rows = backend.answer("world_1", "SELECT * FROM city a, city b")  # 16.6 million rows
    assert isinstance(rows, TruncatedRows) and 10_000 < len(rows) < 30_000
    assert time.monotonic() - start < 3.0
    few = MariaDbBackend(timeout_s=5.0, max_rows=1000, max_result_bytes=1_000_000)
    assert few.answer("world_1", "SELECT a.ID FROM city a, city b") == (
        "Error executing query: the result has more than 1000 rows"
    )
    assert few.answer("world_1", "SELECT Name FROM city WHERE ID = 1") == [("Kabul",)]
    assert backend.answer("world_1", "SELECT Name FROM city WHERE ID = 1") == [("Kabul",)]
    backend.close()
    few.close()


def test_each_episode_has_a_fresh_session(server_env):
    server_env.reset("0")
    server_env.step("SET @seen = 1")
    server_env.step("SET SESSION sql_mode = ''")
    assert server_env.step("SELECT @seen")[0] == "[(1,)]"
    server_env.reset("0")
    assert server_env.step("SELECT @seen")[0] == "[(None,)]"
    assert server_env.step("SELECT @@sql_mode")[0] == f"[('{SQL_MODE}',)]"


def test_rows_print_as_intercodes_mysql_printed_them(server_env):
    """GROUP BY unsorted, DECIMAL and DATETIME values as InterCode's MySQL client gave them."""
    server_env.reset("145")
    grades = "SELECT grade, COUNT(*) as num_high_schoolers FROM highschooler GROUP BY grade"
    assert server_env.step(grades)[0] == "[(12, 4), (10, 4), (11, 4), (9, 4)]"  # InterCode's observation
    assert server_env.step(grades + " WITH ROLLUP")[0].endswith("(None, 16)]")  # kept as written
    typed = same = 0
    for episode in load_episodes():
        for action, observation in zip(episode.actions, episode.observations, strict=True):
            if "Decimal(" in observation or "datetime." in observation:
                server_env.reset(episode.task_id)
                typed += 1
                same += server_env.step(action)[0] == observation
    assert typed == 162 and same >= 150  # measured 154; the rest are rows in another order


def test_ties_are_broken_the_same_way_each_time(server_env):
    gold = server_env.record("100")["gold"]  # ORDER BY count(*) LIMIT 1, with ties
    answers = set()
    for _ in range(5):
        server_env.reset("100")
        answers.add(server_env.step(gold)[0])
    assert len(answers) == 1


def test_row_order_checks_use_the_sqlite_copies(server_env):
    assert server_env.scan_decides_order("concert_singer", "SELECT Name FROM singer")
    assert not server_env.scan_decides_order("concert_singer", "SELECT Name FROM singer ORDER BY Name")
    with pytest.raises(ValueError, match="reverse_scan is SQLite's"):
        server_env.run("concert_singer", "SELECT Name FROM singer", reverse_scan=True)
    assert server_env.run("concert_singer", "DESCRIBE singer")[0][:2] == ("Singer_ID", "int(11)")


def test_mysqls_group_by_refusals_are_the_servers_too(server_env, cache):
    """The server answers what MySQL's ONLY_FULL_GROUP_BY refuses only with MySQL's refusal (`full_group_by`),
    from keys it reads from its own catalogue: the same columns and primary keys as the dump's."""
    server_env.reset("710")  # its gold groups by country and selects id: MySQL refused it, so no gold rows
    assert server_env.gold_rows("710") == []
    observation = server_env.step("SELECT id FROM tv_channel GROUP BY country")[0]
    assert observation.startswith("Error executing query: Expression #1 of SELECT list is not in GROUP BY")
    assert server_env.step("SELECT id, count(*) FROM tv_channel GROUP BY id LIMIT 1")[0].startswith("[(")
    backend = server_env._backend
    schema = load_schema(build_databases(root=cache))
    for db, tables in schema.items():
        served = backend.tables(db)
        assert served.keys() == tables.keys(), db
        for name, columns in tables.items():
            ours = table_keys(columns)
            assert served[name].columns == ours.columns, (db, name)
            primary = [c.name.lower() for c in columns if c.key == "PRI"]
            assert not primary or frozenset(primary) in served[name].keys, (db, name)
