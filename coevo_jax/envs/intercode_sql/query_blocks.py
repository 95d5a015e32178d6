"""A SELECT statement read into its query blocks, for the ONLY_FULL_GROUP_BY check (`full_group_by`).

The tokens are nested at parentheses; each query block (parenthesised subqueries, UNION/INTERSECT/EXCEPT
operands, derived tables) is split into its clauses, its SELECT list into (expression, alias) items and its
FROM clause into table instances and ON conditions. Whatever the reading does not model raises `Unsure`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from coevo_jax.envs.intercode_sql.group_by import SET_OPERATIONS

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
_MAX_DEPTH = 64  # parentheses nested deeper than this are not read (the reading recurses per level)


@dataclasses.dataclass(frozen=True)
class TableKeys:
    """A base table as the check needs it: its column names as declared, and the column sets of its keys
    (the primary key and unique keys over NOT NULL columns) in lower case."""

    columns: tuple[str, ...]
    keys: tuple[frozenset[str], ...]


class Unsure(Exception):
    """The statement holds something this reading does not model: refuse nothing."""


@dataclasses.dataclass
class _Group:
    """A parenthesised part of the statement, its tokens (and nested groups) without spaces or comments."""

    items: list

    def is_query(self) -> bool:
        return bool(self.items) and isinstance(self.items[0], str) and self.items[0].upper() == "SELECT"


@dataclasses.dataclass
class Instance:
    """A table in a FROM clause: its name in the query (alias, else the table's name), and its columns."""

    name: str  # lower case: InterCode's server has lower_case_table_names=1
    columns: dict[str, str]  # lower case -> as declared
    keys: tuple[frozenset[str], ...]


@dataclasses.dataclass
class Block:
    """One SELECT: its clauses' tokens, split at the top level."""

    select: list
    clauses: dict[str, list]
    in_set_operation: bool


def nest(tokens: list[str]) -> list:
    stack: list[list] = [[]]
    for token in tokens:
        if token == "(":
            stack.append([])
            if len(stack) > _MAX_DEPTH:
                raise Unsure
        elif token == ")":
            if len(stack) == 1:
                raise Unsure
            inner = stack.pop()
            stack[-1].append(_Group(inner))
        else:
            stack[-1].append(token)
    if len(stack) != 1:
        raise Unsure
    return stack[0]


def _word(item) -> str:
    return item.upper() if isinstance(item, str) else ""


def is_literal(item) -> bool:
    return isinstance(item, str) and (item[:1] in "'\"" or bool(_NUMBER.match(item)))


def identifier(item) -> str | None:
    """The name an identifier token stands for (backticks removed), else None."""
    if not isinstance(item, str):
        return None
    if item.startswith("`") and item.endswith("`") and len(item) >= 2:
        return item[1:-1]
    if _IDENTIFIER.match(item) and item.upper() not in _KEYWORDS:
        return item
    return None


def split(items: list, separator: str) -> list[list]:
    parts: list[list] = [[]]
    for item in items:
        if item == separator:
            parts.append([])
        else:
            parts[-1].append(item)
    return parts


def query_blocks(items: list, in_set_operation: bool = False) -> list[Block]:
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
            blocks.extend(query_blocks(operand[0].items, several))
            continue
        if not operand or _word(operand[0]) != "SELECT":
            raise Unsure
        blocks.append(_block(operand, several))
    return blocks


def _block(items: list, in_set_operation: bool) -> Block:
    clauses: dict[str, list] = {"SELECT": []}
    current = "SELECT"
    index = 1
    while index < len(items):
        word = _word(items[index])
        if word in _UNSURE_WORDS:
            raise Unsure
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
    return Block(select, clauses, in_set_operation)


def nested_queries(items: list) -> list[_Group]:
    """Subqueries anywhere in `items`, outermost first, in textual order."""
    found = []
    for item in items:
        if isinstance(item, _Group):
            first = item.items[0] if item.items else None
            if item.is_query() or (isinstance(first, _Group) and first.is_query()):
                found.append(item)
            else:
                found.extend(nested_queries(item.items))
    return found


def select_items(select: list) -> list[tuple[list, str | None]]:
    """(expression, alias) of each SELECT list item."""
    result = []
    for part in split(select, ","):
        if not part:
            raise Unsure
        alias = None
        if len(part) >= 3 and _word(part[-2]) == "AS":
            alias, part = part[-1], part[:-2]
        elif (
            len(part) >= 2
            and isinstance(part[-1], str)
            and (identifier(part[-1]) or part[-1][:1] in "'\"")
            and part[-2] != "."
        ):
            previous = part[-2]
            if (
                isinstance(previous, _Group)
                or is_literal(previous)
                or identifier(previous)
                or (_word(previous) in ("END", "NULL"))
            ):
                alias, part = part[-1], part[:-1]
        if alias is not None:
            alias = alias.strip("`'\"")
        result.append((part, alias))
    return result


def table_instances(from_items: list, tables: Mapping[str, TableKeys]) -> tuple[list[Instance], list[list]]:
    """The FROM clause's table instances and its ON conditions."""
    instances: list[Instance] = []
    conditions: list[list] = []
    index, end = 0, len(from_items)
    join_words = {"JOIN", "INNER", "CROSS", "LEFT", "RIGHT", "OUTER", "STRAIGHT_JOIN"}
    while index < end:
        item = from_items[index]
        if isinstance(item, _Group):
            if not item.is_query():
                raise Unsure  # a parenthesised join
            name, columns, keys = None, _derived_columns(item), ()
        else:
            name = identifier(item)
            if name is None:
                raise Unsure
            if index + 2 < end and from_items[index + 1] == ".":
                raise Unsure  # another database's table
            table = tables.get(name.lower())
            if table is None:
                raise Unsure
            columns, keys = {c.lower(): c for c in table.columns}, table.keys
        index += 1
        if index < end and _word(from_items[index]) == "AS":
            index += 1
        if (
            index < end
            and identifier(from_items[index])
            and _word(from_items[index]) not in join_words | {"ON"}
        ):
            alias = identifier(from_items[index])
            index += 1
        elif name is None:
            raise Unsure  # a derived table needs its alias
        else:
            alias = name
        instances.append(Instance(alias.lower(), columns, keys))
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
        elif index < end and not isinstance(from_items[index], _Group) and not identifier(from_items[index]):
            raise Unsure
    if not instances:
        raise Unsure
    return instances, conditions


def _derived_columns(group: _Group) -> dict[str, str]:
    """The output names of a derived table (the first operand's SELECT list)."""
    block = query_blocks(group.items)[0]
    names = {}
    for expression, alias in select_items(block.select):
        if alias is None:
            if len(expression) == 1 and identifier(expression[0]):
                alias = identifier(expression[0])
            elif len(expression) == 3 and expression[1] == "." and identifier(expression[2]):
                alias = identifier(expression[2])
            else:
                raise Unsure
        names[alias.lower()] = alias
    return names


def references(items: list) -> tuple[list[list[str]], bool]:
    """Column references outside aggregates and subqueries, and whether an aggregate occurs."""
    found: list[list[str]] = []
    aggregated = False
    index = 0
    while index < len(items):
        item = items[index]
        following = items[index + 1] if index + 1 < len(items) else None
        if isinstance(item, _Group):
            if not item.is_query():
                inner, inner_aggregated = references(item.items)
                found.extend(inner)
                aggregated |= inner_aggregated
            index += 1
            continue
        word = _word(item)
        if isinstance(following, _Group) and _IDENTIFIER.match(item) and word not in _KEYWORDS:
            if word in AGGREGATES:
                aggregated = True
            else:
                inner, inner_aggregated = references(_cast_free(word, following.items))
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
        name = identifier(item)
        if name is not None:
            parts = [name]
            index += 1
            while index + 1 < len(items) and items[index] == "." and identifier(items[index + 1]):
                parts.append(identifier(items[index + 1]))
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


def conjuncts(condition: list) -> list[list]:
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


def undirected(part: list) -> list:
    """A GROUP BY / ORDER BY item without its ASC / DESC."""
    while part and _word(part[-1]) in ("ASC", "DESC"):
        part = part[:-1]
    return part


def canonical_text(items: list) -> str:
    return " ".join(canonical_text(i.items) if isinstance(i, _Group) else i.upper() for i in items)
