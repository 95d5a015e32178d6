"""How the agent's SQL is read and its results shown, as InterCode's MySQL server read and showed them.

- `normalize_action`: the statement in an action (code fences and one trailing ';' dropped);
- the statements SQLite lacks and MySQL answers from its catalogue (`SHOW TABLES [LIKE ...]` with
  `like_match`, `SHOW DATABASES`, `DESCRIBE t` and its spellings, `USE db`), as patterns the environment
  matches;
- `mysql_error_message`: SQLite's most common error messages reworded as MySQL's, and
  `mariadb_error_message` MariaDB's where its words differ from MySQL's;
- `render_output`: the observation, `str()` of the result rows, cut past a size limit.
"""

from __future__ import annotations

import re

from coevo_jax.envs.intercode_sql.sandbox import TruncatedRows

# The databases of InterCode's MySQL server, system schemas included, as SHOW DATABASES lists them.
SYSTEM_SCHEMAS = ("information_schema", "mysql", "performance_schema", "sys")

DESCRIBE = re.compile(
    r"^(?:DESCRIBE|DESC|EXPLAIN|SHOW\s+(?:FULL\s+)?(?:COLUMNS|FIELDS)\s+(?:FROM|IN))\s+`?(\w+)`?$", re.I
)
SHOW_TABLES = re.compile(r"^SHOW\s+(?:FULL\s+)?TABLES(?:\s+LIKE\s+'([^']*)')?$", re.I)
SHOW_DATABASES = re.compile(r"^SHOW\s+(?:DATABASES|SCHEMAS)$", re.I)
USE = re.compile(r"^USE\s+`?(\w+)`?$", re.I)
_SYNTAX_ERROR = (
    "You have an error in your SQL syntax; check the manual that corresponds to your MySQL server "
    "version for the right syntax to use near '{0}' at line 1"
)


def missing_table(db: str, table: str) -> str:
    return f"Table '{db}.{table.lower()}' doesn't exist"  # the server stored names in lower case


# SQLite message pattern -> MySQL message from (match, db).
_SQLITE_TO_MYSQL = tuple(
    (re.compile(pattern, re.S), reword)
    for pattern, reword in (
        (r"^no such table: (?:\w+\.)?(\w+)$", lambda m, db: missing_table(db, m[1])),
        (r"^no such column: (.+)$", lambda m, db: f"Unknown column '{m[1]}' in 'field list'"),
        (r"^ambiguous column name: (.+)$", lambda m, db: f"Column '{m[1]}' in field list is ambiguous"),
        (r'^near "(.*)": syntax error$', lambda m, db: _SYNTAX_ERROR.format(m[1])),
        (r"^incomplete input$", lambda m, db: _SYNTAX_ERROR.format("")),
        (
            r"^(?:not authorized.*|authorization denied)$",
            lambda m, db: "command denied: the database is read-only",
        ),
    )
)


def mysql_error_message(message: str, db: str) -> str:
    """SQLite's error text in MySQL's wording where one is known (what InterCode's agents were shown)."""
    for pattern, reword in _SQLITE_TO_MYSQL:
        match = pattern.match(message)
        if match:
            return reword(match, db)
    return message


# MariaDB names the clause of an unknown or ambiguous column by its keyword, MySQL by these words.
_MYSQL_CLAUSE_NAMES = {
    "SELECT": "field list",
    "WHERE": "where clause",
    "ON": "on clause",
    "HAVING": "having clause",
    "ORDER BY": "order clause",
    "GROUP BY": "group statement",
    "IN/ALL/ANY": "IN/ALL/ANY subquery",
}
_MARIADB_CLAUSE = re.compile(
    r"^(Unknown column '.*' in '|Column '.*' in )([A-Z/ ]+?)('$| is ambiguous$)", re.S
)
# An unknown function is looked up as a stored routine, which the read-only account may not execute.
_MARIADB_ROUTINE = re.compile(r"^execute command denied to user '[^']*'@'[^']*' for routine '([^']+)'$")


