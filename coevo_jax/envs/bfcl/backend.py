"""BFCL's executable backends and multi-turn checker, run on the canonical calls of `calls`.

BFCL's executor (`execute_multi_turn_func_call`) keeps each task's backend instances (GorillaFileSystem,
TwitterAPI, ...) in its module's globals under `<model name>_<task id>_<class>_instance`, and never removes
them; its checker re-runs a whole task from fresh instances (`<model name>_eval_...`,
`<model name>_ground_truth_eval_...`). Each episode and each check here uses its own model name (`coevo_`
and a random hex string), so that episodes of the same task, in one thread or several, never share an
instance, and removes its instances when done.

`check` scores a finished episode with BFCL's own checker: `multi_turn_checker` (after every turn whose
answer has calls, the backends' state must equal the ground truth's and every output of the ground truth's
calls must be among the agent's outputs so far) and, unless turned off, `multi_turn_irrelevance_checker` (no
call where the answer is none: miss_func's turns before the function is added, miss_param's turns that lack
a value). BFCL's evaluation runner (`_evaluate_single_multi_turn_entry`) imports the irrelevance checker but
does not call it, so `irrelevance=False` gives BFCL leaderboard's multi-turn score. An episode with fewer
turns than the task (it ran out of steps) fails, as BFCL's force-terminated entries do. Per-turn results
run the same checks turn by turn without stopping at the first failure.

Episodes are isolated from each other: a backend method with a mutable default argument (TwitterAPI's
`post_tweet(..., tags=[], mentions=[])` keeps that very list in the tweet and `mention` appends to it) would
otherwise carry one episode's values into every later tweet posted without them, in any episode of the process.
Every execution and check here starts from fresh copies of those defaults, one at a time (`isolated`).

`state_key` is the episode's state as BFCL's state checker reads it: every backend instance's public
attributes (GiGPO's step groups compare it).

`function_signatures` gives the backends' functions as BFCL's executor maps them (each public method of the
classes, by its bare name) with their Python signatures, by which `calls` names positional arguments.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import json
import threading
import uuid
from collections.abc import Sequence

from coevo_jax.envs.bfcl.data import MULTI_TURN_CLASSES, BfclTask, bfcl_module

Turn = Sequence[Sequence[str]]  # the agent's executed steps in one turn, each a list of canonical calls


def executor_module():
    return bfcl_module("eval_checker.multi_turn_eval.multi_turn_utils")


def checker_module():
    return bfcl_module("eval_checker.multi_turn_eval.multi_turn_checker")


@functools.cache
def function_signatures() -> dict[str, inspect.Signature]:
    """Every multi-turn backend function by name, with its signature without `self`.

    The names are those BFCL's executor maps to an instance (the public methods of each class); they are
    unique across the eight classes, so a bare name says which class's method runs.
    """
    signatures: dict[str, inspect.Signature] = {}
    for cls in _backend_classes():
        for name, method in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            if name in signatures:
                raise ValueError(f"bfcl: function {name} is a method of more than one backend class")
            signature = inspect.signature(method)
            signatures[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signatures


def _backend_classes() -> list[type]:
    paths = bfcl_module("constants.executable_backend_config").CLASS_FILE_PATH_MAPPING
    return [getattr(importlib.import_module(paths[name]), name) for name in MULTI_TURN_CLASSES]


@functools.cache
def _mutable_defaults() -> tuple[tuple[object, tuple], ...]:
    """(function, its original defaults) of each backend method with a list, dict or set default."""
    found = []
    for cls in _backend_classes():
        for _, method in inspect.getmembers(cls, inspect.isfunction):
            defaults = method.__defaults__ or ()
            if any(isinstance(value, list | dict | set) for value in defaults):
                found.append((method, copy.deepcopy(defaults)))
    return tuple(found)


_ISOLATION = threading.RLock()


@contextlib.contextmanager
def isolated():
    """Holds the backends for one execution or check, their mutable defaults fresh copies of the originals."""
    with _ISOLATION:
        for method, defaults in _mutable_defaults():
            method.__defaults__ = copy.deepcopy(defaults)
        yield


def _public_state(value, seen: frozenset = frozenset()):
    """JSON values of an instance's public state, recursively (objects by their public attributes)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if id(value) in seen:
        return "<cycle>"
    seen = seen | {id(value)}
    if isinstance(value, dict):
        return sorted([str(k), _public_state(v, seen)] for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        items = [_public_state(v, seen) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if hasattr(value, "__dict__"):
        public = {k: v for k, v in vars(value).items() if not k.startswith("_")}
        return [type(value).__name__, _public_state(public, seen)]
    return repr(value)


def state_key(instances: dict) -> str:
    """The backends' state as BFCL's state checker compares it: each instance's public attributes."""
    return json.dumps(_public_state(dict(instances)), separators=(",", ":"))


def new_model_name() -> str:
    """A model name no other episode or check uses (BFCL keys its backend instances by it)."""
    return f"coevo_{uuid.uuid4().hex}"


def drop_instances(model_name: str) -> None:
    """Removes the backend instances BFCL's executor created under `model_name` (and its _eval variants)."""
    instances = vars(executor_module())
    for key in [key for key in list(instances) if key.startswith(model_name + "_")]:
        instances.pop(key, None)


def execute(
    task: BfclTask, calls: Sequence[str], model_name: str, *, is_eval: bool = False
) -> tuple[list, dict]:
    """BFCL's executor on canonical calls: (one output string per call, the backend instances by class)."""
    with isolated():
        return executor_module().execute_multi_turn_func_call(
            list(calls),
            task.initial_config,
            list(task.involved_classes),
            model_name,
            task.task_id,
            long_context=task.long_context,
            is_evaL_run=is_eval,
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A finished episode's score: BFCL's checker over the task (1.0 or 0.0) and each turn's own result."""

    reward: float
    turns_passed: tuple[bool, ...]
    error_type: str = ""
    error_message: str = ""

    @property
    def turn_accuracy(self) -> float:
        return sum(self.turns_passed) / len(self.turns_passed)

    def info(self) -> dict:
        return {
            "reward": self.reward,
            "turn_accuracy": self.turn_accuracy,
            "turns_passed": list(self.turns_passed),
            "checker_error": self.error_type,
            "checker_message": self.error_message,
        }


def check(
    task: BfclTask, turns: Sequence[Turn], attempted: Sequence[bool], *, irrelevance: bool = True
) -> Verdict:
    """Scores the agent's `turns` (executed steps per turn) on `task` (see the module docstring).

    `attempted[t]` says whether the agent wrote a call list in turn t, executed or refused (what BFCL's
    irrelevance check looks at). Turns beyond those played fail.
    """
    turns_passed = turn_results(task, turns, attempted, irrelevance=irrelevance)
    if len(turns) != task.num_turns:
        message = f"the episode ended after {len(turns)} of {task.num_turns} turns"
        return Verdict(0.0, turns_passed, "multi_turn:force_terminated", message)
    checker, model_name = checker_module(), new_model_name()
    ground_truth = [list(calls) for calls in task.ground_truth]
    try:
        with isolated():
            result = checker.multi_turn_checker(
                [[list(step) for step in turn] for turn in turns],
                ground_truth,
                task.checker_entry(),
                task.category,
                model_name,
            )
    finally:
        drop_instances(model_name)
    if result["valid"] and irrelevance:
        markers = [[["<call>"]] if acted else [] for acted in attempted]  # only their emptiness is read
        result = checker.multi_turn_irrelevance_checker(markers, ground_truth)
    if result["valid"]:
        return Verdict(1.0, turns_passed)
    return Verdict(0.0, turns_passed, result.get("error_type", ""), str(result.get("error_message", "")))


def turn_results(
    task: BfclTask, turns: Sequence[Turn], attempted: Sequence[bool], *, irrelevance: bool = True
) -> tuple[bool, ...]:
    """Whether each turn passes the checks BFCL's checker makes at that turn, every turn checked.

    The agent's backends carry its own earlier turns, as in the checker; turns not played fail.
    """
    checker, model_name = checker_module(), new_model_name()
    truth_name, outputs, passed = model_name + "_ground_truth", [], []
    try:
        for index, expected in enumerate(task.ground_truth):
            if index >= len(turns):
                passed.append(False)
                continue
            instances = execute(task, [], model_name, is_eval=True)[1]
            for step in turns[index]:
                step_outputs, instances = execute(task, step, model_name, is_eval=True)
                outputs.extend(step_outputs)
            truth_outputs, truth_instances = execute(task, expected, truth_name, is_eval=True)
            if not expected:
                passed.append(not (irrelevance and attempted[index]))
                continue
            passed.append(
                any(turns[index])
                and checker.state_checker(instances, truth_instances)["valid"]
                and checker.response_checker(outputs, truth_outputs, index)["valid"]
            )
    finally:
        drop_instances(model_name)
    return tuple(passed)
