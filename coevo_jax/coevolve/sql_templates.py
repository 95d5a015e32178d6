"""InterCode-SQL's query templates: SQL forms with their question and clause kinds, filled from what an
exploration learnt of a database (`Schema`: described tables, sampled values).

Every multi-row template orders its rows (`ORDER BY` its output), as InterCode's reward also scores order;
each declares the clause kinds its SQL has (`patterns.sql_statement_patterns`, checked by the tests), which is
how a signal's wanted kinds pick templates. A template returns None when the schema lacks what it needs.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable

_TABLE_REF = re.compile(r"\b(?:FROM|JOIN)\s+`?(\w+)`?", re.I)


@dataclasses.dataclass
class Schema:
    """What exploration learnt: each described table's (column, is numeric) and sampled column values."""

    tables: dict[str, list[tuple[str, bool]]] = dataclasses.field(default_factory=dict)
    values: dict[tuple[str, str], list] = dataclasses.field(default_factory=dict)
    avoid: frozenset = frozenset()  # values not to use (forgetting: the forgotten task's own)

    def columns(self, table: str, numeric: bool | None = None) -> list[str]:
        return [c for c, n in self.tables[table] if numeric is None or n == numeric]

    def sampled(self, table: str, numeric: bool | None = None) -> list[str]:
        return [c for c in self.columns(table, numeric) if self.usable(table, c)]

    def usable(self, table: str, column: str) -> list:
        return [v for v in self.values.get((table, column), []) if str(v) not in self.avoid]

    def shared(self) -> list[tuple[str, str, str]]:
        """(table, other table, column name both have), for joins."""
        return [
            (t1, t2, c)
            for t1 in self.tables
            for t2 in self.tables
            if t1 < t2
            for c in self.columns(t1)
            if c.lower() in {d.lower() for d in self.columns(t2)}
        ]


def words(name: str) -> str:
    return name.replace("_", " ").lower()


def literal(value) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


# -- templates: (schema, rng) -> (sql, question) or None when the schema lacks what they need ---------------

Build = Callable[[Schema, random.Random], tuple[str, str] | None]


def _pick(rng, items):
    return rng.choice(items) if items else None


def _table_with(schema, rng, need_text=False, need_number=False):
    tables = [
        t
        for t in schema.tables
        if (not need_text or schema.sampled(t, False)) and (not need_number or schema.sampled(t, True))
    ]
    return _pick(rng, tables)


def _filter(schema, rng, op="="):
    t = _table_with(schema, rng, need_text=op == "=", need_number=op == ">")
    if t is None:
        return None
    column = rng.choice(schema.sampled(t, op == ">"))
    value = rng.choice(schema.usable(t, column))
    shown = rng.choice([c for c in schema.columns(t) if c != column] or [column])
    return t, shown, column, value


def t_filter(schema, rng):
    found = _filter(schema, rng)
    if found:
        t, c, w, v = found
        return (
            f"SELECT {c} FROM {t} WHERE {w} = {literal(v)} ORDER BY {c}",
            f"List the {words(c)} of every {words(t)} whose {words(w)} is {v}, in ascending order.",
        )


def t_compare(schema, rng):
    found = _filter(schema, rng, ">")
    if found:
        t, c, n, v = found
        return (
            f"SELECT {c} FROM {t} WHERE {n} > {literal(v)} ORDER BY {c}",
            f"List the {words(c)} of every {words(t)} with {words(n)} above {v}, in ascending order.",
        )


def t_count(schema, rng):
    found = _filter(schema, rng)
    if found:
        t, _, w, v = found
        return (
            f"SELECT COUNT(*) FROM {t} WHERE {w} = {literal(v)}",
            f"How many {words(t)} entries have {words(w)} {v}?",
        )


def _aggregate(function: str, word: str) -> Build:
    def build(schema, rng):
        t = _table_with(schema, rng, need_number=True)
        if t is not None:
            n = rng.choice(schema.sampled(t, True))
            return (
                f"SELECT {function}({n}) FROM {t}",
                f"What is the {word} {words(n)} over all {words(t)} entries?",
            )

    return build


