"""A read-only, time-limited SQLite connection for SQL written by an agent.

Layers, each enough on its own against writes:
- the file is opened read-only (`mode=ro` URI; the built files are also mode 0444) with `query_only` on;
- an authorizer allows only reading: SELECT, column reads, functions (minus a deny-list of those that touch
  files or load code) and recursive CTEs; ATTACH, PRAGMA, VACUUM, writes, schema changes and transactions
  are refused before they run;
- extension loading stays disabled, and `SQLITE_LIMIT_ATTACHED` is 0.
Resources are bounded too: a progress handler aborts a statement after `timeout_s` (fetching included),
results over `max_rows` rows are refused, and string/blob sizes are capped.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}
_DENIED_FUNCTIONS = {
    "load_extension",
    "fts3_tokenizer",
    "readfile",
    "writefile",
    "edit",
    "sqlite_dbpage",
    "zipfile",
    "sqlar_compress",
    "sqlar_uncompress",
}
_PROGRESS_EVERY = 2_000  # SQLite VM instructions between deadline checks


class SqlError(Exception):
    """A statement failed; the message is what the agent is shown after "Error executing query: "."""


class QueryTimeout(SqlError):
    """The statement ran past the sandbox's time limit."""


class SqlSandbox:
    """Runs one statement at a time against one SQLite file, read-only, within time and size limits."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = 5.0,
        max_rows: int = 100_000,
        max_value_bytes: int = 1_000_000,
        prepare: Callable[[sqlite3.Connection], None] | None = None,
    ):
        """`prepare` registers collations and functions before the authorizer locks the connection."""
        self.path, self.timeout_s, self.max_rows = Path(path), timeout_s, max_rows
        if not self.path.is_file():
            raise FileNotFoundError(f"SQLite database {self.path} does not exist")
        self._deadline = float("inf")
        self._connection = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
        connection = self._connection
        if prepare is not None:
            prepare(connection)
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
        connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
        connection.set_authorizer(_authorize)
        connection.set_progress_handler(self._past_deadline, _PROGRESS_EVERY)

    def _past_deadline(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    def execute(self, sql: str) -> list[tuple] | None:
        """The statement's rows (None for a statement without a result set); raises SqlError on failure."""
        self._deadline = time.monotonic() + self.timeout_s
        try:
            cursor = self._connection.execute(sql)
            if cursor.description is None:
                return None
            rows: list[tuple] = []
            while batch := cursor.fetchmany(1_000):
                rows.extend(batch)
                if len(rows) > self.max_rows:
                    raise SqlError(f"the result has more than {self.max_rows} rows")
            return rows
        except sqlite3.OperationalError as error:
            if str(error) == "interrupted" and time.monotonic() > self._deadline:
                raise QueryTimeout(
                    "Query execution was interrupted, maximum statement execution time exceeded"
                ) from None
            raise SqlError(str(error)) from None
        except (sqlite3.Error, ValueError, OverflowError) as error:  # e.g. one statement at a time
            raise SqlError(str(error)) from None
        finally:
            self._deadline = float("inf")

    def close(self) -> None:
        self._connection.close()


def _authorize(
    action: int, arg1: str | None, arg2: str | None, db_name: str | None, trigger: str | None
) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK
