"""MySQL 8's ONLY_FULL_GROUP_BY refusals, for backends that answer what MySQL refuses (SQLite, MariaDB).

InterCode's MySQL 8 server refuses an aggregated query whose SELECT list (or, when it groups, ORDER BY)
names a column that is neither aggregated nor determined by the GROUP BY columns, and so scores 0 on any task
whose gold query it refused. MySQL decides "determined" by functional dependence: a grouped column, a column
equal to a determined column or to a constant (WHERE and ON equalities), every column of a table instance
whose primary key (or a unique key over NOT NULL columns) is determined. MariaDB's own ONLY_FULL_GROUP_BY
knows no functional dependence and refuses gold queries MySQL answered, and SQLite has none
(studies/intercode_sql_agreement/README.md), so `group_by_refusal` reproduces MySQL's decision from the
statement and the database's keys, with MySQL's error message.

The statement is read into its query blocks (`query_blocks`), checked inner blocks first as MySQL prepares
them. Where the reading is unsure (a column it cannot resolve, a CTE, NATURAL or USING joins, window
functions, WITH ROLLUP, a table of another database) it refuses nothing: the backend answers the statement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from coevo_jax.envs.intercode_sql.group_by import is_filler, sql_tokens
from coevo_jax.envs.intercode_sql.query_blocks import (
    AGGREGATES,
    Block,
    Instance,
    TableKeys,
    Unsure,
    canonical_text,
    conjuncts,
    identifier,
    is_literal,
    nest,
    nested_queries,
    query_blocks,
    references,
    select_items,
    split,
    table_instances,
    undirected,
)

_OUTER_REFERENCE = ("outer",)  # a column of an enclosing query block: constant within this one
_INCOMPATIBLE = "this is incompatible with sql_mode=only_full_group_by"


class _Scope:
    """Resolves column references of one query block."""

    def __init__(self, instances: list[Instance], aliases: set[str], *, nested: bool):
        self.instances = {i.name: i for i in instances}
        if len(self.instances) != len(instances):
            raise Unsure
        self.aliases = aliases
        self.nested = nested  # only a subquery's names may belong to an enclosing block

    def resolve(self, parts: list[str]) -> tuple[str, str] | tuple:
        """(instance, column in lower case) of a reference, `_OUTER_REFERENCE`, or raises Unsure."""
        if len(parts) == 3:
            raise Unsure
        if len(parts) == 2:
            instance = self.instances.get(parts[0].lower())
            if instance is None:
                if not self.nested:
                    raise Unsure  # MySQL's "Unknown column"
                return _OUTER_REFERENCE
            if parts[1].lower() not in instance.columns:
                raise Unsure
            return (instance.name, parts[1].lower())
        column = parts[0].lower()
        owners = [i for i in self.instances.values() if column in i.columns]
        if len(owners) == 1:
            return (owners[0].name, column)
        if owners:
            raise Unsure  # ambiguous: MySQL's own error
        if column in self.aliases or not self.nested:
            raise Unsure
        return _OUTER_REFERENCE

    def shown(self, reference: tuple[str, str], db: str) -> str:
        instance = self.instances[reference[0]]
        return f"{db.lower()}.{instance.name}.{instance.columns[reference[1]]}"


def _operand(items: list, scope: _Scope):
    """A conjunct side: 'constant', a resolved column, or None (anything else)."""
    if len(items) == 1 and is_literal(items[0]):
        return "constant"
    if len(items) in (1, 3) and all(
        identifier(item) if position % 2 == 0 else item == "." for position, item in enumerate(items)
    ):
        reference = scope.resolve([identifier(item) for item in items[::2]])
        return "constant" if reference == _OUTER_REFERENCE else reference
    return None


def _determined(scope: _Scope, group_columns: set, conditions: list[list]) -> set[tuple[str, str]]:
    """The columns MySQL deems determined by `group_columns` (functional dependence)."""
    determined = set(group_columns)
    equalities = []
    for condition in conditions:
        for conjunct in conjuncts(condition):
            sides = split(conjunct, "=")
            if len(sides) != 2:
                continue
            left, right = _operand(sides[0], scope), _operand(sides[1], scope)
            if left is None or right is None:
                continue
            equalities.append((left, right))
    changed = True
    while changed:
        changed = False
        for left, right in equalities:
            for source, target in ((left, right), (right, left)):
                if (
                    target != "constant"
                    and target not in determined
                    and (source == "constant" or source in determined)
                ):
                    determined.add(target)
                    changed = True
        for instance in scope.instances.values():
            known = {column for name, column in determined if name == instance.name}
            if any(key <= known for key in instance.keys):
                for column in instance.columns:
                    if (instance.name, column) not in determined:
                        determined.add((instance.name, column))
                        changed = True
    return determined


def _not_in_group_by(number: int, clause: str, column: str) -> str:
    """MySQL's ER_WRONG_FIELD_WITH_GROUP_V2 message."""
    return (
        f"Expression #{number} of {clause} is not in GROUP BY clause and contains nonaggregated column "
        f"'{column}' which is not functionally dependent on columns in GROUP BY clause; {_INCOMPATIBLE}"
    )