def t_group(schema, rng):
    t = _table_with(schema, rng, need_text=True)
    if t is not None:
        c = rng.choice(schema.sampled(t, False))
        return (
            f"SELECT {c}, COUNT(*) FROM {t} GROUP BY {c} ORDER BY {c}",
            f"For each {words(c)}, how many {words(t)} entries are there? Order by {words(c)}.",
        )


def t_having(schema, rng):
    t = _table_with(schema, rng, need_text=True)
    if t is not None:
        c = rng.choice(schema.sampled(t, False))
        return (
            f"SELECT {c} FROM {t} GROUP BY {c} HAVING COUNT(*) > 1 ORDER BY {c}",
            f"Which {words(c)} values occur in more than one {words(t)} entry? List them in order.",
        )


def _join(schema, rng):
    pairs = schema.shared()
    if not pairs:
        return None
    t1, t2, key = rng.choice(pairs)
    if rng.random() < 0.5:
        t1, t2 = t2, t1
    key2 = next(c for c in schema.columns(t2) if c.lower() == key.lower())
    return t1, t2, next(c for c in schema.columns(t1) if c.lower() == key.lower()), key2


def t_join(schema, rng):
    found = _join(schema, rng)
    if found and schema.sampled(found[1], False):
        t1, t2, k1, k2 = found
        c = rng.choice([c for c in schema.columns(t1) if c != k1] or [k1])
        w = rng.choice(schema.sampled(t2, False))
        v = rng.choice(schema.usable(t2, w))
        return (
            f"SELECT T1.{c} FROM {t1} AS T1 JOIN {t2} AS T2 ON T1.{k1} = T2.{k2} "
            f"WHERE T2.{w} = {literal(v)} ORDER BY T1.{c}",
            f"List the {words(c)} of the {words(t1)} entries whose {words(t2)} (matched on {words(k1)}) has "
            f"{words(w)} {v}, in ascending order.",
        )


def t_join_group(schema, rng):
    found = _join(schema, rng)
    if found and schema.sampled(found[1], False):
        t1, t2, k1, k2 = found
        w = rng.choice(schema.sampled(t2, False))
        return (
            f"SELECT T2.{w}, COUNT(*) FROM {t1} AS T1 JOIN {t2} AS T2 ON T1.{k1} = T2.{k2} "
            f"GROUP BY T2.{w} ORDER BY T2.{w}",
            f"For each {words(w)} of {words(t2)}, how many {words(t1)} entries match it on {words(k1)}? "
            f"Order by {words(w)}.",
        )


def _membership(negated: bool) -> Build:
    def build(schema, rng):
        found = _join(schema, rng)
        if found:
            t1, t2, k1, k2 = found
            c = rng.choice([c for c in schema.columns(t1) if c != k1] or [k1])
            word = "does not appear" if negated else "appears"
            return (
                f"SELECT {c} FROM {t1} WHERE {k1} {'NOT IN' if negated else 'IN'} (SELECT {k2} FROM {t2}) "
                f"ORDER BY {c}",
                f"List the {words(c)} of every {words(t1)} whose {words(k1)} {word} in {words(t2)}, in "
                "ascending order.",
            )

    return build


def t_above_average(schema, rng):
    t = _table_with(schema, rng, need_number=True)
    if t is not None:
        n = rng.choice(schema.sampled(t, True))
        c = rng.choice([c for c in schema.columns(t) if c != n] or [n])
        return (
            f"SELECT {c} FROM {t} WHERE {n} > (SELECT AVG({n}) FROM {t}) ORDER BY {c}",
            f"List the {words(c)} of every {words(t)} whose {words(n)} is above the average, in ascending order.",
        )


def t_like(schema, rng):
    t = _table_with(schema, rng, need_text=True)
    if t is not None:
        c = rng.choice(schema.sampled(t, False))
        text = re.sub(r"[^A-Za-z0-9 ]", "", str(rng.choice(schema.usable(t, c))))
        if len(text) >= 3:
            start = rng.randrange(len(text) - 2)
            part = text[start : start + 3]
            return (
                f"SELECT {c} FROM {t} WHERE {c} LIKE '%{part}%' ORDER BY {c}",
                f"Which {words(c)} values of {words(t)} contain '{part}'? List them in order.",
            )


