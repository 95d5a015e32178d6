"""BFCL's multi-turn tasks, ground truth and function docs, read from the installed PyPI package `bfcl-eval`.

Nothing is downloaded: the four multi-turn categories (200 tasks each), their possible answers and the function
docs of the eight backend classes ship inside the wheel (`bfcl_eval/data`). A task is assembled as BFCL's
`load_dataset_entry` assembles it (`populate_test_cases_with_predefined_functions`: the docs of every involved
class, the miss_func category's held-back functions taken out and given to the turn that adds them; then
`add_language_specific_hint_to_function_doc`'s Python hint, which BFCL adds to the functions offered from the
start but not to the held-back ones), without BFCL's file locks, which write into the package's directory. BFCL names `excluded_function` in each entry but does not use it; neither do we.

Splits are ours (BFCL has none): a task's number n (`multi_turn_base_<n>`) is in `test` when n % 4 == 3 and
in `train` otherwise, the same numbers in every category (the four categories are variants of the same 200
scenarios, so a scenario never sits on both sides): 150 train and 50 test tasks per category.
`all` holds every task of the category: CoEvolve's protocol evaluates on all 200 of multi_turn_base (and
trains on tasks it synthesizes), so a run under that protocol sets `eval_splits=("all",)`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from pathlib import Path

BFCL_VERSION = "2026.3.23"
BFCL_INSTALL = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} && pip install mpmath==1.3.0"
CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
SPLITS = ("train", "test", "all")  # "all": every task, CoEvolve's protocol (all of multi_turn_base as test)
TEST_EVERY = 4  # task number n is a test task when n % TEST_EVERY == TEST_EVERY - 1
PYTHON_HINT = (
    " Note that the provided function is in Python 3 syntax."  # BFCL's `_get_language_specific_hint`
)


def bfcl_module(name: str):
    """`bfcl_eval.<name>`, or ModuleNotFoundError saying how to install the package (and mpmath, which
    BFCL's MathAPI backend imports only when a task first uses it)."""
    try:
        importlib.import_module("mpmath")
        return importlib.import_module(f"bfcl_eval.{name}")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"bfcl: BFCL's data and checker come from the PyPI package bfcl-eval ({error}); install it with "
            f"`{BFCL_INSTALL}`"
        ) from None


@dataclasses.dataclass(frozen=True)
class BfclTask:
    """One multi-turn task: user turns, backend set-up, the functions each turn offers, and BFCL's answer."""

    task_id: str
    category: str
    questions: tuple[
        str, ...
    ]  # the user's message of each turn ("" for a miss_func turn that adds functions)
    functions: tuple[dict, ...]  # the docs offered from the first turn on
    added_functions: dict[int, tuple[dict, ...]]  # turn -> docs first offered at that turn (miss_func)
    involved_classes: tuple[str, ...]
    initial_config: dict
    ground_truth: tuple[tuple[str, ...], ...]  # BFCL's possible answer: the calls of each turn

    @property
    def num_turns(self) -> int:
        return len(self.questions)

    @property
    def long_context(self) -> bool:
        """BFCL loads the backends with long extra content for this category (`_load_scenario`)."""
        return "long_context" in self.category

    def checker_entry(self) -> dict:
        """The fields of BFCL's test entry its executor and checker read."""
        return {
            "id": self.task_id,
            "initial_config": self.initial_config,
            "involved_classes": list(self.involved_classes),
        }


def _read_jsonl(path: Path) -> list[dict]:
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


@functools.cache
def class_docs() -> dict[str, tuple[dict, ...]]:
    """The function docs of every multi-turn backend class, as BFCL ships them (no hint added)."""
    paths = bfcl_module("constants.eval_config")
    mapping = bfcl_module("constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return {
        name: tuple(_read_jsonl(paths.MULTI_TURN_FUNC_DOC_PATH / file_name))
        for name, file_name in mapping.items()
    }


def _copy(doc: dict, hint: str = "") -> dict:
    doc = json.loads(json.dumps(doc))
    doc["description"] += hint
    return doc


