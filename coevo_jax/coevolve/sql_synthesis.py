"""InterCode-SQL's synthesizer: explore a database's schema and data, write questions from query templates.

Exploration runs statements through the environment (`InterCodeSqlEnv.run`, answered as in an episode):
`SHOW TABLES`, `DESCRIBE` of a few tables, `SELECT DISTINCT` samples of their columns' values, then candidate
queries from templates (`sql_templates`: SQL forms with their questions and clause kinds), filled with the
columns and values seen. The signal decides where and what:
* forgetting: the forgotten task's database and tables, templates with its gold query's clause kinds, values
  other than those of its gold query (variations with other parameters);
* boundary: the same clause kinds on another train database (the same skill on a new instance);
* rare: the task's database, templates that use a rare clause kind;
* unguided: a random train database, any template.

Abstraction keeps the candidate query that answered with rows and best matches the wanted clause kinds; the
task is its question, the database, the query as gold, and the solution `DESCRIBE` of its tables, the query,
`submit`. Verification: the query runs and returns rows; the same rows in the same order come back when
SQLite scans tables backwards (`reverse_unordered_selects`), so the answer does not depend on row order; the
rows are not a test task's answer on that database; and the solution replays to reward 1.0.
"""

from __future__ import annotations

import re

from coevo_jax.coevolve.patterns import parsed_actions, sql_statement_patterns
from coevo_jax.coevolve.sql_templates import TEMPLATES, Schema, Template, tables_of
from coevo_jax.coevolve.synthesis import Exploration, Step, Synthesizer, replay_failure, spec_digest
from coevo_jax.envs.base import TaskSpec
from coevo_jax.envs.intercode_sql import InterCodeSqlEnv
from coevo_jax.envs.intercode_sql.env import UNSEEN_DATABASES
from coevo_jax.envs.intercode_sql.sandbox import TruncatedRows
from coevo_jax.envs.intercode_sql.statements import normalize_action, render_output

ID_PREFIX = "coevolve_"
TABLES_DESCRIBED = 3
COLUMNS_SAMPLED = 5
VALUES_SAMPLED = 6
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


def _type_name(column_type: bytes | str) -> str:
    """DESCRIBE's Type without its width: MySQL 8 gave bytes (b'int'), MariaDB gives text ('int(11)')."""
    text = column_type.decode() if isinstance(column_type, bytes) else column_type
    return text.split("(")[0]


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
            schema.tables[table] = [(row[0], _type_name(row[1]) in _NUMERIC) for row in described]
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
        if env.scan_decides_order(db, gold):
            return "row order depends on the scan"
        for task_id in env.tasks("test_seen") + env.tasks("test_unseen"):
            if env.record(task_id)["db"].lower() == db and env.gold_rows(task_id) == rows:
                return "answer of a test task"
        return replay_failure(env, spec)