def t_between(schema, rng):
    t = _table_with(schema, rng, need_number=True)
    if t is not None:
        n = rng.choice(schema.sampled(t, True))
        values = sorted({v for v in schema.usable(t, n) if isinstance(v, int | float)})
        if len(values) >= 2:
            low, high = sorted(rng.sample(values, 2))
            c = rng.choice([c for c in schema.columns(t) if c != n] or [n])
            return (
                f"SELECT {c} FROM {t} WHERE {n} BETWEEN {low} AND {high} ORDER BY {c}",
                f"List the {words(c)} of every {words(t)} with {words(n)} from {low} to {high}, in order.",
            )


def t_distinct(schema, rng):
    t = _table_with(schema, rng, need_text=True)
    if t is not None:
        c = rng.choice(schema.sampled(t, False))
        return (
            f"SELECT DISTINCT {c} FROM {t} ORDER BY {c}",
            f"List the distinct {words(c)} values of {words(t)}.",
        )


def t_top(schema, rng):
    t = _table_with(schema, rng, need_number=True)
    if t is not None:
        n = rng.choice(schema.sampled(t, True))
        c = rng.choice([c for c in schema.columns(t) if c != n] or [n])
        return (
            f"SELECT {c} FROM {t} ORDER BY {n} DESC LIMIT 1",
            f"What is the {words(c)} of the {words(t)} with the highest {words(n)}?",
        )


def _compound(operator: str, joiner: str) -> Build:
    def build(schema, rng):
        t = _table_with(schema, rng, need_text=True)
        if t is None:
            return None
        columns = schema.sampled(t, False)
        w1, w2 = rng.choice(columns), rng.choice(columns)
        v1, v2 = rng.choice(schema.usable(t, w1)), rng.choice(schema.usable(t, w2))
        c = rng.choice(schema.columns(t))
        return (
            f"SELECT {c} FROM {t} WHERE {w1} = {literal(v1)} {operator} "
            f"SELECT {c} FROM {t} WHERE {w2} = {literal(v2)} ORDER BY 1",
            f"List the {words(c)} values of {words(t)} entries with {words(w1)} {v1} {joiner} of entries with "
            f"{words(w2)} {v2}, without repeats, in order.",
        )

    return build


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    kinds: frozenset[str]  # the clause kinds of its SQL (`patterns.sql_statement_patterns`)
    build: Build


def _template(name: str, kinds: str, build: Build) -> Template:
    return Template(name, frozenset(k.strip() for k in kinds.split(",")), build)


TEMPLATES = (
    _template("filter", "select, where, order by", t_filter),
    _template("compare", "select, where, order by", t_compare),
    _template("count", "select, where, count", t_count),
    _template("avg", "select, avg", _aggregate("AVG", "average")),
    _template("sum", "select, sum", _aggregate("SUM", "total")),
    _template("max", "select, min/max", _aggregate("MAX", "largest")),
    _template("group", "select, count, group by, order by", t_group),
    _template("having", "select, count, group by, having, order by", t_having),
    _template("join", "select, join, where, order by", t_join),
    _template("join_group", "select, join, count, group by, order by", t_join_group),
    _template("in", "select, where, in, subquery, order by", _membership(False)),
    _template("not_in", "select, where, not, in, subquery, order by", _membership(True)),
    _template("above_average", "select, where, avg, subquery, order by", t_above_average),
    _template("like", "select, where, like, order by", t_like),
    _template("between", "select, where, between, order by", t_between),
    _template("distinct", "select, distinct, order by", t_distinct),
    _template("top", "select, order by, limit", t_top),
    _template("union", "select, where, union, order by", _compound("UNION", "together with those")),
    _template(
        "intersect", "select, where, intersect, order by", _compound("INTERSECT", "that are also those")
    ),
    _template("except", "select, where, except, order by", _compound("EXCEPT", "except those")),
)


def tables_of(sql: str) -> list[str]:
    """The tables a query reads (after FROM and JOIN), lower-cased, in order, once each."""
    return list(dict.fromkeys(name.lower() for name in _TABLE_REF.findall(sql)))
