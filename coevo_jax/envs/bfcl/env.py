"""`BfclEnv`: BFCL's multi-turn function-calling tasks (Berkeley Function Calling Leaderboard v4).

`envs.make("bfcl", category="multi_turn_base")`; `category` is one of BFCL's four multi-turn categories
(`data.CATEGORIES`, 200 tasks each) and task ids are BFCL's own (`multi_turn_base_0`, ...). The splits,
`train` (150) and `test` (50), are ours (`data`): BFCL has none; `all` (200) is CoEvolve's protocol.

An episode is one task, turn by turn: the task text lists the functions of the task's classes (`docs`) and
the first user message; an action is a Python list of calls of those functions (`calls`), run in order on the
task's BFCL backends, and `[]` ends the turn (`step`). The episode ends after the last turn's `[]`, rewarded
by BFCL's checker over the whole task, 1.0 or 0.0 (`backend.check`). Expert trajectories replay BFCL's ground
truth (`experts`); `add_tasks` takes CoEvolve's synthesized tasks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import (
    GRADED_SCORE,
    Environment,
    StepResult,
    TaskSpec,
    check_split,
    check_task_id,
    is_new_spec,
    record_expert_trajectory,
)
from coevo_jax.envs.bfcl import backend
from coevo_jax.envs.bfcl.calls import decode_action
from coevo_jax.envs.bfcl.data import (
    CATEGORIES,
    SPLITS,
    BfclTask,
    bfcl_module,
    load_category,
    split_of,
    task_from_state,
)
from coevo_jax.envs.bfcl.docs import DOC_STYLES, render_docs
from coevo_jax.envs.bfcl.experts import expert_steps

log = logging.getLogger(__name__)

INSTRUCTION = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function calls to achieve the purpose. If none "
    "of the functions can be used, point it out in your thought and make no call. If the given question lacks "
    "the parameters required by the function, also point it out and make no call.\n"
    "At each turn, try your best to complete the user's request within the turn: keep calling functions until "
    "you have fulfilled it, then end the turn with Action: [] and the next request follows.\n"
    "Your response must use the following format:\n\n"
    "Thought: I think ...\n"
    "Action: [func_name1(param_name1=value1, param_name2=value2), func_name2(param_name=value)]\n\n"
    "The calls of one action run in order and their outputs come back as the observation. Use keyword "
    "arguments with literal values (strings, numbers, booleans, lists, dicts). Action: [] ends your turn."
)


class BfclEnv(Environment):
    """BFCL's multi-turn tasks of one category (see the module docstring)."""

    name = "bfcl"

    def __init__(
        self,
        *,
        category: str = "multi_turn_base",
        docs: str = "compact",
        max_observation_chars: int | None = None,
        irrelevance_check: bool = True,
    ):
        if category not in CATEGORIES:
            raise ValueError(f"bfcl: unknown category {category!r}; categories: {', '.join(CATEGORIES)}")
        if docs not in DOC_STYLES:
            raise ValueError(f"bfcl: unknown docs style {docs!r}; styles: {', '.join(DOC_STYLES)}")
        if max_observation_chars is not None and max_observation_chars < 1:
            raise ValueError(f"bfcl: max_observation_chars must be positive, got {max_observation_chars}")
        self.category, self.docs = category, docs
        self.max_observation_chars = max_observation_chars
        self.irrelevance_check = irrelevance_check
        self._tasks = load_category(category)  # shared (cached): never changed here
        self._added: dict[str, TaskSpec] = {}
        self._added_tasks: dict[str, BfclTask] = {}
        self.step_limit = bfcl_module("constants.default_prompts").MAXIMUM_STEP_LIMIT
        self._task: BfclTask | None = None
        self._model_name = ""
        self._done = True
        self._verdict: backend.Verdict | None = None

    # -- tasks and splits -------------------------------------------------------------------------------
    @property
    def instruction(self) -> str:
        return INSTRUCTION

    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def tasks(self, split: str) -> list[str]:
        check_split("bfcl", split, SPLITS)
        if split == "all":
            return list(self._tasks)
        return [task_id for task_id in self._tasks if split_of(task_id) == split]

    def add_tasks(self, specs: Iterable[TaskSpec]) -> None:
        """Tasks on BFCL's backends in no split (CoEvolve's synthesized ones): a `TaskSpec` whose state gives
        the classes, their initial configuration, one user message a turn and the ground truth
        (`data.task_from_state`). Every function of the classes is offered from the start and the reward is
        BFCL's checker against that ground truth. An id must read `<this category>_<name>`: BFCL's checker
        reads the category (which loads long_context's extra content) from it."""
        for spec in specs:
            if not is_new_spec(self.name, self._added, spec, spec.task_id in self._tasks):
                continue
            prefix = spec.task_id.rsplit("_", 1)[0]
            if prefix != self.category:
                raise ValueError(
                    f"bfcl: added task id {spec.task_id!r} must read '{self.category}_<name>' (BFCL's checker "
                    "reads the category from the id)"
                )
            self._added_tasks[spec.task_id] = task_from_state(spec.task_id, self.category, spec.state)
            self._added[spec.task_id] = spec

    def task(self, task_id: str) -> BfclTask:
        """The task of `task_id` (of this environment's category, or added)."""
        check_task_id(self.name, task_id)
        if task_id in self._added_tasks:
            return self._added_tasks[task_id]
        if task_id not in self._tasks:
            raise ValueError(
                f"bfcl: unknown task id {task_id!r} in {self.category} (ids are {self.category}_0 .. _{len(self._tasks) - 1})"
            )
        return self._tasks[task_id]

    def max_steps(self, task_id: str) -> int:
        """BFCL's step limit and the turn's `[]`, a turn."""
        return (self.step_limit + 1) * self.task(task_id).num_turns

    # -- episodes -------------------------------------------------------------------------------------------
    def reset(self, task_id: str) -> str:
        task = self.task(task_id)
        self._end_backends()
        self._task, self._model_name = task, backend.new_model_name()
        self._callable = {doc["name"] for doc in task.functions} | {
            doc["name"] for added in task.added_functions.values() for doc in added
        }
        self._turn, self._turn_steps, self._acted = 0, 0, False
        self._turns: list[list[tuple[str, ...]]] = [[]]
        self._attempted: list[bool] = []
        self._done, self._verdict = False, None
        backend.execute(task, [], self._model_name)  # loads the backends' initial state
        return f"Functions you can call:\n{render_docs(task.functions, self.docs)}\n\n{self._user_turn(0)}"

    def _user_turn(self, turn: int) -> str:
        """The turn's user message. miss_func: the held-back functions are left out of the docs until the turn
        that adds them, whose message gives their docs and BFCL's; the turn that asks for them before has no
        call as its answer. As BFCL's executor does, a held-back function runs even before it is offered
        (multi_turn_miss_func_49's ground truth calls `tail` two turns early); the irrelevance check fails it
        where the answer is no call. miss_param: some turns lack a value the calls need, and the right answer
        there is no call."""
        task = self._task
        added = task.added_functions.get(turn)
        if added is None:
            return f"User: {task.questions[turn]}"
        # BFCL's prompting handlers: the new docs, then DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC.
        message = bfcl_module("constants.default_prompts").DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        return f"New functions you can call:\n{render_docs(added, self.docs)}\n\nUser: {message}"

    def step(self, action: str) -> StepResult:
        """The action's calls in order, one `call -> output` line each; an action that is not such a list, or
        calls anything else, runs nothing and its error is the observation (BFCL's harness would end the turn
        on text it cannot decode). `[]` (or an empty action) ends the turn: the next user message, or the
        reward and in `info` the per-turn results (`turn_accuracy`, `turns_passed`) and the checker's error;
        earlier steps report 0.0. As in BFCL's harness (`MAXIMUM_STEP_LIMIT`) a turn holds at most 20 steps
        before its `[]`; a 21st that is not `[]` force-quits the episode, which fails. Observations past
        `max_observation_chars` are cut (long_context's outputs run to thousands of characters)."""
        if self._task is None or self._done:
            raise RuntimeError("bfcl: step() called without an episode in progress (call reset)")
        decoded = decode_action(action, self._callable)
        if decoded.ends_turn:
            return self._end_turn()
        if self._turn_steps >= self.step_limit:  # force-quit, as in BFCL's harness: the turn never ends
            return self._finish(f"Forced to quit: more than {self.step_limit} steps in one turn.")
        self._turn_steps += 1
        self._acted |= decoded.is_call_list
        if decoded.error is not None:
            return self._cap(f"Error: {decoded.error}"), 0.0, False, {"error": decoded.error}
        outputs, _ = backend.execute(self._task, decoded.calls, self._model_name)
        self._turns[-1].append(decoded.calls)
        lines = [f"{call} -> {output}" for call, output in zip(decoded.calls, outputs, strict=True)]
        return self._cap("\n".join(lines)), 0.0, False, {}

    def _end_turn(self) -> StepResult:
        self._attempted.append(self._acted)
        self._turn, self._turn_steps, self._acted = self._turn + 1, 0, False
        if self._turn == self._task.num_turns:
            return self._finish("The conversation is over.")
        self._turns.append([])
        return self._user_turn(self._turn), 0.0, False, {"turn": self._turn}

    def _finish(self, observation: str) -> StepResult:
        self._done = True
        self._verdict = self._check()
        self._end_backends()
        return observation, self._verdict.reward, True, self._verdict.info()

    def _check(self) -> backend.Verdict:
        turns = [list(turn) for turn in self._turns[: len(self._attempted)]]
        return backend.check(self._task, turns, self._attempted, irrelevance=self.irrelevance_check)

    def _cap(self, text: str) -> str:
        limit = self.max_observation_chars
        return text if limit is None or len(text) <= limit else text[:limit] + " ... (truncated)"

    def state_key(self) -> str:
        """The backends' state as BFCL's state checker reads it, with the user turn the episode is in and
        whether this turn has written a call yet (the irrelevance check reads it). The outputs the agent has
        seen, which BFCL's response check also reads, are not part of it."""
        if self._task is None:
            raise RuntimeError("bfcl: state_key() before reset()")
        if self._done:
            return json.dumps(["done", self._verdict.reward if self._verdict else None])
        instances = backend.execute(self._task, [], self._model_name)[1]
        return json.dumps([self._turn, self._acted, backend.state_key(instances)])

    def episode_metrics(self) -> dict:
        """The episode's turn accuracy: the fraction of its turns that pass BFCL's per-turn checks (turns
        not finished, as in an episode the rollout loop cut short, fail); also its `GRADED_SCORE`."""
        if self._task is None:
            return {}
        verdict = self._verdict or self._check()
        return {"turn_accuracy": verdict.turn_accuracy, GRADED_SCORE: verdict.turn_accuracy}

    def _end_backends(self) -> None:
        if self._model_name:
            backend.drop_instances(self._model_name)
            self._model_name = ""

    # -- experts ----------------------------------------------------------------------------------------------
    def expert_trajectories(self, split: str, limit: int | None = None) -> list[Trajectory]:
        """BFCL's ground truth replayed as demonstrations on the first `limit` tasks of `split` (`experts`).

        Each is kept only if BFCL's checker scores it 1.0 here (all do: `tests/test_envs_bfcl.py`); `limit`
        counts tasks tried.
        """
        kept = []
        for task_id in self.tasks(split)[:limit]:
            trajectory = record_expert_trajectory(self, task_id, expert_steps(self.task(task_id)))
            if trajectory.reward == 1.0:
                kept.append(trajectory)
            else:
                log.warning("bfcl: the expert of %s scores %s, left out", task_id, trajectory.reward)
        return kept

    def close(self) -> None:
        self._end_backends()
        self._task, self._done = None, True
