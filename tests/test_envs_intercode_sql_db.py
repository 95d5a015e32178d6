"""InterCode-SQL below the environment: the dump as SQLite (`db`), the sandbox, MySQL's collation and functions."""

import hashlib
import sqlite3
import time

import pytest

from coevo_jax.envs.intercode_sql import mysql
from coevo_jax.envs.intercode_sql.db import (
    DUMP_PATH,
    DumpFormatError,
    build_databases,
    parse_dump,
    parse_values,
)
from coevo_jax.envs.intercode_sql.mysql import install as install_mysql_compat
from coevo_jax.envs.intercode_sql.sandbox import QueryTimeout, SqlError, SqlSandbox, TruncatedRows, Watchdog


# -- the dump --------------------------------------------------------------------------------------------
def test_parse_values_reads_mysql_literals():
    text = r"(1,'it\'s',NULL,-2.5,'a''b'),(2,'line\nbreak','back\\slash',3e2,'')"
    assert parse_values(text) == [
        (1, "it's", None, -2.5, "a'b"),
        (2, "line\nbreak", "back\\slash", 300.0, ""),
    ]


def test_dump_converts_every_database_with_its_rows():
    text = DUMP_PATH.read_text()
    databases = parse_dump(text)
    assert len(databases) == 20 and sum(len(t) for t in databases.values()) == 81
    assert all(name == name.lower() for tables in databases.values() for name in tables)
    inserted, db = {}, None  # rows per (database, table), counted independently from the raw lines
    for line in text.splitlines():
        if line.startswith("USE `"):
            db = line.split("`")[1].lower()
        elif line.startswith("INSERT INTO"):
            inserted[db, line.split("`")[1].lower()] = line.count("),(") + 1
    for db, tables in databases.items():
        for name, table in tables.items():
            assert len(table.rows) == inserted.get((db, name), 0), (db, name)
    assert all(not t.rows for t in databases["wta_1"].values())  # empty in InterCode's dump too


def test_databases_are_built_once_and_read_only(cache):
    first = build_databases(root=cache)
    assert build_databases(root=cache) == first
    files = sorted(first.glob("*.sqlite"))
    assert len(files) == 20 and all((f.stat().st_mode & 0o222) == 0 for f in files)


def test_a_malformed_dump_names_the_line(tmp_path):
    bad = "USE `x`;\nCREATE TABLE `t` (\n  this is not a column,\n) ENGINE=InnoDB;\n"
    with pytest.raises(DumpFormatError, match=r"dump.sql:3: unrecognised column definition"):
        parse_dump(bad, source=str(tmp_path / "dump.sql"))


# -- the sandbox --------------------------------------------------------------------------------------------
@pytest.fixture
def sandbox(cache):
    box = SqlSandbox(
        build_databases(root=cache) / "world_1.sqlite", timeout_s=1.0, prepare=install_mysql_compat
    )
    yield box
    box.close()


def test_hostile_sql_changes_nothing_and_reads_no_outside_file(sandbox, tmp_path):
    path = sandbox.path
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    outside = tmp_path / "secret.db"
    sqlite3.connect(outside).execute("CREATE TABLE s(x)").connection.commit()
    hostile = [
        "DELETE FROM city",
        "UPDATE city SET Name = 'x'",
        "INSERT INTO city VALUES (0, 'x', 'y', 'z', 1)",
        "DROP TABLE city",
        "ALTER TABLE city ADD COLUMN x INT",
        "CREATE TABLE t(x)",
        "CREATE TEMP TABLE t(x)",
        f"ATTACH '{outside}' AS other",
        "PRAGMA writable_schema = ON",
        "PRAGMA query_only = OFF",
        f"VACUUM INTO '{tmp_path / 'copy.db'}'",
        "SELECT load_extension('/lib/x86_64-linux-gnu/libc.so.6')",
        "BEGIN",
        "SELECT 1; DELETE FROM city",
        "REINDEX",
    ]
    for sql in hostile:
        with pytest.raises(SqlError):
            sandbox.execute(sql)
    assert not (tmp_path / "copy.db").exists()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sandbox.execute("SELECT count(*) FROM city") == [(4079,)]


def test_runaway_queries_are_stopped(sandbox):
    with pytest.raises(QueryTimeout):
        sandbox.execute(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
        )
    few_rows = SqlSandbox(sandbox.path, max_rows=1000, prepare=install_mysql_compat)
    with pytest.raises(SqlError, match="more than 1000 rows"):
        few_rows.execute("SELECT a.ID FROM city a, city b")
    few_rows.close()
    big = sandbox.execute("SELECT * FROM city a, city b")  # 16 million rows: fetching stops at 1 MB
    assert isinstance(big, TruncatedRows) and big.max_result_bytes == 1_000_000 and 10_000 < len(big) < 30_000
    with pytest.raises(SqlError, match="too big"):
        sandbox.execute("SELECT zeroblob(100000000)")
    assert sandbox.execute("SELECT Name FROM city WHERE ID = 1") == [("Kabul",)]


def test_mysql_collation_and_functions(sandbox):
    assert sandbox.execute("SELECT count(*) FROM city WHERE Name = 'KABUL  '") == [(1,)]
    assert sandbox.execute("SELECT CONCAT(Name, '-', CountryCode) FROM city WHERE ID = 1") == [("Kabul-AFG",)]
    assert sandbox.execute("SELECT count(*) FROM country WHERE GovernmentForm REGEXP '^republic$'") == [
        (122,)
    ]
    assert sandbox.execute("SELECT YEAR('2014-05-06'), MONTH('2014-05-06'), IF(1 > 2, 'a', 'b')") == [
        (2014, 5, "b")
    ]
    # MySQL's FORMAT, not SQLite's printf alias: rounding half away from zero, thousands separated.
    assert sandbox.execute("SELECT FORMAT(1234567.891, 2), FORMAT(-2.5, 0), FORMAT(0.125, 2, 'de_DE')") == [
        ("1,234,567.89", "-3", "0.13")
    ]
    assert sandbox.execute("SELECT FORMAT(AVG(LifeExpectancy), 2) FROM country") == [("66.49",)]


def test_the_collation_cache_keeps_only_short_strings():
    mysql._fold_cached.cache_clear()
    long_strings = [("x" * 1_000_000) + str(i) for i in range(3)]
    assert mysql.mysql_ci_compare(long_strings[0], long_strings[1].upper()) == -1
    assert mysql.mysql_ci_compare("Ábc  ", "abc") == 0
    info = mysql._fold_cached.cache_info()
    assert info.currsize == 2 and info.maxsize == mysql.FOLD_CACHE_ENTRIES


def test_the_watchdog_interrupts_at_its_deadline_and_never_after_stop():
    connection = sqlite3.connect(
        ":memory:", check_same_thread=False
    )  # no progress handler: only the watchdog
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    start = time.monotonic()
    watchdog = Watchdog(connection.interrupt, 0.3)
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        connection.execute(endless)
    watchdog.stop()
    assert 0.25 < time.monotonic() - start < 2.0
    Watchdog(connection.interrupt, 0.2).stop()
    time.sleep(0.3)
    counted = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10) SELECT max(x) FROM c"
    )
    assert connection.execute(counted).fetchall() == [(10,)]
