"""InterCode-SQL's server backend: the agent's SQL runs on the project's MariaDB server, as InterCode's ran on MySQL 8.

`launch/mariadb.sh start` starts the server (its own data directory and unix socket under the cache directory)
with the 20 Spider databases of InterCode's dump, `lower_case_table_names=1` and a read-only account
`coevo_reader`. Every statement is answered by the server, and rows come back as InterCode's client returned
them (DECIMAL as `Decimal`, dates as `datetime`), so `str()` of a row, and so the reward, is the server's.
Where MariaDB differs from MySQL 8 the session is set to MySQL 8's ways (`SERVER_KINDS`): MySQL's own
ONLY_FULL_GROUP_BY decision (`full_group_by`), GROUP BY unsorted (`group_by`), temporary tables on disk, error
messages in MySQL's words (`statements.mariadb_error_message`). The SQLite sandbox's guarantees hold here too
(`ServerSession`). `MySqlBackend` runs statements as they are on a MySQL server (`launch/mysql.sh`, or the
user's own).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from coevo_jax.envs.intercode_sql.db import cache_root
from coevo_jax.envs.intercode_sql.full_group_by import TableKeys, group_by_refusal
from coevo_jax.envs.intercode_sql.group_by import unsorted_group_by
from coevo_jax.envs.intercode_sql.sandbox import (
    TIMEOUT_MESSAGE,
    QueryTimeout,
    SqlError,
    TruncatedRows,
    Watchdog,
    value_bytes,
)
from coevo_jax.envs.intercode_sql.statements import mariadb_error_message

READER = "coevo_reader"  # the read-only account launch/mariadb.sh creates
SOCKET_ENV = "COEVO_MARIADB_SOCKET"
KILL_GRACE_S = 0.5  # the watchdog kills a query this long after the server's own limit should have
READ_TIMEOUT_GRACE_S = 10.0
_ROW_OVERHEAD = 8  # bytes counted per row towards `max_result_bytes`, as in the SQLite sandbox
_TIMEOUT_CODES = {1969, 3024}  # MariaDB's max_statement_time, MySQL's max_execution_time
_INTERRUPTED = 1317  # KILL QUERY: the watchdog's, or another session's of the same account (then run again)
_LOST_CODES = {0, 1053, 1927, 2006, 2013, 2055}  # the connection is gone (or was never there)
_UNPARSED_CODES = {1064, 1221}  # a syntax error, "incorrect usage of ... and ORDER BY"
# MySQL 8.0's default sql_mode less ONLY_FULL_GROUP_BY: MariaDB's check knows no functional dependence and
# refuses gold queries MySQL ran (studies/intercode_sql_agreement/README.md), so `full_group_by` decides it.
SQL_MODE = (
    "STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"
)
MYSQL_SQL_MODE = "ONLY_FULL_GROUP_BY," + SQL_MODE  # MySQL 8.0's own default: a MySQL server decides it itself
MYSQL_SOCKET_ENV = "COEVO_MYSQL_SOCKET"


@dataclass(frozen=True)
class ServerKind:
    """What differs between the servers a session talks to: their name in messages, the variable naming their
    socket, the statement that sets a new session's time limit and sql_mode, and how error messages read."""

    title: str
    socket_env: str
    settings: str  # SET SESSION ...: the time limit, then the sql_mode
    time_limit: Callable[[float], float]  # seconds -> the limit variable's unit
    sql_mode: str
    message: Callable[[str], str]


SERVER_KINDS = {
    # MariaDB set to MySQL 8's ways: our own GROUP BY check (full_group_by), temporary tables on disk (in
    # memory MariaDB breaks ties such as `ORDER BY count(*) LIMIT 1` differently from one connection to the next)
    "mariadb": ServerKind(
        "MariaDB",
        SOCKET_ENV,
        "SET SESSION max_statement_time = %s, sql_mode = %s, tmp_memory_table_size = 0",
        lambda seconds: seconds,
        SQL_MODE,
        mariadb_error_message,
    ),
    # a MySQL server as it is; max_execution_time is in milliseconds and limits SELECTs (all the account runs)
    "mysql": ServerKind(
        "MySQL",
        MYSQL_SOCKET_ENV,
        "SET SESSION max_execution_time = %s, sql_mode = %s",
        lambda seconds: max(1, round(seconds * 1000)),
        MYSQL_SQL_MODE,
        lambda message: message,
    ),
}