def _task(entry: dict, answer: dict, category: str) -> BfclTask:
    if entry["id"] != answer["id"] or len(entry["question"]) != len(answer["ground_truth"]):
        raise ValueError(f"bfcl: {category}: question and possible answer of {entry['id']} do not match")
    docs = class_docs()
    functions = [doc for name in entry["involved_classes"] for doc in docs[name]]
    added: dict[int, tuple[dict, ...]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        by_name = {doc["name"]: doc for doc in functions}
        if not set(names) <= set(by_name):
            raise ValueError(f"bfcl: {entry['id']}: held-back functions {names} are not all documented")
        functions = [doc for doc in functions if doc["name"] not in names]
        added[int(turn)] = tuple(_copy(by_name[name]) for name in names)  # no hint, as in BFCL
    questions = []
    for turn, messages in enumerate(entry["question"]):
        if not messages and turn not in added:
            raise ValueError(f"bfcl: {entry['id']}: turn {turn} has no user message and adds no function")
        if any(m["role"] != "user" for m in messages) or len(messages) > 1:
            raise ValueError(f"bfcl: {entry['id']}: turn {turn}: expected at most one user message")
        questions.append(messages[0]["content"] if messages else "")
    return BfclTask(
        task_id=entry["id"],
        category=category,
        questions=tuple(questions),
        functions=tuple(_copy(doc, PYTHON_HINT) for doc in functions),
        added_functions=added,
        involved_classes=tuple(entry["involved_classes"]),
        initial_config=entry["initial_config"],
        ground_truth=tuple(tuple(calls) for calls in answer["ground_truth"]),
    )


@functools.cache
def load_category(category: str) -> dict[str, BfclTask]:
    """The tasks of a multi-turn category by id, in BFCL's order (multi_turn_base_0, _1, ...)."""
    if category not in CATEGORIES:
        raise ValueError(f"bfcl: unknown category {category!r}; categories: {', '.join(CATEGORIES)}")
    paths = bfcl_module("constants.eval_config")
    prefix = bfcl_module("constants.category_mapping").VERSION_PREFIX
    entries = _read_jsonl(paths.PROMPT_PATH / f"{prefix}_{category}.json")
    answers = _read_jsonl(paths.POSSIBLE_ANSWER_PATH / f"{prefix}_{category}.json")
    if len(entries) != len(answers):
        raise ValueError(f"bfcl: {category}: {len(entries)} questions but {len(answers)} possible answers")
    return {e["id"]: _task(e, a, category) for e, a in zip(entries, answers, strict=True)}


MULTI_TURN_CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "TwitterAPI",
    "VehicleControlAPI",
)


def task_from_state(task_id: str, category: str, state: dict) -> BfclTask:
    """An added task (`envs.base.TaskSpec.state`): {"involved_classes", "initial_config", "questions" (one
    user message a turn), "ground_truth" (the calls of each turn, as BFCL writes them)}. Every function of the
    classes is offered from the first turn; ValueError naming the task and field for anything else."""
    if not isinstance(state, dict):
        raise ValueError(f"bfcl: task {task_id}: state must be an object")
    classes, questions = state.get("involved_classes"), state.get("questions")
    config, truth = state.get("initial_config"), state.get("ground_truth")
    if not isinstance(classes, list) or not classes or not set(classes) <= set(MULTI_TURN_CLASSES):
        raise ValueError(
            f"bfcl: task {task_id}: involved_classes {classes!r} must be of {MULTI_TURN_CLASSES}"
        )
    if not isinstance(config, dict):
        raise ValueError(f"bfcl: task {task_id}: initial_config must be an object")
    if (
        not isinstance(questions, list)
        or not questions
        or not all(isinstance(q, str) and q for q in questions)
    ):
        raise ValueError(f"bfcl: task {task_id}: questions must be non-empty strings, one a turn")
    if not isinstance(truth, list) or len(truth) != len(questions):
        raise ValueError(f"bfcl: task {task_id}: ground_truth needs one list of calls a turn")
    if not all(isinstance(calls, list) and all(isinstance(c, str) for c in calls) for calls in truth):
        raise ValueError(f"bfcl: task {task_id}: ground_truth turns must be lists of call strings")
    docs = class_docs()
    return BfclTask(
        task_id=task_id,
        category=category,
        questions=tuple(questions),
        functions=tuple(_copy(doc, PYTHON_HINT) for name in classes for doc in docs[name]),
        added_functions={},
        involved_classes=tuple(classes),
        initial_config=json.loads(json.dumps(config)),
        ground_truth=tuple(tuple(calls) for calls in truth),
    )


def task_number(task_id: str) -> int:
    """n of `<category>_<n>`."""
    return int(task_id.rsplit("_", 1)[1])


def split_of(task_id: str) -> str:
    """Our split of a task, train or test (see the module docstring)."""
    return "test" if task_number(task_id) % TEST_EVERY == TEST_EVERY - 1 else "train"
