"""The agent's action, a Python list of calls, read with `ast` into calls that are safe to execute.

Decoding follows BFCL's prompting decoder (`default_decode_execute_prompting`, `ast_parse`): the text is
stripped of backticks, newlines and spaces at its ends, wrapped in `[` `]` where it lacks them, stripped of
wrapping single quotes, and parsed as one Python expression: a call or a list of calls. An empty list (or an
empty action) ends the turn. Calls are then taken as BFCL's executor (`execute_multi_turn_func_call`) runs
its ground truth, whose text it evaluates: positional arguments, alone or before keyword ones
(`sort('final_report.pdf')`, `post_tweet('...', tags=['#RoadTrip'])`), bind to the function's parameters
in order, as Python binds them. These, keyword arguments and literal values are every form BFCL's
multi-turn ground truth uses (`tests/test_envs_bfcl.py` replays all 800 tasks). What differs, so that
nothing but the task's own functions ever runs:

* a call must name one of the task's functions (a method of its classes, as BFCL's executor maps them,
  held-back ones included) by its bare name; BFCL's executor would look other names up in its own globals;
* arguments are literal values: strings, numbers, booleans, None, and lists, tuples, sets and dicts of
  them; a bare name stands for its own text, as in BFCL's decoder (`cd(folder=documents)` is
  `cd(folder='documents')`). BFCL's decoder `eval`s arithmetic and lambdas; here they are refused, as are
  `*` and `**` unpacking. More positional arguments than the function has parameters, or a parameter
  given both by position and by keyword, is refused, as Python refuses it (BFCL's prompting decoder
  instead drops every positional argument without a word);
* the few arguments that would let one call run for hours (MathAPI's `power` exponent, `logarithm` and
  `square_root` precision) are bounded.

An accepted call is rewritten as `name(key=repr(value), ...)`, every argument named: that text, not the
agent's, is what BFCL's executor and checker evaluate. A refused action runs nothing; its error is the
observation.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from collections.abc import Collection

from coevo_jax.envs.bfcl.backend import function_signatures

# (function, argument) -> largest magnitude accepted: bounds what one call may cost.
ARGUMENT_LIMITS = {
    ("power", "exponent"): 1000,
    ("logarithm", "precision"): 1000,
    ("square_root", "precision"): 1000,
}
_FORMAT_HINT = "write the calls as [func_name(param_name=value, ...), ...], or [] to end your turn"


@dataclasses.dataclass(frozen=True)
class DecodedAction:
    """An action read as calls: `calls` to run, or the `error` that stopped it (then nothing runs).

    `is_call_list` says the text was a Python call list (valid or not): what BFCL's decoder would accept as
    function calls, and what its irrelevance check counts as the agent acting.
    """

    calls: tuple[str, ...] = ()
    error: str | None = None
    is_call_list: bool = False

    @property
    def ends_turn(self) -> bool:
        return self.error is None and not self.calls


def call_source(name: str, kwargs: dict) -> str:
    """The canonical text of a call: `name(key=repr(value), ...)`."""
    return f"{name}({', '.join(f'{key}={value!r}' for key, value in kwargs.items())})"


def _expression(action: str) -> ast.expr:
    text = action.strip("`\n ")
    if not text.startswith("["):
        text = "[" + text
    if not text.endswith("]"):
        text = text + "]"
    return ast.parse(text.strip().strip("'"), mode="eval").body


def parse_call_list(action: str) -> list[ast.Call]:
    """The calls of the action as syntax trees; ValueError when it is not a Python call or list of calls."""
    try:
        body = _expression(action)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ValueError(f"the action is not valid Python ({type(error).__name__}: {error})") from None
    if isinstance(body, ast.Call):
        return [body]
    if not isinstance(body, ast.List | ast.Tuple | ast.Set):
        raise ValueError("the action is not a list of function calls")
    if not all(isinstance(element, ast.Call) for element in body.elts):
        raise ValueError("every element of the list must be a function call")
    return list(body.elts)


def _value(node: ast.expr):
    if isinstance(node, ast.Name):
        return node.id  # BFCL's decoder reads a bare name as its text
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise ValueError(f"{ast.unparse(node)[:80]!r} is not a literal value") from None


def _positional_names(name: str, signature: inspect.Signature, count: int, keywords: Collection[str]):
    """The parameters `count` positional arguments of `name` bind to, in order; ValueError where Python's
    binding would fail (too many, or a parameter also given by keyword). Only leading parameters that may
    also be named take one: the canonical call names every argument."""
    leading = itertools.takewhile(lambda p: p.kind is p.POSITIONAL_OR_KEYWORD, signature.parameters.values())
    params = [param.name for param in leading]
    if count > len(params):
        takes = f"only {len(params)} ({', '.join(params)})" if params else "no"
        raise ValueError(f"{name} takes {takes} positional arguments but got {count}; write param_name=value")
    for param in params[:count]:
        if param in keywords:
            raise ValueError(f"{name}: argument {param} is given both by position and as {param}=")
    return params[:count]


def _argument(name: str, key: str, node: ast.expr):
    try:
        value = _value(node)
    except ValueError as error:
        raise ValueError(f"{name}: argument {key}: {error}") from None
    limit = ARGUMENT_LIMITS.get((name, key))
    if limit is not None and isinstance(value, int | float) and abs(value) > limit:
        raise ValueError(f"{name}: argument {key} must be at most {limit} in magnitude")
    return value


def call_kwargs(call: ast.Call, allowed: Collection[str]) -> tuple[str, dict]:
    """(name, keyword arguments) of one call, positional arguments named by the function's signature;
    ValueError saying why it is refused."""
    if not isinstance(call.func, ast.Name):
        raise ValueError(f"{ast.unparse(call.func)[:80]!r} is not a function name")
    name = call.func.id
    if name not in allowed:
        raise ValueError(f"{name!r} is not one of the functions of this task")
    if any(isinstance(arg, ast.Starred) for arg in call.args):
        raise ValueError(f"{name}: * arguments are not accepted; write param_name=value")
    if any(keyword.arg is None for keyword in call.keywords):
        raise ValueError(f"{name}: ** arguments are not accepted; write param_name=value")
    keys = [keyword.arg for keyword in call.keywords]
    if call.args:
        signature = function_signatures().get(name)
        if signature is None:
            raise ValueError(f"{name}: positional arguments are not accepted; write param_name=value")
        keys = _positional_names(name, signature, len(call.args), keys) + keys
    nodes = [*call.args, *(keyword.value for keyword in call.keywords)]
    return name, {key: _argument(name, key, node) for key, node in zip(keys, nodes, strict=True)}


def decode_action(action: str, allowed: Collection[str]) -> DecodedAction:
    """The action's calls of functions in `allowed`, canonical; or the error (see the module docstring)."""
    try:
        calls = parse_call_list(action)
    except ValueError as error:
        return DecodedAction(error=f"{error}; {_FORMAT_HINT}")
    sources = []
    for call in calls:
        try:
            sources.append(call_source(*call_kwargs(call, allowed)))
        except ValueError as error:
            return DecodedAction(error=f"{error}. Nothing was executed.", is_call_list=True)
    return DecodedAction(calls=tuple(sources), is_call_list=bool(sources))