def default_socket(server: str = "mariadb") -> Path:
    """Where launch/<server>.sh puts the server's socket, <cache root>/<server>/mysqld.sock, unless
    $COEVO_MARIADB_SOCKET (mariadb) or $COEVO_MYSQL_SOCKET (mysql) names another."""
    variable = SERVER_KINDS[server].socket_env
    if os.environ.get(variable):
        return Path(os.environ[variable])
    return cache_root() / server / "mysqld.sock"


class ServerUnavailable(RuntimeError):
    """No server answers at the socket: the environment cannot answer anything."""


def _pymysql():
    try:
        import pymysql
    except ImportError:  # pragma: no cover - PyMySQL is a dependency of the package
        raise ImportError(
            "the intercode_sql server backend needs PyMySQL: pip install PyMySQL (or pip install -e .)"
        ) from None
    return pymysql


class ServerError(SqlError):
    """The server refused or failed a statement; `code` is its error number."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class _Lost(Exception):
    """The connection dropped before the statement was answered."""


class ServerSession:
    """One connection of the read-only account, opened on first use and reopened after it drops.

    The SQLite sandbox's guarantees: no write succeeds (the account may SELECT and SHOW VIEW on the Spider
    databases only, and the server is read-only without SUPER); the session's time limit stops a statement at
    `timeout_s`, a watchdog kills it from a second connection shortly after (the agent may raise its own
    session's limit) and the socket's read timeout is the last resort; rows are read one at a time, up to
    `max_result_bytes` (`TruncatedRows`) or `max_rows` (an error), and the connection is then dropped. A
    dropped connection, or a statement another session of the account interrupted, is run again once; no
    connection at all raises `ServerUnavailable`."""

    def __init__(
        self,
        socket: Path,
        *,
        user: str,
        timeout_s: float,
        max_rows: int,
        max_result_bytes: int,
        killer,
        server: str = "mariadb",
    ):
        self.socket, self.user, self.timeout_s = socket, user, timeout_s
        self.max_rows, self.max_result_bytes = max_rows, max_result_bytes
        self.server = server  # "mariadb": set to MySQL 8's ways; "mysql": a MySQL server, as it is
        self._kill = killer
        self._connection = None

    def _session_settings(self) -> tuple[str, tuple]:
        """The statement that sets a new connection's time limit and sql_mode on this kind of server."""
        kind = SERVER_KINDS[self.server]
        return kind.settings, (kind.time_limit(self.timeout_s), kind.sql_mode)

    def _connect(self):
        pymysql = _pymysql()
        if self._connection is None:
            try:
                self._connection = pymysql.connect(
                    unix_socket=str(self.socket),
                    user=self.user,
                    password="",
                    charset="utf8mb4",
                    autocommit=True,
                    connect_timeout=5,
                    read_timeout=self.timeout_s + READ_TIMEOUT_GRACE_S,
                    write_timeout=self.timeout_s + READ_TIMEOUT_GRACE_S,
                    local_infile=False,
                )
                with self._connection.cursor() as cursor:
                    cursor.execute(*self._session_settings())
            except pymysql.MySQLError as error:
                self._connection = None
                kind = SERVER_KINDS[self.server]
                raise ServerUnavailable(
                    f"no {kind.title} server answers as {self.user!r} at {self.socket} ({error}); start one "
                    f"with `bash launch/{self.server}.sh start`, or point ${kind.socket_env} at one"
                ) from None
        return self._connection

    def execute(self, db: str, sql: str) -> list[tuple] | None:
        """The statement's rows in database `db` (None without a result set); raises SqlError on failure.

        A result past `max_result_bytes` comes back as the `TruncatedRows` read up to that size.
        """
        try:
            return self._execute(db, sql)
        except _Lost:
            self.end()
        try:
            return self._execute(db, sql)
        except _Lost as lost:
            self.end()
            raise SqlError(f"Lost connection to the server during the query ({lost})") from None

    def _execute(self, db: str, sql: str) -> list[tuple] | None:
        pymysql = _pymysql()
        connection = self._connect()
        watchdog = None
        try:
            connection.select_db(db)
            thread_id = connection.thread_id()
            watchdog = Watchdog(lambda: self._kill(thread_id), self.timeout_s + KILL_GRACE_S)
            cursor = pymysql.cursors.SSCursor(connection)
            cursor.execute(sql)
            if cursor.description is None:
                return None
            rows: list[tuple] = []
            size = 0
            for row in cursor:  # one row at a time off the socket: the size is checked before the next
                rows.append(row)
                size += _ROW_OVERHEAD + sum(value_bytes(value) for value in row)
                if size > self.max_result_bytes:
                    self.end()  # the rest of the result stays unread: drop the connection with it
                    return TruncatedRows(rows, self.max_result_bytes)
                if len(rows) > self.max_rows:
                    self.end()
                    raise SqlError(f"the result has more than {self.max_rows} rows")
            cursor.close()
            return rows
        except pymysql.MySQLError as error:
            code = error.args[0] if error.args and isinstance(error.args[0], int) else 0
            message = error.args[1] if len(error.args) > 1 else str(error)
            if code in _TIMEOUT_CODES or (watchdog is not None and watchdog.fired):
                raise QueryTimeout(TIMEOUT_MESSAGE) from None
            if code in _LOST_CODES or code == _INTERRUPTED or isinstance(error, pymysql.err.InterfaceError):
                raise _Lost(message) from None
            raise ServerError(code, SERVER_KINDS[self.server].message(message)) from None
        finally:
            if watchdog is not None:
                watchdog.stop()
                if watchdog.fired:
                    self.end()  # the kill may have landed after the statement ended: start afresh

    def end(self) -> None:
        """Drops the connection (and its session); the next statement opens a new one."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        unread = getattr(connection, "_result", None)  # PyMySQL's unbuffered result, if one is being read
        if unread is not None:
            unread.unbuffered_active = False  # so that it does not read the rest when collected
        try:
            connection.close()
        except Exception:  # already closed, or the socket is gone: nothing left to release
            pass


class MariaDbBackend:
    """Answers statements on the MariaDB server at `socket` (default: `default_socket()`), one session per
    name, set to MySQL 8's ways (the module docstring)."""

    name = "mariadb"

    def __init__(
        self,
        socket: str | Path | None = None,
        *,
        user: str = READER,
        timeout_s: float,
        max_rows: int,
        max_result_bytes: int,
    ):
        self.socket = Path(socket) if socket else default_socket(self.name)
        self._limits = dict(
            user=user,
            timeout_s=timeout_s,
            max_rows=max_rows,
            max_result_bytes=max_result_bytes,
            server=self.name,
        )
        self._sessions: dict[str, ServerSession] = {}
        self._control = ServerSession(self.socket, **self._limits, killer=None)  # runs the watchdog's KILLs
        self._control_lock = threading.Lock()
        self._control._connect()  # fail now, with the way to start the server, rather than mid-episode
        self._catalogue = ServerSession(self.socket, **self._limits, killer=None)  # reads the tables' keys
        self._tables: dict[str, dict[str, TableKeys]] = {}

    def answer(
        self, db: str, statement: str, *, session: str = "episode", reverse_scan: bool = False
    ) -> list | str | None:
        """`statement` on database `db` in the named session: rows, None or `Error executing query: ...`."""
        if reverse_scan:
            raise ValueError(
                "reverse_scan is SQLite's (reverse_unordered_selects); the server cannot scan backwards"
            )
        if session not in self._sessions:
            self._sessions[session] = ServerSession(self.socket, **self._limits, killer=self._kill_query)
        runner = self._sessions[session]
        try:
            return self._run(runner, db, statement)
        except SqlError as error:
            return f"Error executing query: {error}"

    def _run(self, runner: ServerSession, db: str, statement: str) -> list | str | None:
        """MySQL's GROUP BY refusal where its rules give one, else the statement with GROUP BY unsorted."""
        refusal = group_by_refusal(statement, self.tables(db), db)
        if refusal is not None:
            return f"Error executing query: {refusal}"
        unsorted = unsorted_group_by(statement)
        if unsorted != statement:
            try:
                return runner.execute(db, unsorted)
            except ServerError as error:
                if error.code not in _UNPARSED_CODES:  # the addition is not what failed
                    raise
        return runner.execute(db, statement)

    def tables(self, db: str) -> dict[str, TableKeys]:
        """`db`'s tables (lower-case names) with their columns and keys, read from the server once."""
        if db not in self._tables:
            columns = self._catalogue.execute(
                "information_schema",
                "SELECT TABLE_NAME, COLUMN_NAME, IS_NULLABLE FROM COLUMNS WHERE TABLE_SCHEMA = "
                f"{_quoted(db)} ORDER BY TABLE_NAME, ORDINAL_POSITION",
            )
            keys = self._catalogue.execute(
                "information_schema",
                "SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME FROM STATISTICS WHERE NON_UNIQUE = 0 AND "
                f"TABLE_SCHEMA = {_quoted(db)}",
            )
            self._tables[db] = tables_with_keys(columns or [], keys or [])
        return self._tables[db]

    def _kill_query(self, thread_id: int) -> None:
        """Runs on the watchdog's thread: stops whatever the connection `thread_id` is running."""
        with self._control_lock:
            for _ in range(2):  # the control connection may have dropped since its last use
                try:
                    connection = self._control._connect()
                    with connection.cursor() as cursor:
                        cursor.execute(f"KILL QUERY {int(thread_id)}")
                    return
                except Exception:
                    self._control.end()

    def end_session(self, session: str) -> None:
        """Drops the named session (the episode's, the gold queries', statements outside episodes), so that a
        new episode starts without the last one's session variables."""
        if session in self._sessions:
            self._sessions[session].end()

    def close(self) -> None:
        for session in self._sessions.values():
            session.end()
        self._sessions.clear()
        with self._control_lock:
            self._control.end()
        self._catalogue.end()


class MySqlBackend(MariaDbBackend):
    """Answers statements on a MySQL server (`launch/mysql.sh`, or one of the user's at `socket`) as they are:
    MySQL 8's default sql_mode, ONLY_FULL_GROUP_BY included, GROUP BY, row order and error messages the
    server's own. InterCode scored on MySQL 8.0.31; on another MySQL release the agreement with its records
    is measured, not assumed (studies/intercode_sql_agreement/README.md)."""

    name = "mysql"

    def _run(self, runner: ServerSession, db: str, statement: str) -> list | str | None:
        return runner.execute(db, statement)


SERVER_BACKENDS = {backend.name: backend for backend in (MariaDbBackend, MySqlBackend)}


def _quoted(name: str) -> str:
    return "'" + name.replace("\\", "\\\\").replace("'", "''") + "'"


def tables_with_keys(columns: list[tuple], keys: list[tuple]) -> dict[str, TableKeys]:
    """TableKeys by lower-case table name from information_schema rows: (table, column, IS_NULLABLE) and
    (table, unique index, column); a unique key counts only over NOT NULL columns, as in MySQL."""
    declared: dict[str, list[str]] = {}
    nullable: set[tuple[str, str]] = set()
    for table, column, is_nullable in columns:
        declared.setdefault(table.lower(), []).append(column)
        if is_nullable == "YES":
            nullable.add((table.lower(), column.lower()))
    indexes: dict[tuple[str, str], set[str]] = {}
    for table, index, column in keys:
        indexes.setdefault((table.lower(), index), set()).add(column.lower())
    result = {}
    for table, names in declared.items():
        unique = tuple(
            frozenset(cols)
            for (owner, _), cols in sorted(indexes.items())
            if owner == table and not any((table, c) in nullable for c in cols)
        )
        result[table] = TableKeys(tuple(names), unique)
    return result