def _refusal_of_block(block: Block, tables: Mapping[str, TableKeys], db: str, nested: bool) -> str | None:
    if "FROM" not in block.clauses:
        return None
    instances, on_conditions = table_instances(block.clauses["FROM"], tables)
    items = select_items(block.select)
    scope = _Scope(instances, {alias.lower() for _, alias in items if alias}, nested=nested)
    grouped = "GROUP" in block.clauses
    aggregated = grouped or any(references(expression)[1] for expression, _ in items)
    for clause in ("HAVING", "ORDER"):
        aggregated |= references(block.clauses.get(clause, []))[1]
    if not aggregated:
        return None
    group_columns, group_texts = set(), set()
    for part in map(undirected, split(block.clauses.get("GROUP", []), ",")):
        if len(part) == 1 and re.fullmatch(r"\d+", part[0]):
            position = int(part[0])
            if not 1 <= position <= len(items):
                raise Unsure
            part = items[position - 1][0]
        group_texts.add(canonical_text(part))
        operand = _operand(part, scope)  # a SELECT alias raises Unsure in `resolve`
        if isinstance(operand, tuple):
            group_columns.add(operand)
    conditions = [block.clauses.get("WHERE", []), *on_conditions]
    determined = _determined(scope, group_columns, conditions)

    def first_undetermined(expression: list) -> tuple[str, str] | None:
        if canonical_text(expression) in group_texts:
            return None
        missing = None
        for parts in references(expression)[0]:
            reference = scope.resolve(parts)
            if reference != _OUTER_REFERENCE and reference not in determined and missing is None:
                missing = reference
        return missing

    for number, (expression, _) in enumerate(items, start=1):
        if expression == ["*"] or (len(expression) == 3 and expression[1:] == [".", "*"]):
            raise Unsure
        missing = first_undetermined(expression)
        if missing is not None:
            column = scope.shown(missing, db)
            if grouped:
                return _not_in_group_by(number, "SELECT list", column)
            return (
                f"In aggregated query without GROUP BY, expression #{number} of SELECT list contains "
                f"nonaggregated column '{column}'; {_INCOMPATIBLE}"
            )
    if grouped and not block.in_set_operation:
        select_texts = {canonical_text(expression) for expression, _ in items}
        for number, part in enumerate(map(undirected, split(block.clauses.get("ORDER", []), ",")), start=1):
            if not part:
                continue
            if len(part) == 1 and (
                re.fullmatch(r"\d+", part[0]) or (part[0].strip("`").lower() in scope.aliases)
            ):
                continue
            if canonical_text(part) in select_texts:
                continue
            missing = first_undetermined(part)
            if missing is not None:
                return _not_in_group_by(number, "ORDER BY clause", scope.shown(missing, db))
    return None


def _refusal(items: list, tables: Mapping[str, TableKeys], db: str, nested: bool = False) -> str | None:
    for block in query_blocks(items):
        parts = [block.clauses.get("FROM", []), block.select] + [
            block.clauses.get(c, []) for c in ("WHERE", "GROUP", "HAVING", "ORDER")
        ]
        for part in parts:
            for inner in nested_queries(part):
                refusal = _refusal(inner.items, tables, db, nested=True)
                if refusal is not None:
                    return refusal
        refusal = _refusal_of_block(block, tables, db, nested)
        if refusal is not None:
            return refusal
    return None


_MAYBE_AGGREGATED = re.compile(r"\bGROUP\s+BY\b|\b(?:" + "|".join(sorted(AGGREGATES)) + r")\s*\(", re.I)


def group_by_refusal(statement: str, tables: Mapping[str, TableKeys], db: str) -> str | None:
    """MySQL 8's ONLY_FULL_GROUP_BY error for `statement` on database `db` (its tables' keys in `tables`,
    by lower-case name), or None where MySQL would run it or the reading is unsure."""
    if not _MAYBE_AGGREGATED.search(statement):
        return None
    tokens = [t for t in sql_tokens(statement) if not is_filler(t)]
    while tokens and tokens[-1] == ";":
        tokens.pop()
    if not tokens or tokens[0].upper() != "SELECT" and tokens[0] != "(":
        return None
    try:
        return _refusal(nest(tokens), tables, db)
    except Unsure:
        return None
