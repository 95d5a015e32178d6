"""InterCode-SQL's MySQL dump of the Spider dev databases, converted to one read-only SQLite file each.

InterCode serves the 20 databases from a MySQL 8 server (`lower_case_table_names=1`, collation
`utf8mb4_general_ci`). We read its `mysqldump` file ourselves and rebuild each database in SQLite so the
environment runs offline with no server. What the conversion keeps of MySQL's behaviour:

- table names are lower-cased, as that server stores them (column names keep their case);
- text columns get the `MYSQL_CI` collation (`mysql`), so `=`, `GROUP BY`, `DISTINCT` and
  `ORDER BY` compare strings as `utf8mb4_general_ci` does (no case, no accents, no trailing spaces); the
  files therefore open only on connections with that collation installed;
- rows are inserted in dump order (the primary-key order of InnoDB's clustered index), so a table scan
  returns them in the order MySQL does;
- each column's MySQL definition (type, nullability, key, default, extra) is kept in a schema file, from
  which `DESCRIBE` and `SHOW COLUMNS` are answered exactly as MySQL prints them.

The files are built once per dump and converter version (keyed by their SHA-256) under the cache directory and published with an
atomic rename, so concurrent first uses never see a half-written database.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sqlite3
from pathlib import Path

from coevo_jax.atomic_files import atomic_path
from coevo_jax.envs.intercode_sql import mysql

DATA_DIR = Path(__file__).parents[1] / "data" / "intercode"
DUMP_PATH = DATA_DIR / "ic_spider_dbs.sql"
SCHEMA_FILE = "schema.json"
FORMAT_VERSION = 2  # bump when the conversion changes: the cache key includes it

_COLUMN = re.compile(r"^\s*`(?P<name>[^`]+)` (?P<type>\w+(?:\([\d,]+\))?)(?P<rest>.*?),?$")
_KEY_COLUMN = re.compile(r"`([^`]+)`")
_INTEGER_TYPES = ("int", "integer", "smallint", "tinyint", "mediumint", "bigint")
_REAL_TYPES = ("double", "float", "decimal", "real", "numeric")


class DumpFormatError(ValueError):
    """The dump has a statement this converter does not understand (names file, line and problem)."""

    def __init__(self, source: str, line: int, problem: str):
        super().__init__(f"{source}:{line}: {problem}")


@dataclasses.dataclass(frozen=True)
class Column:
    """One column as MySQL's DESCRIBE shows it: (Field, Type, Null, Key, Default, Extra)."""

    name: str
    mysql_type: str
    nullable: bool
    key: str  # 'PRI', 'UNI', 'MUL' or ''
    default: str | None
    extra: str

    def describe_row(self) -> tuple:
        default = None if self.default is None else self.default.encode()
        return (
            self.name,
            self.mysql_type.encode(),
            "YES" if self.nullable else "NO",
            self.key,
            default,
            self.extra,
        )


@dataclasses.dataclass
class _Table:
    name: str
    columns: list[dict]
    primary: list[str]
    unique_first: set[str]
    index_first: set[str]
    rows: list[tuple]


