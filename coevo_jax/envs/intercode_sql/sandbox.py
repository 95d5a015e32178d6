"""A read-only, time-limited SQLite connection for SQL written by an agent.

Layers, each enough on its own against writes:
- the file is opened read-only (`mode=ro` URI; the built files are also mode 0444) with `query_only` on;
- an authorizer allows only reading: SELECT, column reads, functions (minus a deny-list of those that touch
  files or load code) and recursive CTEs; ATTACH, PRAGMA, VACUUM, writes, schema changes and transactions
  are refused before they run;
- extension loading stays disabled, and `SQLITE_LIMIT_ATTACHED` is 0.
Resources are bounded too, so no statement can stall or exhaust the process that runs it:
- time: a progress handler aborts a statement after `timeout_s` (fetching included), and a watchdog thread
  interrupts the connection at the same deadline for C code that never reaches the progress handler;
  `time_left()` gives Python functions called from SQL (REGEXP, the collation) the same deadline; `printf`
  is refused (a wide `%.*c` runs for seconds in one C call that neither check reaches);
- memory: string/blob values are capped at `maxvalue_bytes`, results over `max_rows` rows are refused, and
  fetching stops once the rows fetched hold `max_result_bytes` (a `TruncatedRows` then says so).
"""

from __future__ import annotations

import sqlite3
import threading
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
# Functions MySQL lacks that can run for seconds inside one C call (`printf('%.*c', 2147483647, 'x')`);
# refused with MySQL's message for a function that does not exist.
_UNAVAILABLE_FUNCTIONS = {"printf"}
_PROGRESS_EVERY = 2_000  # SQLite VM instructions between deadline checks
_VALUE_OVERHEAD = 8  # bytes counted for a number or NULL, and per row, towards `max_result_bytes`
# MySQL 8's words for a statement past its time limit; the server backend's timeouts read the same.
TIMEOUT_MESSAGE = "Query execution was interrupted, maximum statement execution time exceeded"
_statement = threading.local()  # the deadline of the statement running on this thread


def time_left() -> float:
    """Seconds until the deadline of the statement running on this thread (inf outside a statement).

    For Python functions that SQLite calls mid-statement: the progress handler cannot stop them.
    """
    return getattr(_statement, "deadline", float("inf")) - time.monotonic()


class SqlError(Exception):
    """A statement failed; the message is what the agent is shown after "Error executing query: "."""


class QueryTimeout(SqlError):
    """The statement ran past the sandbox's time limit."""


class TruncatedRows(list):
    """The rows fetched before the result passed `max_result_bytes`; the rest of the result was not fetched."""

    def __init__(self, rows: list[tuple], max_result_bytes: int):
        super().__init__(rows)
        self.max_result_bytes = max_result_bytes


class Watchdog:
    """Calls `action()` after `delay_s` unless stopped first (`fired` says whether it did); `stop` waits for
    an action under way, so none runs after it returns. The SQLite backend interrupts its connection, the
    server backend kills the statement's thread."""

    def __init__(self, action: Callable[[], object], delay_s: float):
        self._action, self._lock, self._active, self.fired = action, threading.Lock(), True, False
        self._timer = threading.Timer(delay_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._active:
                self.fired = True
                self._action()

    def stop(self) -> None:
        with self._lock:
            self._active = False
        self._timer.cancel()


def value_bytes(value: object) -> int:
    """What a fetched value counts towards `max_result_bytes` (the server backend counts alike)."""
    return len(value) if isinstance(value, (str, bytes)) else _VALUE_OVERHEAD


class SqlSandbox:
    """Runs one statement at a time against one SQLite file, read-only, within time and size limits."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = 5.0,
        max_rows: int = 100_000,
        maxvalue_bytes: int = 1_000_000,
        max_result_bytes: int = 1_000_000,
        prepare: Callable[[sqlite3.Connection], None] | None = None,
    ):
        """`prepare` registers collations and functions before the authorizer locks the connection."""
        self.path, self.timeout_s, self.max_rows = Path(path), timeout_s, max_rows
        self.max_result_bytes = max_result_bytes
        if not self.path.is_file():
            raise FileNotFoundError(f"SQLite database {self.path} does not exist")
        self._deadline = float("inf")
        self._unavailable: str | None = (
            None  # a refused function of `_UNAVAILABLE_FUNCTIONS`, named in the error
        )
        self._connection = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
        connection = self._connection
        if prepare is not None:
            prepare(connection)
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, maxvalue_bytes)
        connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
        connection.set_authorizer(self._authorize)
        connection.set_progress_handler(self._past_deadline, _PROGRESS_EVERY)

    def _past_deadline(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    def execute(self, sql: str) -> list[tuple] | None:
        """The statement's rows (None for a statement without a result set); raises SqlError on failure.

        A result larger than `max_result_bytes` comes back as the `TruncatedRows` fetched up to that size.
        """
        self._deadline = _statement.deadline = time.monotonic() + self.timeout_s
        self._unavailable = None
        watchdog = Watchdog(self._connection.interrupt, self.timeout_s)
        try:
            cursor = self._connection.execute(sql)
            if cursor.description is None:
                return None
            rows: list[tuple] = []
            size = 0
            for row in cursor:  # one row at a time: the size is checked before the next row is read
                rows.append(row)
                size += _VALUE_OVERHEAD + sum(value_bytes(value) for value in row)
                if size > self.max_result_bytes:
                    cursor.close()
                    return TruncatedRows(rows, self.max_result_bytes)
                if len(rows) > self.max_rows:
                    raise SqlError(f"the result has more than {self.max_rows} rows")
            if time.monotonic() > self._deadline:  # a Python function gave up at the deadline
                raise QueryTimeout(TIMEOUT_MESSAGE)
            return rows
        except sqlite3.Error as error:
            if time.monotonic() > self._deadline:  # "interrupted", or a Python function's TimeoutError
                raise QueryTimeout(TIMEOUT_MESSAGE) from None
            if self._unavailable is not None:
                raise SqlError(f"FUNCTION {self._unavailable} does not exist") from None
            raise SqlError(str(error)) from None
        except (ValueError, OverflowError) as error:  # e.g. one statement at a time
            raise SqlError(str(error)) from None
        finally:
            watchdog.stop()
            self._deadline = _statement.deadline = float("inf")

    def close(self) -> None:
        self._connection.close()

    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, db_name: str | None, trigger: str | None
    ) -> int:
        if action not in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_DENY
        name = (arg2 or "").lower()
        if action == sqlite3.SQLITE_FUNCTION and name in _UNAVAILABLE_FUNCTIONS:
            self._unavailable = name
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and name in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
