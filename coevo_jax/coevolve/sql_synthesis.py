"""InterCode-SQL's synthesizer: explore a database's schema and data, write questions from query templates.

Exploration runs statements through the environment (`InterCodeSqlEnv.run`, answered as in an episode):
`SHOW TABLES`, `DESCRIBE` of a few tables, `SELECT DISTINCT` samples of their columns' values, then candidate
queries from templates (`TEMPLATES`, each a SQL form with its question and clause kinds), filled with the
columns and values seen. The signal decides where and what:
* forgetting: the forgotten task's database and tables, templates with its gold query's clause kinds, values
  other than those of its gold query (variations with other parameters);
* boundary: the same clause kinds on another train database (the same skill on a new instance);
* rare: the task's database, templates that use a rare clause kind;
* unguided: a random train database, any template.
Every multi-row template orders its rows (`ORDER BY` its output), as InterCode's reward also scores order.

Abstraction keeps the candidate query that answered with rows and best matches the wanted clause kinds; the
task is its question, the database, the query as gold, and the solution `DESCRIBE` of its tables, the query,
`submit`. Verification: the query runs and returns rows; the same rows in the same order come back when
SQLite scans tables backwards (`reverse_unordered_selects`), so the answer does not depend on row order; the
rows are not a test task's answer on that database; and the solution replays to reward 1.0.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable

from coevo_jax.coevolve.patterns import parsed_actions, sql_statement_patterns
from coevo_jax.coevolve.synthesis import Exploration, Step, Synthesizer, replay_failure, spec_digest
from coevo_jax.envs.base import TaskSpec
from coevo_jax.envs.intercode_sql import InterCodeSqlEnv
from coevo_jax.envs.intercode_sql.env import UNSEEN_DATABASES, normalize_action, render_output
from coevo_jax.envs.intercode_sql.sandbox import TruncatedRows

ID_PREFIX = "coevolve_"
TABLES_DESCRIBED = 3
COLUMNS_SAMPLED = 5
VALUES_SAMPLED = 6
_TABLE_REF = re.compile(r"\b(?:FROM|JOIN)\s+`?(\w+)`?", re.I)
_NUMERIC = (
    "int",
    "integer",
    "smallint",
    "tinyint",
    "mediumint",
    "bigint",
    "double",
    "float",
    "decimal",
    "real",
)


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


class SqlSynthesizer(Synthesizer):
    env_name = "intercode_sql"

    def _train_databases(self, env: InterCodeSqlEnv) -> list[str]:
        dbs = {env.record(t)["db"].lower() for t in env.tasks("train")}
        return sorted(dbs - set(UNSEEN_DATABASES))

    def _bias(self, env, signal, rng):
        """(parent task, database, tables to describe first, wanted clause kinds, values to avoid)."""
        if signal is None:
            parent = rng.choice(env.tasks("train"))
            return parent, rng.choice(self._train_databases(env)), [], frozenset(), frozenset()
        record = env.record(signal.task_id)
        db, gold = record["db"].lower(), record["gold"]
        asked = sql_statement_patterns(gold) | {
            k for a in parsed_actions(signal.evidence) for k in sql_statement_patterns(a)
        }
        if signal.kind == "forgetting":
            avoid = frozenset(
                v.strip("'\"") for v in re.findall(r"'[^']*'|\"[^\"]*\"|\b\d+(?:\.\d+)?\b", gold)
            )
            return signal.task_id, db, tables_of(gold), sql_statement_patterns(gold), avoid
        if signal.kind == "boundary":
            others = [d for d in self._train_databases(env) if d != db]
            return signal.task_id, rng.choice(others), [], sql_statement_patterns(gold), frozenset()
        return signal.task_id, db, tables_of(gold), frozenset(signal.patterns) or asked, frozenset()

    def explore(self, env, signal, rng, *, steps, exploration_id):
        parent, db, first_tables, wanted, avoid = self._bias(env, signal, rng)
        taken: list[Step] = []
        schema = Schema(avoid=avoid)

        def act(sql: str):
            rows = env.run(db, sql)
            ok = isinstance(rows, list) and not isinstance(rows, TruncatedRows)
            taken.append(Step(sql, render_output(rows, 2_000), ok))
            return rows if ok else None

        tables = [name for (name,) in act("SHOW TABLES") or []]
        order = [t for t in first_tables if t in tables]
        order += rng.sample([t for t in tables if t not in order], len(tables) - len(order))
        for table in order[:TABLES_DESCRIBED]:
            described = act(f"DESCRIBE {table}") or []
            schema.tables[table] = [(row[0], row[1].decode().split("(")[0] in _NUMERIC) for row in described]
        columns = [(t, c) for t in schema.tables for c in schema.columns(t)]
        for table, column in rng.sample(columns, min(COLUMNS_SAMPLED, len(columns))):
            rows = act(
                f"SELECT DISTINCT {column} FROM {table} WHERE {column} IS NOT NULL LIMIT {VALUES_SAMPLED}"
            )
            schema.values[(table, column)] = [row[0] for row in rows or []]
        weights = [self._weight(template, wanted, signal) for template in TEMPLATES]
        queries = []
        while len(taken) < steps and weights:
            template = rng.choices(TEMPLATES, weights)[0]
            built = template.build(schema, rng)
            if built is None:
                weights[TEMPLATES.index(template)] = 0.0
                if not any(weights):
                    break
                continue
            sql, question = built
            rows = act(sql)
            if rows:
                queries.append({"sql": sql, "question": question, "template": template.name})
        context = {"db": db, "wanted": sorted(wanted), "queries": queries}
        return Exploration(exploration_id, signal, parent, tuple(taken), context)

    @staticmethod
    def _weight(template: Template, wanted: frozenset, signal) -> float:
        if signal is None or not wanted:
            return 1.0
        if signal.kind == "rare":  # only templates with a rare kind, if any has one
            return (
                1.0 if template.kinds & wanted else 0.0 if any(t.kinds & wanted for t in TEMPLATES) else 1.0
            )
        return 1.0 + 10.0 * len(template.kinds & wanted) / len(template.kinds | wanted)

    def abstract(self, env, exploration, *, min_steps):
        queries = exploration.context.get("queries", [])
        if not queries:
            return "no query answered with rows"
        wanted = set(exploration.context.get("wanted", ()))
        best = max(queries, key=lambda q: len(sql_statement_patterns(q["sql"]) & wanted))
        solution = [f"DESCRIBE {t}" for t in tables_of(best["sql"])] + [best["sql"], "submit"]
        if len(solution) < min_steps:
            return "solution too short"
        return self._spec(exploration.context["db"], best["sql"], solution, best["question"])

    def _spec(self, db: str, gold: str, solution: list[str], question: str) -> TaskSpec:
        state = {"db": db, "gold": gold}
        digest = spec_digest(self.env_name, state, solution)
        return TaskSpec(ID_PREFIX + digest[:16], question, state, tuple(solution), self.env_name)

    def step_ok(self, observation, info):
        return not observation.startswith("Error executing query")

    def task_from_actions(self, env, parent, actions, instruction, *, min_steps):
        """The statements up to the last query as the solution (then `submit`), that query as the gold."""
        statements = [s for s in map(normalize_action, actions) if s and s.lower() != "submit"]
        queries = [i for i, s in enumerate(statements) if re.match(r"(?:SELECT|WITH)\b", s, re.I)]
        if not queries:
            return "no query in the action sequence"
        solution = statements[: queries[-1] + 1] + ["submit"]
        if len(solution) < min_steps:
            return "solution too short"
        if not instruction.strip():
            return "no question"
        return self._spec(env.record(parent)["db"].lower(), solution[-2], solution, instruction.strip())

    def verify(self, env, spec):
        db, gold = spec.state["db"], spec.state["gold"]
        rows = env.run(db, gold)
        if not isinstance(rows, list) or isinstance(rows, TruncatedRows):
            return "reference query fails"
        if not rows:
            return "empty result"
        if env.run(db, gold, reverse_scan=True) != rows:
            return "row order depends on the scan"
        for task_id in env.tasks("test_seen") + env.tasks("test_unseen"):
            if env.record(task_id)["db"].lower() == db and env.gold_rows(task_id) == rows:
                return "answer of a test task"
        return replay_failure(env, spec)
