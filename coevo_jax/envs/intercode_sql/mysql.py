"""The parts of MySQL's behaviour that InterCode's agents rely on, installed on a SQLite connection.

- Collation `MYSQL_CI`, the SQLite stand-in for `utf8mb4_general_ci` with PAD SPACE: strings compare
  without case, without accents and without trailing spaces (Spider's flight_2 stores 'Aberdeen ' and its
  gold queries ask for "Aberdeen"). Every text column of the converted databases is declared with it, so
  `=`, `IN`, `GROUP BY`, `DISTINCT` and `ORDER BY` follow MySQL.
- Functions MySQL has and SQLite lacks, used by InterCode's recorded GPT-4 episodes: CONCAT, CONCAT_WS,
  REGEXP (the operator), IF, YEAR, MONTH, DAY, CURDATE, NOW, DATEDIFF, LOCATE, LCASE, UCASE, and MySQL's
  FORMAT(X, D) in place of SQLite's `format` (an alias of `printf`, which the sandbox refuses).

The Python parts run inside a statement, where SQLite's time limit cannot stop them, so each is bounded:
REGEXP matches with the `regex` module's timeout set to the statement's time left (a nested quantifier
cannot backtrack past the deadline; the statement then fails as timed out), the collation stops comparing once the deadline has passed, and its
cache keeps only short strings.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import re
import sqlite3
import unicodedata

import regex

from coevo_jax.envs.intercode_sql.sandbox import time_left

COLLATION = "MYSQL_CI"
FOLD_CACHE_ENTRIES = 16_384  # with FOLD_CACHE_MAX_CHARS, bounds the cache to ~20 MB whatever the queries
FOLD_CACHE_MAX_CHARS = 128  # longer strings (values reach 1 MB) are folded each time, never kept
_FORMAT_MAX_DECIMALS = 30  # MySQL's limit for FORMAT's D
_FORMAT_CONTEXT = decimal.Context(prec=340, traps=[decimal.InvalidOperation])


def _fold_uncached(text: str) -> str:
    stripped = text.rstrip(" ")
    decomposed = unicodedata.normalize("NFD", stripped)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


_fold_cached = functools.lru_cache(maxsize=FOLD_CACHE_ENTRIES)(_fold_uncached)


def _fold(text: str) -> str:
    return _fold_cached(text) if len(text) <= FOLD_CACHE_MAX_CHARS else _fold_uncached(text)


def mysql_ci_compare(left: str, right: str) -> int:
    """utf8mb4_general_ci-like comparison: case-, accent- and trailing-space-insensitive.

    Past the statement's deadline it answers "equal" without work: the statement is being aborted.
    """
    if time_left() <= 0:
        return 0
    a, b = _fold(left), _fold(right)
    return (a > b) - (a < b)


def _concat(*parts):
    return None if any(p is None for p in parts) else "".join(str(p) for p in parts)


def _concat_ws(separator, *parts):
    if separator is None:
        return None
    return str(separator).join(str(p) for p in parts if p is not None)


def _regexp(pattern, value):
    """`value REGEXP pattern`; a match still running at the statement's deadline raises TimeoutError, which
    fails the statement (the sandbox reports it as timed out)."""
    if pattern is None or value is None:
        return None
    left = time_left()
    timeout = None if left == float("inf") else max(left, 1e-3)
    try:
        return 1 if regex.search(str(pattern), str(value), regex.IGNORECASE, timeout=timeout) else 0
    except regex.error as error:
        raise ValueError(f"invalid regular expression {pattern!r}: {error}") from None


def _format(*args):
    """MySQL's FORMAT(X, D[, locale]): X rounded half away from zero to D decimals, ',' between thousands.

    Registered for every arity so SQLite's own `format` (an alias of the refused `printf`) is never reached;
    the locale is ignored (InterCode's server formats as en_US).
    """
    if len(args) not in (2, 3):
        raise ValueError(f"FORMAT takes 2 or 3 arguments, not {len(args)}")
    number, decimals = args[:2]
    if number is None or decimals is None:
        return None
    places = min(max(int(decimals), 0), _FORMAT_MAX_DECIMALS)
    try:
        value = decimal.Decimal(str(number))
    except decimal.InvalidOperation:
        value = decimal.Decimal(0)  # MySQL reads a non-numeric string as 0
    if not value.is_finite():
        return None
    try:  # precision for any double (309 digits) and 30 decimals; beyond that (or inf, nan): NULL
        rounded = value.quantize(decimal.Decimal(1).scaleb(-places), decimal.ROUND_HALF_UP, _FORMAT_CONTEXT)
    except decimal.InvalidOperation:
        return None
    return f"{rounded:,.{places}f}"


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
        "FORMAT": (-1, _format),
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
