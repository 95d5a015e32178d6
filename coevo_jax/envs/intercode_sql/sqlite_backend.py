"""InterCode-SQL's embedded backend: the agent's SQL answered by SQLite copies of the databases, as MySQL would.

`SHOW TABLES [LIKE ...]`, `SHOW DATABASES`, `DESCRIBE t` / `DESC t` / `SHOW COLUMNS FROM t` are answered from
the dump's catalogue exactly as InterCode's MySQL 8 server printed them; every other statement runs in SQLite
(`db` for how the copies keep MySQL's names, collation and row order; `mysql` for its functions) inside a
`sandbox` (read-only, time- and size-limited), with SQLite's most common error messages reworded as MySQL's.
What MySQL's ONLY_FULL_GROUP_BY refuses is refused first, from the catalogue's keys (`full_group_by`).
`reverse_scan` runs a statement with SQLite's `reverse_unordered_selects`, which shows whether a result's row
order is the table scan's.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from coevo_jax.envs.intercode_sql import mysql
from coevo_jax.envs.intercode_sql.db import Column
from coevo_jax.envs.intercode_sql.full_group_by import TableKeys, group_by_refusal
from coevo_jax.envs.intercode_sql.sandbox import SqlError, SqlSandbox
from coevo_jax.envs.intercode_sql.statements import (
    DESCRIBE,
    SHOW_DATABASES,
    SHOW_TABLES,
    SYSTEM_SCHEMAS,
    like_match,
    missing_table,
    mysql_error_message,
)


class SqliteBackend:
    """Answers statements on the SQLite copies in `db_dir`; one sandbox per (database, scan direction)."""

    name = "sqlite"

    def __init__(
        self,
        db_dir: Path,
        schema: dict[str, dict[str, list[Column]]],
        *,
        timeout_s: float,
        max_rows: int,
        max_result_bytes: int,
    ):
        self._db_dir, self._schema = db_dir, schema
        self.timeout_s, self.max_rows, self.max_result_bytes = timeout_s, max_rows, max_result_bytes
        self._sandboxes: dict[tuple[str, bool], SqlSandbox] = {}
        self._tables = {
            db: {t: table_keys(cols) for t, cols in tables.items()} for db, tables in schema.items()
        }

    def answer(
        self, db: str, statement: str, *, session: str = "episode", reverse_scan: bool = False
    ) -> list | str | None:
        """`statement` on database `db`: rows, None (no result set) or `Error executing query: ...`.

        Sessions hold no state here (`session` is the server backend's); `reverse_scan` is described above.
        """
        shown = SHOW_TABLES.match(statement)
        if shown:
            names = sorted(self._schema[db])
            if shown.group(1) is not None:
                names = [n for n in names if like_match(shown.group(1), n)]
            return [(name,) for name in names]
        if SHOW_DATABASES.match(statement):
            return [(name,) for name in sorted((*self._schema, *SYSTEM_SCHEMAS))]
        described = DESCRIBE.match(statement)
        if described:
            table = described.group(1).lower()
            if table not in self._schema[db]:
                return f"Error executing query: {missing_table(db, table)}"
            return [column.describe_row() for column in self._schema[db][table]]
        refusal = group_by_refusal(statement, self._tables.get(db, {}), db)
        if refusal is not None:
            return f"Error executing query: {refusal}"
        try:
            return self._sandbox(db, reverse_scan).execute(statement)
        except SqlError as error:
            return f"Error executing query: {mysql_error_message(str(error), db)}"

    def _sandbox(self, db: str, reverse_scan: bool) -> SqlSandbox:
        key = (db, reverse_scan)
        if key not in self._sandboxes:
            self._sandboxes[key] = SqlSandbox(
                self._db_dir / f"{db}.sqlite",
                timeout_s=self.timeout_s,
                max_rows=self.max_rows,
                max_result_bytes=self.max_result_bytes,
                prepare=_reverse_scan_prepare if reverse_scan else mysql.install,
            )
        return self._sandboxes[key]

    def end_session(self, session: str) -> None:
        """Nothing to end: a SQLite connection keeps no state between statements."""

    def close(self) -> None:
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()


def table_keys(columns: list[Column]) -> TableKeys:
    """A table's keys as the catalogue shows them: the primary key, and each NOT NULL column DESCRIBE marks
    unique (its first column: a wider unique key is taken as that column's, which can only admit more)."""
    primary = frozenset(c.name.lower() for c in columns if c.key == "PRI")
    unique = [frozenset({c.name.lower()}) for c in columns if c.key == "UNI" and not c.nullable]
    return TableKeys(tuple(c.name for c in columns), tuple(([primary] if primary else []) + unique))


def _reverse_scan_prepare(connection: sqlite3.Connection) -> None:
    mysql.install(connection)
    connection.execute("PRAGMA reverse_unordered_selects = ON")
