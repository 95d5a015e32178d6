"""Action patterns, the unit of CoEvolve's rare signal (paper section 3.1 (3)), one definition per environment.

A trajectory's pattern set is what its actions do, named coarsely enough that the same skill in another task
reads the same, and finely enough that skills differ:

* built-in: the verb with the fixture it works on (`put THING in stove`, `use knife on THING`, `mix bowl`):
  rooms, containers and food are placeholders, the stove, freezer, bowl and knife are named;
* InterCode-SQL: the clause kinds of its statements (`join`, `group by`, `having`, `subquery`, `count`, `like`,
  `intersect`, `describe`, ...), read from the SQL with string literals blanked out;
* BFCL: the functions called (`cd`) and each pair of consecutive calls (`cd > mkdir`).

All three live in this one module rather than in the environment packages because a pattern is CoEvolve's
notion, not the environment's (environments import nothing above `envs`), because extraction reads only the
action text and must not need the environment itself (BFCL's takes seconds to build and a package to
install), and so that the three definitions can be compared side by side. Each is a pure function of the
parsed actions; `trajectory_patterns` picks one by the trajectory's environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from coevo_jax.data.records import Trajectory
from coevo_jax.envs.bfcl.calls import parse_call_list
from coevo_jax.envs.builtin.tasks import CONTAINERS
from coevo_jax.envs.builtin.world import BOWL, FREEZER, KNIFE, ROOMS, STOVE, parse
from coevo_jax.react import parse_action

BUILTIN_FIXTURES = (STOVE, FREEZER, BOWL, KNIFE)


def _builtin_operand(name: str) -> str:
    if name in BUILTIN_FIXTURES:
        return name
    return "ROOM" if name in ROOMS else "CONTAINER" if name in CONTAINERS else "THING"


def builtin_pattern(action: str) -> str | None:
    """The verb of one built-in action with its fixtures named (`put THING in stove`), None if no verb fits."""
    parsed = parse(action)
    if parsed is None:
        return None
    verb, operands = parsed
    return verb.template.format(*(_builtin_operand(name) for name in operands))


def builtin_patterns(actions: Iterable[str]) -> frozenset[str]:
    return frozenset(p for p in map(builtin_pattern, actions) if p is not None)


_SQL_STRING = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"")
_SQL_KINDS = (
    ("show tables", re.compile(r"^SHOW\s+(?:FULL\s+)?TABLES\b")),
    ("describe", re.compile(r"^(?:DESCRIBE|DESC|SHOW\s+(?:FULL\s+)?(?:COLUMNS|FIELDS))\b")),
    ("select", re.compile(r"\bSELECT\b")),
    ("distinct", re.compile(r"\bDISTINCT\b")),
    ("join", re.compile(r"\bJOIN\b")),
    ("where", re.compile(r"\bWHERE\b")),
    ("group by", re.compile(r"\bGROUP\s+BY\b")),
    ("having", re.compile(r"\bHAVING\b")),
    ("order by", re.compile(r"\bORDER\s+BY\b")),
    ("limit", re.compile(r"\bLIMIT\b")),
    ("union", re.compile(r"\bUNION\b")),
    ("intersect", re.compile(r"\bINTERSECT\b")),
    ("except", re.compile(r"\bEXCEPT\b")),
    ("count", re.compile(r"\bCOUNT\s*\(")),
    ("sum", re.compile(r"\bSUM\s*\(")),
    ("avg", re.compile(r"\bAVG\s*\(")),
    ("min/max", re.compile(r"\b(?:MIN|MAX)\s*\(")),
    ("like", re.compile(r"\bLIKE\b")),
    ("between", re.compile(r"\bBETWEEN\b")),
    ("in", re.compile(r"\bIN\s*\(")),
    ("not", re.compile(r"\bNOT\b")),
)
_SUBQUERY = re.compile(r"\(\s*SELECT\b")


def sql_statement_patterns(statement: str) -> frozenset[str]:
    """The clause kinds of one SQL statement (string literals blanked first, so their words do not count)."""
    text = _SQL_STRING.sub("''", statement.strip().rstrip(";")).upper()
    kinds = {name for name, pattern in _SQL_KINDS if pattern.search(text)}
    if _SUBQUERY.search(text):
        kinds.add("subquery")
    return frozenset(kinds)


def intercode_sql_patterns(actions: Iterable[str]) -> frozenset[str]:
    return frozenset(kind for action in actions for kind in sql_statement_patterns(action))


def bfcl_calls(action: str) -> list[str]:
    """The names of the functions one BFCL action calls, in order ([] for `[]` or text that is no call list)."""
    try:
        calls = parse_call_list(action)
    except ValueError:
        return []
    return [call.func.id for call in calls if hasattr(call.func, "id")]


def bfcl_patterns(actions: Iterable[str]) -> frozenset[str]:
    names = [name for action in actions for name in bfcl_calls(action)]
    return frozenset(names) | {f"{a} > {b}" for a, b in zip(names, names[1:], strict=False)}


PATTERNS: dict[str, Callable[[Iterable[str]], frozenset[str]]] = {
    "bfcl": bfcl_patterns,
    "builtin": builtin_patterns,
    "intercode_sql": intercode_sql_patterns,
}


def patterns_for(env_name: str) -> Callable[[Iterable[str]], frozenset[str]]:
    """The pattern function of an environment; ValueError naming the ones defined."""
    if env_name not in PATTERNS:
        raise ValueError(f"no action patterns for environment {env_name!r}; defined for {sorted(PATTERNS)}")
    return PATTERNS[env_name]


def parsed_actions(trajectory: Trajectory) -> list[str]:
    """The trajectory's actions as the environment read them (replies without `Action:` left out)."""
    return [action for action in map(parse_action, trajectory.actions) if action]


def trajectory_patterns(trajectory: Trajectory, env_name: str | None = None) -> frozenset[str]:
    """The pattern set of a trajectory, by `env_name` or else the trajectory's own `env`."""
    return patterns_for(env_name or trajectory.env)(parsed_actions(trajectory))
