"""Expert demonstrations from BFCL's ground truth (its possible answer for each turn).

A turn whose answer has calls is one step making all of them (in the answer's order, keyword arguments:
the few positional arguments of BFCL's answers are named from the backend method's signature), then `[]`;
a turn whose answer is no call (miss_func before the function is added, miss_param's incomplete requests,
three base requests nothing can serve) is `[]` alone. Thoughts are templated. The environment replays them
through the real backends, so the observations are the real outputs, and keeps those BFCL's checker
scores 1.0.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect

from coevo_jax.envs.base import ExpertStep
from coevo_jax.envs.bfcl.calls import call_source
from coevo_jax.envs.bfcl.data import BfclTask, bfcl_module

END_TURN = ExpertStep("That completes the request, so I end my turn.", "[]")
NO_CALL = ExpertStep(
    "I cannot do this with the functions and information I have, so I make no call and end my turn.", "[]"
)


@functools.cache
def _methods() -> dict[str, inspect.Signature]:
    """Every backend function's signature without `self`, by name (the names are unique across classes)."""
    paths = bfcl_module("constants.executable_backend_config").CLASS_FILE_PATH_MAPPING
    signatures = {}
    for class_name, module_name in paths.items():
        if class_name.startswith(("MemoryAPI", "WebSearchAPI")):
            continue  # not multi-turn backends
        cls = getattr(importlib.import_module(module_name), class_name)
        for name, method in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                signatures[name] = inspect.signature(functools.partial(method, None))
    return signatures


def keyword_call(call_text: str) -> str:
    """A ground-truth call as `calls.call_source` writes it, positional arguments named."""
    call = ast.parse(call_text, mode="eval").body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ValueError(f"bfcl: ground-truth call {call_text!r} is not a plain function call")
    args = [ast.literal_eval(arg) for arg in call.args]
    kwargs = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}
    bound = _methods()[call.func.id].bind(*args, **kwargs)
    return call_source(call.func.id, dict(bound.arguments))


def _thought(calls: list[str]) -> str:
    names = list(dict.fromkeys(call.split("(", 1)[0] for call in calls))
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"To do this I call {listed}."


def expert_steps(task: BfclTask) -> list[ExpertStep]:
    """The ground truth of `task` as steps (see the module docstring)."""
    steps = []
    for answer in task.ground_truth:
        if not answer:
            steps.append(NO_CALL)
            continue
        calls = [keyword_call(call) for call in answer]
        steps += [ExpertStep(_thought(calls), f"[{', '.join(calls)}]"), END_TURN]
    return steps
