"""The parts of MySQL's behaviour that InterCode's agents rely on, installed on a SQLite connection.

- Collation `MYSQL_CI`, the SQLite stand-in for `utf8mb4_general_ci` with PAD SPACE: strings compare
  without case, without accents and without trailing spaces (Spider's flight_2 stores 'Aberdeen ' and its
  gold queries ask for "Aberdeen"). Every text column of the converted databases is declared with it, so
  `=`, `IN`, `GROUP BY`, `DISTINCT` and `ORDER BY` follow MySQL.
- Functions MySQL has and SQLite lacks, used by InterCode's recorded GPT-4 episodes: CONCAT, CONCAT_WS,
  REGEXP (the operator), IF, YEAR, MONTH, DAY, CURDATE, NOW, DATEDIFF, LOCATE, LCASE, UCASE.
"""

from __future__ import annotations

import datetime
import functools
import re
import sqlite3
import unicodedata

COLLATION = "MYSQL_CI"


@functools.lru_cache(maxsize=65_536)
def _fold(text: str) -> str:
    stripped = text.rstrip(" ")
    decomposed = unicodedata.normalize("NFD", stripped)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


def mysql_ci_compare(left: str, right: str) -> int:
    """utf8mb4_general_ci-like comparison: case-, accent- and trailing-space-insensitive."""
    a, b = _fold(left), _fold(right)
    return (a > b) - (a < b)


def _concat(*parts):
    return None if any(p is None for p in parts) else "".join(str(p) for p in parts)


def _concat_ws(separator, *parts):
    if separator is None:
        return None
    return str(separator).join(str(p) for p in parts if p is not None)


def _regexp(pattern, value):
    if pattern is None or value is None:
        return None
    try:
        return 1 if re.search(str(pattern), str(value), re.IGNORECASE) else 0
    except re.error as error:
        raise ValueError(f"invalid regular expression {pattern!r}: {error}") from None


def _date(value) -> datetime.date | None:
    if value is None:
        return None
    match = re.match(r"^(\d{4})-(\d{1,2})-(\d{1,2})", str(value))
    if not match:
        return None
    try:
        return datetime.date(*(int(g) for g in match.groups()))
    except ValueError:
        return None


def _date_part(attribute: str):
    def extract(value):
        date = _date(value)
        return None if date is None else getattr(date, attribute)

    return extract


def _datediff(left, right):
    a, b = _date(left), _date(right)
    return None if a is None or b is None else (a - b).days


def _locate(needle, haystack, start=1):
    if needle is None or haystack is None:
        return None
    return str(haystack).lower().find(str(needle).lower(), max(int(start), 1) - 1) + 1


def _case(method: str):
    return lambda value: None if value is None else getattr(str(value), method)()


def install(connection: sqlite3.Connection) -> None:
    """Registers the collation and the functions on `connection` (before any statement uses them)."""
    connection.create_collation(COLLATION, mysql_ci_compare)
    deterministic = {
        "CONCAT": (-1, _concat),
        "CONCAT_WS": (-1, _concat_ws),
        "REGEXP": (2, _regexp),
        "IF": (3, lambda condition, a, b: a if condition else b),
        "YEAR": (1, _date_part("year")),
        "MONTH": (1, _date_part("month")),
        "DAY": (1, _date_part("day")),
        "DATEDIFF": (2, _datediff),
        "LOCATE": (-1, _locate),
        "LCASE": (1, _case("lower")),
        "UCASE": (1, _case("upper")),
    }
    for name, (arity, function) in deterministic.items():
        connection.create_function(name, arity, function, deterministic=True)
    connection.create_function("CURDATE", 0, lambda: datetime.date.today().isoformat())
    connection.create_function("NOW", 0, lambda: datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