def mariadb_error_message(message: str) -> str:
    """MariaDB's error text in MySQL's words where they differ only in naming (the clause of a column, the
    server's name, an unknown function), as InterCode's agents read it; other messages are MariaDB's own."""
    routine = _MARIADB_ROUTINE.match(message)
    if routine:  # the Spider databases have no routines: the function does not exist
        return f"FUNCTION {routine[1]} does not exist"
    match = _MARIADB_CLAUSE.match(message)
    if match and match[2] in _MYSQL_CLAUSE_NAMES:
        return match[1] + _MYSQL_CLAUSE_NAMES[match[2]] + match[3]
    return message.replace("your MariaDB server version", "your MySQL server version").replace(
        "This version of MariaDB", "This version of MySQL"
    )


_ANY_RUN, _ANY_ONE = "%", "_"  # LIKE's wildcards, as tokens; a literal character is a (char,) tuple


def _like_tokens(pattern: str) -> list:
    """LIKE's pattern as tokens: runs of % collapsed into one, backslash-escaped characters literal."""
    tokens, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            tokens.append((pattern[i + 1].lower(),))
            i += 2
            continue
        if ch == "%":
            if not tokens or tokens[-1] != _ANY_RUN:
                tokens.append(_ANY_RUN)
        else:
            tokens.append(_ANY_ONE if ch == "_" else (ch.lower(),))
        i += 1
    return tokens


def like_match(pattern: str, text: str) -> bool:
    """`text LIKE pattern` without case (% any run, _ any one character, backslash escapes).

    The greedy wildcard match with one resume point: at most len(pattern) * len(text) steps, where a
    backtracking regular expression took exponential time on '%%%...%z'.
    """
    tokens, chars = _like_tokens(pattern), [ch.lower() for ch in text]
    if sum(token != _ANY_RUN for token in tokens) > len(chars):
        return False
    t = p = 0
    star, resume = -1, 0  # the last % seen, and where in the text its run ends for now
    while t < len(chars):
        token = tokens[p] if p < len(tokens) else None
        if token == _ANY_RUN:
            star, resume, p = p, t, p + 1
        elif token is not None and (token == _ANY_ONE or token[0] == chars[t]):
            p, t = p + 1, t + 1
        elif star >= 0:
            resume += 1
            p, t = star + 1, resume
        else:
            return False
    return all(token == _ANY_RUN for token in tokens[p:])


def normalize_action(action: str) -> str:
    """The statement to run: code fences and surrounding whitespace removed, one trailing ';' dropped.

    A fence is "```", an optional `sql`/`mysql` tag, the statement and "```"; read with string tests, in
    linear time (the regular expression this replaces backtracked cubically on a fence of newlines).
    """
    text = action.strip()
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):
        inner = text[3:-3]
        for tag in ("sql", "mysql"):
            if inner[: len(tag)].lower() == tag:
                inner = inner[len(tag) :]
                break
        text = inner.strip()
    return text[:-1].rstrip() if text.endswith(";") else text


def render_output(output: list | str | None, max_chars: int | None = None) -> str:
    """The observation for a statement's output: `str()` of the rows, as InterCode shows them.

    Built row by row and stopped past `max_chars` (cut there, " ... (truncated)" added), so a large result
    is never turned into text whole; rows the sandbox stopped fetching (`TruncatedRows`) are said to be cut.
    """
    if not isinstance(output, list):
        text = str(output)
    else:
        pieces, length = [], 1  # the length of "[" and the pieces joined so far
        for row in output:
            pieces.append(repr(row))
            length += len(pieces[-1]) + (2 if len(pieces) > 1 else 0)
            if max_chars is not None and length > max_chars:
                break
        text = "[" + ", ".join(pieces) + "]"
    if max_chars is not None and len(text) > max_chars:
        return text[:max_chars] + " ... (truncated)"
    if isinstance(output, TruncatedRows):
        return (
            f"{text} ... (truncated: the result is larger than {output.max_result_bytes} bytes; "
            f"only its first {len(output)} rows were fetched)"
        )
    return text
