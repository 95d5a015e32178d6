"""BFCL's synthesizer: call the task's functions with plausible arguments, turn the calls that worked into turns.

Exploration plays an episode of a task (`BfclEnv.reset`, then one call an action through `step`, so BFCL's
own backends answer) and chooses each call's function and arguments. Arguments come from what the
exploration has seen (values under the parameter's name in earlier outputs, such as an `access_token` or an
`order_id`, then any string or number of the right type), from the arguments BFCL's ground truth passes to
that function on train tasks (`value_bank`), and from the docs' enumerations. The signal decides where and
what:
* forgetting: the forgotten task's backends, favouring its functions with values other than its own
  (variations with other parameters);
* boundary: another train task with the same classes (new instance), favouring the task's functions;
* rare: the task's backends, favouring the rare functions most, and after the first of a rare pair its second;
* unguided: a random train task, every function alike.

A call works when it runs without error (no "Error during execution", no `{"error": ...}` output).
Abstraction keeps the calls that worked, in order, a call repeated at once only once (at most `MAX_CALLS`),
and splits them into turns of up to `CALLS_PER_TURN`, each with a user message from the functions' own
descriptions and the arguments ("Change the current working directory to the specified folder
(folder='document')."). The task is BFCL's multi-turn form on the explored backends' initial configuration,
its ground truth those calls; verification replays them in a fresh environment, where every call must work
again and BFCL's checker must score 1.0.
"""

from __future__ import annotations

import functools
import json
import random
import re

from coevo_jax.coevolve.patterns import bfcl_calls, parsed_actions
from coevo_jax.coevolve.synthesis import Exploration, Step, Synthesizer, spec_digest
from coevo_jax.envs.base import TaskSpec
from coevo_jax.envs.bfcl import BfclEnv
from coevo_jax.envs.bfcl.calls import call_kwargs, call_source, decode_action, parse_call_list
from coevo_jax.envs.bfcl.data import class_docs, load_category, split_of
from coevo_jax.envs.bfcl.experts import keyword_call

MAX_CALLS = 8
CALLS_PER_TURN = 2
FAVOURED = 6.0
OPTIONAL_ARGUMENT = 0.3  # chance of passing an optional parameter
_ENUM = re.compile(r"\[Enum\]: (\[.*?\])")
_TYPES = {"string": str, "integer": int, "float": (int, float), "boolean": bool, "array": list, "dict": dict}


@functools.cache
def value_bank(category: str) -> dict[tuple[str, str], tuple]:
    """(function, parameter) -> the distinct values BFCL's ground truth passes on the category's train tasks."""
    bank: dict[tuple[str, str], dict[str, object]] = {}
    for task_id, task in load_category(category).items():
        if split_of(task_id) != "train":
            continue
        for call in (c for turn in task.ground_truth for c in turn):
            for node in parse_call_list(keyword_call(call)):
                name, kwargs = call_kwargs(node, {node.func.id})
                for key, value in kwargs.items():
                    bank.setdefault((name, key), {})[repr(value)] = value
    return {key: tuple(values.values()) for key, values in bank.items()}


@functools.cache
def function_docs() -> dict[str, dict]:
    return {doc["name"]: doc for docs in class_docs().values() for doc in docs}


def own_description(name: str) -> str:
    """The first sentence of the function's own description (after BFCL's class preamble), without its stop."""
    text = function_docs()[name]["description"].rpartition("Tool description: ")[2].strip()
    return re.split(r"(?<=[a-z)])\.(?:\s|$)", text, maxsplit=1)[0].strip().rstrip(".")


def output_of(observation: str, call: str) -> str:
    """The output in an observation `call -> output` (the whole text when it is not one)."""
    prefix = f"{call} -> "
    return observation[len(prefix) :] if observation.startswith(prefix) else observation


def call_works(observation: str, call: str) -> bool:
    """Whether the call ran without error (a refused action, an exception or an {"error": ...} output)."""
    if observation.startswith("Error:"):
        return False
    output = output_of(observation, call)
    if output.startswith("Error during execution"):
        return False
    try:
        parsed = json.loads(output)
    except json.JSONDecodeError:
        return '"error":' not in output[:200]
    return not (isinstance(parsed, dict) and "error" in parsed)


def harvest(value, found: dict[str, list], key: str = "") -> None:
    """Every scalar in an output, under its key ('' for list items without one) and under ''."""
    if isinstance(value, dict):
        for k, v in value.items():
            harvest(v, found, k)
    elif isinstance(value, list):
        for item in value[:20]:
            harvest(item, found, key)
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        for name in {key, ""}:
            if value not in found.setdefault(name, []):
                found[name].append(value)