def cache_root() -> Path:
    """Where built databases live: $COEVO_JAX_CACHE, else $XDG_CACHE_HOME/coevo_jax, else ~/.cache/coevo_jax."""
    if os.environ.get("COEVO_JAX_CACHE"):
        return Path(os.environ["COEVO_JAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "coevo_jax"


def _parse_string(text: str, start: int) -> tuple[str, int]:
    """A single-quoted MySQL literal starting at `start` (backslash escapes); returns (value, next index)."""
    escapes = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "Z": "\x1a", "b": "\b"}
    out, i = [], start + 1
    while True:
        ch = text[i]
        if ch == "\\":
            out.append(escapes.get(text[i + 1], text[i + 1]))
            i += 2
        elif ch == "'":
            if i + 1 < len(text) and text[i + 1] == "'":
                out.append("'")
                i += 2
            else:
                return "".join(out), i + 1
        else:
            out.append(ch)
            i += 1


def parse_values(text: str) -> list[tuple]:
    """The rows of an `INSERT ... VALUES (...),(...)` tail: numbers, NULL and quoted strings."""
    rows, row, i, n = [], None, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "(":
            row = []
            i += 1
        elif ch == ")":
            rows.append(tuple(row))
            row = None
            i += 1
        elif ch in ",; \n":
            i += 1
        elif ch == "'":
            value, i = _parse_string(text, i)
            row.append(value)
        else:
            end = i
            while end < n and text[end] not in ",)":
                end += 1
            token = text[i:end].strip()
            if token.upper() == "NULL":
                row.append(None)
            elif re.fullmatch(r"-?\d+", token):
                row.append(int(token))
            else:
                row.append(float(token))
            i = end
    return rows


def _key_columns(line: str) -> list[str]:
    """Columns of a key line (`PRIMARY KEY (`a`,`b`(255))`), its name (`KEY `name` (...)`) skipped."""
    columns_part = line[line.index("(") :]
    return _KEY_COLUMN.findall(columns_part)


def _column(match: re.Match) -> dict:
    rest = match.group("rest")
    default = None
    default_match = re.search(r"DEFAULT ('(?:[^'\\]|\\.)*'|\S+)", rest)
    if default_match and default_match.group(1) != "NULL":
        token = default_match.group(1)
        default = _parse_string(token, 0)[0] if token.startswith("'") else token
    extra = "auto_increment" if "AUTO_INCREMENT" in rest else ""
    if "DEFAULT CURRENT_TIMESTAMP" in rest:
        extra = "DEFAULT_GENERATED"
    return {
        "name": match.group("name"),
        "mysql_type": match.group("type").lower(),
        "not_null": "NOT NULL" in rest,
        "default": default,
        "extra": extra,
    }


def parse_dump(text: str, source: str = str(DUMP_PATH)) -> dict[str, dict[str, _Table]]:
    """Databases -> tables (columns, keys, rows) of a mysqldump file, table names lower-cased."""
    databases: dict[str, dict[str, _Table]] = {}
    current_db, table = None, None
    for line_no, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("USE `"):
            current_db = stripped[5 : stripped.index("`", 5)].lower()
            databases.setdefault(current_db, {})
        elif stripped.startswith("CREATE TABLE `"):
            if current_db is None:
                raise DumpFormatError(source, line_no, "CREATE TABLE before any USE statement")
            name = stripped[14 : stripped.index("`", 14)].lower()
            table = _Table(name, [], [], set(), set(), [])
            databases[current_db][name] = table
        elif table is not None and stripped.startswith(")"):
            table = None
        elif table is not None:
            if stripped.startswith("PRIMARY KEY"):
                table.primary = _key_columns(stripped)
            elif stripped.startswith("UNIQUE KEY"):
                table.unique_first.add(_key_columns(stripped)[0])
            elif stripped.startswith("KEY"):
                table.index_first.add(_key_columns(stripped)[0])
            elif stripped.startswith("CONSTRAINT"):
                continue  # foreign keys: InnoDB indexes them, and the dump lists that index as a KEY line
            else:
                match = _COLUMN.match(line)
                if match is None:
                    raise DumpFormatError(source, line_no, f"unrecognised column definition {stripped!r}")
                table.columns.append(_column(match))
        elif stripped.startswith("INSERT INTO `"):
            name = stripped[13 : stripped.index("`", 13)].lower()
            if current_db is None or name not in databases[current_db]:
                raise DumpFormatError(source, line_no, f"INSERT INTO unknown table {name!r}")
            target = databases[current_db][name]
            try:
                rows = parse_values(stripped[stripped.index(" VALUES ") + 8 :])
            except (IndexError, ValueError) as error:
                raise DumpFormatError(source, line_no, f"unreadable VALUES of {name!r}: {error}") from None
            for row in rows:
                if len(row) != len(target.columns):
                    raise DumpFormatError(
                        source,
                        line_no,
                        f"row of {len(row)} values for {len(target.columns)} columns of {name!r}",
                    )
            target.rows.extend(rows)
    return databases


def _key_of(table: _Table, column: str) -> str:
    if column in table.primary:
        return "PRI"
    if column in table.unique_first:
        return "UNI"
    if column in table.index_first:
        return "MUL"
    return ""


def table_columns(table: _Table) -> list[Column]:
    """MySQL's DESCRIBE view of a parsed table (primary-key columns are never nullable)."""
    return [
        Column(
            name=c["name"],
            mysql_type=c["mysql_type"],
            nullable=not (c["not_null"] or c["name"] in table.primary),
            key=_key_of(table, c["name"]),
            default=c["default"],
            extra=c["extra"],
        )
        for c in table.columns
    ]


def _sqlite_type(mysql_type: str) -> str:
    base = mysql_type.split("(")[0]
    if base in _INTEGER_TYPES:
        return "INTEGER"
    if base in _REAL_TYPES:
        return "REAL"
    return f"TEXT COLLATE {mysql.COLLATION}"


def _create_statement(table: _Table) -> str:
    columns = [f'"{c["name"]}" {_sqlite_type(c["mysql_type"])}' for c in table.columns]
    if table.primary:
        columns.append("PRIMARY KEY (" + ", ".join(f'"{c}"' for c in table.primary) + ")")
    return f'CREATE TABLE "{table.name}" (' + ", ".join(columns) + ")"


def write_database(path: Path, tables: dict[str, _Table]) -> None:
    """One SQLite file holding `tables` with their rows, in dump order."""
    connection = sqlite3.connect(path)
    mysql.install(connection)
    try:
        for table in tables.values():
            connection.execute(_create_statement(table))
            if table.rows:
                marks = ", ".join("?" * len(table.columns))
                connection.executemany(f'INSERT INTO "{table.name}" VALUES ({marks})', table.rows)
        connection.commit()
    finally:
        connection.close()


def build_databases(dump_path: Path = DUMP_PATH, root: Path | None = None) -> Path:
    """The directory of SQLite files (and schema.json) for `dump_path`, building it on first use."""
    raw = Path(dump_path).read_bytes()
    digest = hashlib.sha256(raw + f"format {FORMAT_VERSION}".encode()).hexdigest()[:16]
    target = (root or cache_root()) / "intercode_sql" / digest
    if (target / SCHEMA_FILE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    databases = parse_dump(raw.decode("utf-8"), str(dump_path))
    try:
        with atomic_path(target) as tmp:
            staging = Path(tmp)
            staging.mkdir()
            schema = {}
            for db, tables in databases.items():
                write_database(staging / f"{db}.sqlite", tables)
                schema[db] = {
                    name: [dataclasses.asdict(c) for c in table_columns(table)]
                    for name, table in tables.items()
                }
            for db in databases:
                os.chmod(staging / f"{db}.sqlite", 0o444)
            (staging / SCHEMA_FILE).write_text(json.dumps(schema, indent=1, sort_keys=True))
    except OSError:  # another process published it first: theirs is identical
        if not (target / SCHEMA_FILE).exists():
            raise
    return target


def load_schema(directory: Path) -> dict[str, dict[str, list[Column]]]:
    """Database -> table -> DESCRIBE columns, from a built directory's schema.json."""
    raw = json.loads((directory / SCHEMA_FILE).read_text())
    return {db: {t: [Column(**c) for c in cols] for t, cols in tables.items()} for db, tables in raw.items()}
