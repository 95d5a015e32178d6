"""MySQL 8's unsorted GROUP BY on MariaDB: `ORDER BY NULL` added where a GROUP BY has no ORDER BY.

MariaDB, like MySQL before 8.0, sorts a GROUP BY's groups by the grouped columns unless the query says
`ORDER BY NULL`; MySQL 8 (InterCode's server) returns them unsorted, in the order the groups were met.
Rows in a different order score less (InterCode's reward scales by Kendall's tau), so the server backend adds
`ORDER BY NULL` to each SELECT that groups without ordering: at the end of its scope (a statement or a
parenthesised subquery), before its LIMIT. SELECTs joined by UNION, INTERSECT or EXCEPT without parentheses
are left alone (an ORDER BY there would apply to the whole). The statement is read token by token (quoted
strings, identifiers and comments kept whole), in linear time; a statement the addition makes invalid is run
as written by the caller.
"""

from __future__ import annotations

import dataclasses
import re

_TOKEN = re.compile(
    r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|`[^`]*`|--[^\n]*|\#[^\n]*|/\*.*?\*/|\w+|\s+|.""", re.S
)
SET_OPERATIONS = frozenset({"UNION", "INTERSECT", "EXCEPT"})
UNSORTED = "ORDER BY NULL"


@dataclasses.dataclass
class _Scope:
    groups: bool = False
    orders: bool = False
    set_operation: bool = False
    limit_at: int | None = None  # token index of this scope's LIMIT


def is_filler(token: str) -> bool:
    """A space or a comment: no part of the statement."""
    return token.isspace() or token.startswith(("--", "#", "/*"))


def sql_tokens(sql: str) -> list[str]:
    """`sql` as tokens: quoted strings, identifiers and comments whole, spaces kept, in linear time."""
    return [match.group(0) for match in _TOKEN.finditer(sql)]


def unsorted_group_by(sql: str) -> str:
    """`sql` with `ORDER BY NULL` after every GROUP BY ... [HAVING ...] that no ORDER BY follows."""
    tokens = sql_tokens(sql)
    words = [token.upper() for token in tokens]
    following = [""] * len(tokens)  # the next token that is not a space or a comment
    upcoming = ""
    for index in range(len(tokens) - 1, -1, -1):
        following[index] = upcoming
        if not is_filler(tokens[index]):
            upcoming = words[index]
    inserts: list[tuple[int, str]] = []  # (token index, text to put before it)

    def close(scope: _Scope, end: int) -> None:
        if scope.groups and not scope.orders and not scope.set_operation:
            at_limit = scope.limit_at is not None  # "... GROUP BY a |LIMIT 1": a space before it already
            inserts.append((scope.limit_at, UNSORTED + " ") if at_limit else (end, " " + UNSORTED))

    scopes = [_Scope()]
    for index, word in enumerate(words):
        scope = scopes[-1]
        if word == "(":
            scopes.append(_Scope())
        elif word == ")" and len(scopes) > 1:
            close(scopes.pop(), index)
        elif word == "GROUP" and following[index] == "BY":
            scope.groups = True
        elif word == "ORDER" and following[index] == "BY":
            scope.orders = True
        elif word == "LIMIT" and scope.limit_at is None:
            scope.limit_at = index
        elif word in SET_OPERATIONS:
            scope.set_operation = True
    end = len(tokens)
    while end and (tokens[end - 1] == ";" or is_filler(tokens[end - 1])):
        end -= 1
    close(scopes[0], end)
    for index, text in sorted(inserts, reverse=True):
        tokens.insert(index, text)
    return "".join(tokens)