class BfclSynthesizer(Synthesizer):
    env_name = "bfcl"

    def _bias(self, env: BfclEnv, signal, rng):
        """(start task, favoured functions, favoured pairs, values to avoid)."""
        train = env.tasks("train")
        if signal is None:
            return rng.choice(train), set(), {}, set()
        parent = env.task(signal.task_id)
        names = {c.split("(")[0] for turn in parent.ground_truth for c in turn}
        names |= {n for a in parsed_actions(signal.evidence) for n in bfcl_calls(a)}
        if signal.kind == "forgetting":
            avoid = {repr(v) for c in (c for t in parent.ground_truth for c in t) for v in _literals(c)}
            return parent.task_id, names, {}, avoid
        if signal.kind == "boundary":
            same = [t for t in train if env.task(t).involved_classes == parent.involved_classes]
            others = [t for t in same if t != parent.task_id]
            return rng.choice(others or same or train), names, {}, set()
        pairs = dict(p.split(" > ") for p in signal.patterns if " > " in p)
        rare = {p for p in signal.patterns if " > " not in p} | set(pairs)
        return parent.task_id, rare, pairs, set()

    def explore(self, env, signal, rng, *, steps, exploration_id):
        start, favoured, pairs, avoid = self._bias(env, signal, rng)
        strength = FAVOURED**2 if signal is not None and signal.kind == "rare" else FAVOURED
        task = env.task(start)
        env.reset(start)
        names = [doc["name"] for doc in task.functions]
        bank, seen, taken, previous = value_bank(env.category), {}, [], None
        for _ in range(min(steps, env.step_limit)):
            weights = [
                (strength if n in favoured else 1.0) * (FAVOURED**2 if pairs.get(previous) == n else 1.0)
                for n in names
            ]
            name = rng.choices(names, weights)[0]
            call = call_source(name, self._arguments(name, bank, seen, avoid, rng))
            observation, _, _, _ = env.step(f"[{call}]")
            works = call_works(observation, call)
            taken.append(Step(f"[{call}]", observation, works))
            if works:
                previous = name
                try:
                    harvest(json.loads(output_of(observation, call)), seen)
                except json.JSONDecodeError:
                    pass
        env.close()
        context = {"start": start, "patterns": list(signal.patterns) if signal is not None else []}
        return Exploration(exploration_id, signal, start, tuple(taken), context)

    @staticmethod
    def _arguments(name: str, bank, seen: dict, avoid: set, rng: random.Random) -> dict:
        parameters = function_docs()[name]["parameters"]
        required = set(parameters.get("required", []))
        arguments = {}
        for param, spec in parameters["properties"].items():
            if param not in required and rng.random() > OPTIONAL_ARGUMENT:
                continue
            wanted = _TYPES.get(spec.get("type"), object)
            enum = _ENUM.search(spec.get("description", ""))
            options = [
                json.loads(enum.group(1)) if enum else [],
                [v for v in bank.get((name, param), ()) if repr(v) not in avoid],
                [v for v in seen.get(param, []) if isinstance(v, wanted)],
                [v for v in seen.get("", []) if isinstance(v, wanted) and not isinstance(v, bool)],
            ]
            options = [o for o in options if o]
            if options:
                arguments[param] = rng.choice(rng.choice(options))
            elif spec.get("type") == "boolean":
                arguments[param] = rng.random() < 0.5
            elif spec.get("type") in ("integer", "float"):
                arguments[param] = rng.choice((1, 2, 5, 10, 100))
        return arguments

    def abstract(self, env, exploration, *, min_steps):
        worked = [s.action[1:-1] for s in exploration.steps if s.ok]
        calls = [c for i, c in enumerate(worked) if i == 0 or c != worked[i - 1]][:MAX_CALLS]
        if len(calls) < min_steps:
            return "fewer successful calls than min_steps"
        patterns = set(exploration.context.get("patterns", ()))
        if patterns:
            names = [c.split("(")[0] for c in calls]
            shown = set(names) | {f"{a} > {b}" for a, b in zip(names, names[1:], strict=False)}
            if not shown & patterns:
                return "no rare pattern among the successful calls"
        turns = [calls[i : i + CALLS_PER_TURN] for i in range(0, len(calls), CALLS_PER_TURN)]
        return self._spec(env, exploration.parent, turns, [_turn_message(turn) for turn in turns])

    def _spec(self, env: BfclEnv, parent: str, turns: list[list[str]], questions: list[str]) -> TaskSpec:
        task = env.task(parent)
        state = {
            "involved_classes": list(task.involved_classes),
            "initial_config": task.initial_config,
            "questions": questions,
            "ground_truth": turns,
        }
        solution = tuple(action for turn in turns for action in (f"[{', '.join(turn)}]", "[]"))
        digest = spec_digest(self.env_name, state, solution)
        task_id = f"{env.category}_coevolve{digest[:16]}"
        return TaskSpec(task_id, "\n".join(questions), state, solution, self.env_name)

    def step_ok(self, observation, info):
        return all(call_works(line, line.split(" -> ")[0]) for line in observation.split("\n"))

    def task_from_actions(self, env, parent, actions, instruction, *, min_steps):
        """One turn asking `instruction` whose ground truth is every call of the actions, in order."""
        allowed = {doc["name"] for doc in env.task(parent).functions}
        calls = []
        for action in actions:
            decoded = decode_action(action, allowed)
            if decoded.error is not None:
                return "an action is not a call list of the task's functions"
            calls += decoded.calls
        if len(calls) < min_steps:
            return "fewer calls than min_steps"
        return self._spec(env, parent, [calls], [instruction.strip() or _turn_message(calls)])

    def verify(self, env, spec):
        try:
            env.add_tasks([spec])
            env.reset(spec.task_id)
        except ValueError as error:
            return f"unplayable: {error}"
        reward = 0.0
        for action in spec.solution:
            observation, reward, done, _ = env.step(action)
            if action != "[]":
                lines = observation.split("\n")
                if not all(call_works(line, line.split(" -> ")[0]) for line in lines):
                    env.close()
                    return "a reference call fails on replay"
        return None if reward == 1.0 else "replay scores below 1"


def _literals(call: str) -> list:
    try:
        node = parse_call_list(call)[0]
        return list(call_kwargs(node, {node.func.id})[1].values())
    except (ValueError, AttributeError):
        return []


def _request(call: str) -> str:
    """A user message for one call: the function's own description and the arguments."""
    name, _, arguments = call.partition("(")
    arguments = arguments.rstrip(")")
    return f"{own_description(name)} ({arguments})" if arguments else own_description(name)


def _turn_message(calls) -> str:
    """One turn's user message: its calls' requests, joined by "then"."""
    requests = [_request(call) for call in calls]
    return ". Then ".join([requests[0], *(r[0].lower() + r[1:] for r in requests[1:])]) + "."
