"""MySQL 8's ONLY_FULL_GROUP_BY refusals, for backends that answer what MySQL refuses (SQLite, MariaDB).

InterCode's MySQL 8 server refuses an aggregated query whose SELECT list (or, when it groups, ORDER BY)
names a column that is neither aggregated nor determined by the GROUP BY columns, and so scores 0 on any task
whose gold query it refused. MySQL decides "determined" by functional dependence: a grouped column, a column
equal to a determined column or to a constant (WHERE and ON equalities), every column of a table instance
whose primary key (or a unique key over NOT NULL columns) is determined. MariaDB's own ONLY_FULL_GROUP_BY
knows no functional dependence (it refuses 107 of InterCode's 1,034 gold queries, most of which MySQL
answered) and SQLite has none, so `group_by_refusal` reproduces MySQL's decision from the statement and the
database's keys, with MySQL's error message.

The statement is read token by token into its query blocks (parenthesised subqueries, UNION/INTERSECT/EXCEPT
operands, derived tables), inner blocks first as MySQL prepares them. Where the reading is unsure (a
column it cannot resolve, a CTE, NATURAL or USING joins, window functions, WITH ROLLUP, a table of another
database) it refuses nothing: the statement then runs as the backend answers it, as before.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from coevo_jax.envs.intercode_sql.group_by import SET_OPERATIONS, is_filler, sql_tokens

AGGREGATES = frozenset(
    "COUNT SUM AVG MIN MAX GROUP_CONCAT STD STDDEV STDDEV_POP STDDEV_SAMP VARIANCE VAR_POP VAR_SAMP "
    "BIT_AND BIT_OR BIT_XOR JSON_ARRAYAGG JSON_OBJECTAGG".split()
)
_KEYWORDS = frozenset(
    "AND OR NOT XOR NULL IS IN LIKE REGEXP RLIKE BETWEEN CASE WHEN THEN ELSE END AS DISTINCT DISTINCTROW ALL "
    "ASC DESC TRUE FALSE INTERVAL DIV MOD BINARY COLLATE ESCAPE SOUNDS UNKNOWN ANY SOME EXISTS SELECT FROM "
    "WHERE GROUP BY HAVING ORDER LIMIT OFFSET JOIN INNER LEFT RIGHT OUTER CROSS ON USING UNION INTERSECT "
    "EXCEPT CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP LOCALTIME LOCALTIMESTAMP UTC_DATE UTC_TIME "
    "UTC_TIMESTAMP HIGH_PRIORITY STRAIGHT_JOIN SQL_SMALL_RESULT SQL_BIG_RESULT SQL_BUFFER_RESULT "
    "SQL_NO_CACHE SQL_CALC_FOUND_ROWS".split()
)
_SELECT_MODIFIERS = frozenset(
    "ALL DISTINCT DISTINCTROW HIGH_PRIORITY STRAIGHT_JOIN SQL_SMALL_RESULT SQL_BIG_RESULT SQL_BUFFER_RESULT "
    "SQL_NO_CACHE SQL_CALC_FOUND_ROWS".split()
)
_CLAUSES = ("FROM", "WHERE", "GROUP", "HAVING", "WINDOW", "ORDER", "LIMIT", "INTO", "FOR", "LOCK")
_UNSURE_WORDS = frozenset({"OVER", "ROLLUP", "NATURAL", "USING", "WITH", "INDEX", "KEY", "PARTITION"})
_NUMBER = re.compile(r"\d+(\.\d*)?([eE][-+]?\d+)?$|\.\d+$")
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*$")
_OUTER_REFERENCE = ("outer",)  # a column of an enclosing query block: constant within this one
_INCOMPATIBLE = "this is incompatible with sql_mode=only_full_group_by"
_MAX_DEPTH = 64  # parentheses nested deeper than this are not read (the reading recurses per level)


@dataclasses.dataclass(frozen=True)
class TableKeys:
    """A base table as the check needs it: its column names as declared, and the column sets of its keys
    (the primary key and unique keys over NOT NULL columns) in lower case."""

    columns: tuple[str, ...]
    keys: tuple[frozenset[str], ...]


class _Unsure(Exception):
    """The statement holds something this reading does not model: refuse nothing."""


@dataclasses.dataclass
class _Group:
    """A parenthesised part of the statement, its tokens (and nested groups) without spaces or comments."""

    items: list

    def is_query(self) -> bool:
        return bool(self.items) and isinstance(self.items[0], str) and self.items[0].upper() == "SELECT"


@dataclasses.dataclass
class _Instance:
    """A table in a FROM clause: its name in the query (alias, else the table's name), and its columns."""

    name: str  # lower case: InterCode's server has lower_case_table_names=1
    columns: dict[str, str]  # lower case -> as declared
    keys: tuple[frozenset[str], ...]


@dataclasses.dataclass
class _Block:
    """One SELECT: its clauses' tokens, split at the top level."""

    select: list
    clauses: dict[str, list]
    in_set_operation: bool


def _nest(tokens: list[str]) -> list:
    stack: list[list] = [[]]
    for token in tokens:
        if token == "(":
            stack.append([])
            if len(stack) > _MAX_DEPTH:
                raise _Unsure
        elif token == ")":
            if len(stack) == 1:
                raise _Unsure
            inner = stack.pop()
            stack[-1].append(_Group(inner))
        else:
            stack[-1].append(token)
    if len(stack) != 1:
        raise _Unsure
    return stack[0]


def _word(item) -> str:
    return item.upper() if isinstance(item, str) else ""


def _is_literal(item) -> bool:
    return isinstance(item, str) and (item[:1] in "'\"" or bool(_NUMBER.match(item)))


def _identifier(item) -> str | None:
    """The name an identifier token stands for (backticks removed), else None."""
    if not isinstance(item, str):
        return None
    if item.startswith("`") and item.endswith("`") and len(item) >= 2:
        return item[1:-1]
    if _IDENTIFIER.match(item) and item.upper() not in _KEYWORDS:
        return item
    return None


def _split(items: list, separator: str) -> list[list]:
    parts: list[list] = [[]]
    for item in items:
        if item == separator:
            parts.append([])
        else:
            parts[-1].append(item)
    return parts


def _blocks(items: list, in_set_operation: bool = False) -> list[_Block]:
    """The SELECT blocks of a query's top level (operands of set operations in order)."""
    operands: list[list] = [[]]
    for item in items:
        if _word(item) in SET_OPERATIONS:
            operands.append([])
        elif _word(item) in ("ALL", "DISTINCT") and not operands[-1] and len(operands) > 1:
            continue  # UNION ALL / UNION DISTINCT
        else:
            operands[-1].append(item)
    several = len(operands) > 1 or in_set_operation
    blocks = []
    for operand in operands:
        if len(operand) >= 1 and isinstance(operand[0], _Group) and operand[0].is_query():
            blocks.extend(_blocks(operand[0].items, several))
            continue
        if not operand or _word(operand[0]) != "SELECT":
            raise _Unsure
        blocks.append(_block(operand, several))
    return blocks


def _block(items: list, in_set_operation: bool) -> _Block:
    clauses: dict[str, list] = {"SELECT": []}
    current = "SELECT"
    index = 1
    while index < len(items):
        word = _word(items[index])
        if word in _UNSURE_WORDS:
            raise _Unsure
        following = _word(items[index + 1]) if index + 1 < len(items) else ""
        if word in _CLAUSES and (word not in ("GROUP", "ORDER") or following == "BY"):
            current = word
            clauses[current] = []
            index += 2 if word in ("GROUP", "ORDER") else 1
            continue
        clauses[current].append(items[index])
        index += 1
    select = clauses.pop("SELECT")
    while select and _word(select[0]) in _SELECT_MODIFIERS:
        select = select[1:]
    return _Block(select, clauses, in_set_operation)


def _nested_queries(items: list) -> list[_Group]:
    """Subqueries anywhere in `items`, outermost first, in textual order."""
    found = []
    for item in items:
        if isinstance(item, _Group):
            first = item.items[0] if item.items else None
            if item.is_query() or (isinstance(first, _Group) and first.is_query()):
                found.append(item)
            else:
                found.extend(_nested_queries(item.items))
    return found


def _select_items(select: list) -> list[tuple[list, str | None]]:
    """(expression, alias) of each SELECT list item."""
    result = []
    for part in _split(select, ","):
        if not part:
            raise _Unsure
        alias = None
        if len(part) >= 3 and _word(part[-2]) == "AS":
            alias, part = part[-1], part[:-2]
        elif (
            len(part) >= 2
            and isinstance(part[-1], str)
            and (_identifier(part[-1]) or part[-1][:1] in "'\"")
            and part[-2] != "."
        ):
            previous = part[-2]
            if (
                isinstance(previous, _Group)
                or _is_literal(previous)
                or _identifier(previous)
                or (_word(previous) in ("END", "NULL"))
            ):
                alias, part = part[-1], part[:-1]
        if alias is not None:
            alias = alias.strip("`'\"")
        result.append((part, alias))
    return result


def _instances(from_items: list, tables: Mapping[str, TableKeys]) -> tuple[list[_Instance], list[list]]:
    """The FROM clause's table instances and its ON conditions."""
    instances: list[_Instance] = []
    conditions: list[list] = []
    index, end = 0, len(from_items)
    join_words = {"JOIN", "INNER", "CROSS", "LEFT", "RIGHT", "OUTER", "STRAIGHT_JOIN"}
    while index < end:
        item = from_items[index]
        if isinstance(item, _Group):
            if not item.is_query():
                raise _Unsure  # a parenthesised join
            name, columns, keys = None, _derived_columns(item), ()
        else:
            name = _identifier(item)
            if name is None:
                raise _Unsure
            if index + 2 < end and from_items[index + 1] == ".":
                raise _Unsure  # another database's table
            table = tables.get(name.lower())
            if table is None:
                raise _Unsure
            columns, keys = {c.lower(): c for c in table.columns}, table.keys
        index += 1
        if index < end and _word(from_items[index]) == "AS":
            index += 1
        if (
            index < end
            and _identifier(from_items[index])
            and _word(from_items[index]) not in join_words | {"ON"}
        ):
            alias = _identifier(from_items[index])
            index += 1
        elif name is None:
            raise _Unsure  # a derived table needs its alias
        else:
            alias = name
        instances.append(_Instance(alias.lower(), columns, keys))
        # what joins it to the next: its ON condition, join words or a comma
        if index < end and _word(from_items[index]) == "ON":
            start = index = index + 1
            while index < end and _word(from_items[index]) not in join_words and from_items[index] != ",":
                index += 1
            conditions.append(from_items[start:index])
        while index < end and _word(from_items[index]) in join_words:
            index += 1
        if index < end and from_items[index] == ",":
            index += 1
        elif index < end and not isinstance(from_items[index], _Group) and not _identifier(from_items[index]):
            raise _Unsure
    if not instances:
        raise _Unsure
    return instances, conditions


def _derived_columns(group: _Group) -> dict[str, str]:
    """The output names of a derived table (the first operand's SELECT list)."""
    block = _blocks(group.items)[0]
    names = {}
    for expression, alias in _select_items(block.select):
        if alias is None:
            if len(expression) == 1 and _identifier(expression[0]):
                alias = _identifier(expression[0])
            elif len(expression) == 3 and expression[1] == "." and _identifier(expression[2]):
                alias = _identifier(expression[2])
            else:
                raise _Unsure
        names[alias.lower()] = alias
    return names


class _Scope:
    """Resolves column references of one query block."""

    def __init__(self, instances: list[_Instance], aliases: set[str], *, nested: bool):
        self.instances = {i.name: i for i in instances}
        if len(self.instances) != len(instances):
            raise _Unsure
        self.aliases = aliases
        self.nested = nested  # only a subquery's names may belong to an enclosing block

    def resolve(self, parts: list[str]) -> tuple[str, str] | tuple:
        """(instance, column in lower case) of a reference, `_OUTER_REFERENCE`, or raises _Unsure."""
        if len(parts) == 3:
            raise _Unsure
        if len(parts) == 2:
            instance = self.instances.get(parts[0].lower())
            if instance is None:
                if not self.nested:
                    raise _Unsure  # MySQL's "Unknown column"
                return _OUTER_REFERENCE
            if parts[1].lower() not in instance.columns:
                raise _Unsure
            return (instance.name, parts[1].lower())
        column = parts[0].lower()
        owners = [i for i in self.instances.values() if column in i.columns]
        if len(owners) == 1:
            return (owners[0].name, column)
        if owners:
            raise _Unsure  # ambiguous: MySQL's own error
        if column in self.aliases or not self.nested:
            raise _Unsure
        return _OUTER_REFERENCE

    def shown(self, reference: tuple[str, str], db: str) -> str:
        instance = self.instances[reference[0]]
        return f"{db.lower()}.{instance.name}.{instance.columns[reference[1]]}"


def _references(items: list) -> tuple[list[list[str]], bool]:
    """Column references outside aggregates and subqueries, and whether an aggregate occurs."""
    found: list[list[str]] = []
    aggregated = False
    index = 0
    while index < len(items):
        item = items[index]
        following = items[index + 1] if index + 1 < len(items) else None
        if isinstance(item, _Group):
            if not item.is_query():
                inner, inner_aggregated = _references(item.items)
                found.extend(inner)
                aggregated |= inner_aggregated
            index += 1
            continue
        word = _word(item)
        if isinstance(following, _Group) and _IDENTIFIER.match(item) and word not in _KEYWORDS:
            if word in AGGREGATES:
                aggregated = True
            else:
                inner, inner_aggregated = _references(_cast_free(word, following.items))
                found.extend(inner)
                aggregated |= inner_aggregated
            index += 2
            continue
        if word == "INTERVAL":
            index += 3  # INTERVAL <n> <unit>: the unit is no column
            continue
        if word == "AS":
            index += 2
            continue
        name = _identifier(item)
        if name is not None:
            parts = [name]
            index += 1
            while index + 1 < len(items) and items[index] == "." and _identifier(items[index + 1]):
                parts.append(_identifier(items[index + 1]))
                index += 2
            found.append(parts)
            continue
        index += 1
    return found, aggregated


def _cast_free(function: str, items: list) -> list:
    """A CAST/CONVERT's arguments without the type it names."""
    if function not in ("CAST", "CONVERT"):
        return items
    for index, item in enumerate(items):
        if _word(item) in ("AS", "USING") or (function == "CONVERT" and item == ","):
            return items[:index]
    return items


def _conjuncts(condition: list) -> list[list]:
    parts: list[list] = [[]]
    pending_between = False
    for item in condition:
        word = _word(item)
        if word == "BETWEEN":
            pending_between = True
        if word in ("AND", "&&") and not pending_between:
            parts.append([])
            continue
        if word == "AND":
            pending_between = False
        parts[-1].append(item)
    return parts


def _operand(items: list, scope: _Scope):
    """A conjunct side: 'constant', a resolved column, or None (anything else)."""
    if len(items) == 1 and _is_literal(items[0]):
        return "constant"
    if len(items) in (1, 3) and all(
        _identifier(item) if position % 2 == 0 else item == "." for position, item in enumerate(items)
    ):
        reference = scope.resolve([_identifier(item) for item in items[::2]])
        return "constant" if reference == _OUTER_REFERENCE else reference
    return None


def _determined(scope: _Scope, group_columns: set, conditions: list[list]) -> set[tuple[str, str]]:
    """The columns MySQL deems determined by `group_columns` (functional dependence)."""
    determined = set(group_columns)
    equalities = []
    for condition in conditions:
        for conjunct in _conjuncts(condition):
            sides = _split(conjunct, "=")
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


def _undirected(part: list) -> list:
    """A GROUP BY / ORDER BY item without its ASC / DESC."""
    while part and _word(part[-1]) in ("ASC", "DESC"):
        part = part[:-1]
    return part


def _not_in_group_by(number: int, clause: str, column: str) -> str:
    """MySQL's ER_WRONG_FIELD_WITH_GROUP_V2 message."""
    return (
        f"Expression #{number} of {clause} is not in GROUP BY clause and contains nonaggregated column "
        f"'{column}' which is not functionally dependent on columns in GROUP BY clause; {_INCOMPATIBLE}"
    )


def _text(items: list) -> str:
    return " ".join(_text(i.items) if isinstance(i, _Group) else i.upper() for i in items)


def _refusal_of_block(block: _Block, tables: Mapping[str, TableKeys], db: str, nested: bool) -> str | None:
    if "FROM" not in block.clauses:
        return None
    instances, on_conditions = _instances(block.clauses["FROM"], tables)
    items = _select_items(block.select)
    scope = _Scope(instances, {alias.lower() for _, alias in items if alias}, nested=nested)
    grouped = "GROUP" in block.clauses
    aggregated = grouped or any(_references(expression)[1] for expression, _ in items)
    for clause in ("HAVING", "ORDER"):
        aggregated |= _references(block.clauses.get(clause, []))[1]
    if not aggregated:
        return None
    group_columns, group_texts = set(), set()
    for part in map(_undirected, _split(block.clauses.get("GROUP", []), ",")):
        if len(part) == 1 and re.fullmatch(r"\d+", part[0]):
            position = int(part[0])
            if not 1 <= position <= len(items):
                raise _Unsure
            part = items[position - 1][0]
        group_texts.add(_text(part))
        operand = _operand(part, scope)  # a SELECT alias raises _Unsure in `resolve`
        if isinstance(operand, tuple):
            group_columns.add(operand)
    conditions = [block.clauses.get("WHERE", []), *on_conditions]
    determined = _determined(scope, group_columns, conditions)

    def first_undetermined(expression: list) -> tuple[str, str] | None:
        if _text(expression) in group_texts:
            return None
        missing = None
        for parts in _references(expression)[0]:
            reference = scope.resolve(parts)
            if reference != _OUTER_REFERENCE and reference not in determined and missing is None:
                missing = reference
        return missing

    for number, (expression, _) in enumerate(items, start=1):
        if expression == ["*"] or (len(expression) == 3 and expression[1:] == [".", "*"]):
            raise _Unsure
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
        select_texts = {_text(expression) for expression, _ in items}
        for number, part in enumerate(map(_undirected, _split(block.clauses.get("ORDER", []), ",")), start=1):
            if not part:
                continue
            if len(part) == 1 and (
                re.fullmatch(r"\d+", part[0]) or (part[0].strip("`").lower() in scope.aliases)
            ):
                continue
            if _text(part) in select_texts:
                continue
            missing = first_undetermined(part)
            if missing is not None:
                return _not_in_group_by(number, "ORDER BY clause", scope.shown(missing, db))
    return None


def _refusal(items: list, tables: Mapping[str, TableKeys], db: str, nested: bool = False) -> str | None:
    for block in _blocks(items):
        parts = [block.clauses.get("FROM", []), block.select] + [
            block.clauses.get(c, []) for c in ("WHERE", "GROUP", "HAVING", "ORDER")
        ]
        for part in parts:
            for inner in _nested_queries(part):
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
        return _refusal(_nest(tokens), tables, db)
    except _Unsure:
        return None
