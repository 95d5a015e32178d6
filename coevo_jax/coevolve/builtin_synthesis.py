"""The built-in environment's synthesizer: a biased walk in the house, its state changes as the new goal.

Exploration walks the world's admissible actions (so every step is valid), from a start and with a bias set
by the signal:
* forgetting: the forgotten task's own world, favouring its verbs on *other* things than its subject
  (variations with other parameters);
* boundary: the world of another train task of the same family, favouring the family's verbs and that
  task's subject (the same skill on a new instance);
* rare: the task's own world, favouring the actions whose pattern is one of the rare ones and the fixtures
  (knife, bowl, stove, freezer) they name;
* unguided: a random train task's world, every admissible action alike.

Abstraction takes the things whose state the walk changed (hot, cold, sliced, put in a container or device,
mixed), picks at most two such end conditions (favouring the bias's things, and for rare the ones a rare
pattern made), and prunes the walk to a locally minimal solution that still reaches them: dropping any one
more step breaks it. The subgoals are the conditions on those things that the solution reaches on the way
(held, in a device) and then the end state, as the environment's own tasks are graded; the instruction comes
from templates ("heat the pear, then put it in the box in the workshop"). A rare signal's task must still use
a rare pattern.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from coevo_jax.coevolve.patterns import BUILTIN_FIXTURES, builtin_pattern, parsed_actions
from coevo_jax.coevolve.signals import Signal
from coevo_jax.coevolve.synthesis import Exploration, Step, Synthesizer, spec_digest
from coevo_jax.envs.base import TaskSpec
from coevo_jax.envs.builtin import BuiltinEnv
from coevo_jax.envs.builtin.tasks import Condition, holds
from coevo_jax.envs.builtin.world import BOWL, CONTAINER, DEVICE, INVENTORY, MIXTURE, World, join_words, parse

ID_PREFIX = "coevolve/"
IDLE_VERBS = ("look around", "inventory", "examine {}", "focus on {}")  # change nothing a goal reads
FAVOURED = 5.0  # weight of an action that matches the bias, per matching part (verb, thing)
MAX_GOALS = 2


def _verb(action: str) -> str | None:
    parsed = parse(action)
    return None if parsed is None else parsed[0].template


def _things(action: str) -> tuple[str, ...]:
    parsed = parse(action)
    return () if parsed is None else parsed[1]


def _solution_of(env: BuiltinEnv, task_id: str) -> list[str]:
    return [step.action for step in env.expert_steps(task_id)]


class BuiltinSynthesizer(Synthesizer):
    env_name = "builtin"

    # -- exploration ---------------------------------------------------------------------------------------
    def _bias(self, env: BuiltinEnv, signal: Signal | None, rng: random.Random):
        """(start task id, favoured verbs, favoured things, favoured patterns) for the signal."""
        if signal is None:
            return rng.choice(env.tasks("train")), set(), set(), set()
        parent = env.task(signal.task_id)
        actions = _solution_of(env, parent.task_id) + parsed_actions(signal.evidence)
        verbs = {v for v in map(_verb, actions) if v is not None} - set(IDLE_VERBS) - {"go to {}"}
        if signal.kind == "forgetting":
            others = {n for n, t in parent.start.things.items() if t.kind == "item"} - {parent.subject}
            return parent.task_id, verbs, others - set(parent.ingredients), set()
        if signal.kind == "boundary":
            same = [
                t for t in env.tasks("train") if env.task(t).family == parent.family and t != parent.task_id
            ]
            start = rng.choice(same or env.tasks("train"))
            return start, verbs, {env.task(start).subject, *env.task(start).ingredients}, set()
        fixtures = {word for p in signal.patterns for word in p.split() if word in BUILTIN_FIXTURES}
        return parent.task_id, set(), fixtures, set(signal.patterns)

    def explore(self, env, signal, rng, *, steps, exploration_id):
        start, verbs, things, patterns = self._bias(env, signal, rng)
        world = env.task(start).start.copy()
        taken: list[Step] = []
        for _ in range(steps):
            actions = world.admissible_actions()
            held = {name for name, thing in world.things.items() if thing.location == INVENTORY}
            weights = [self._weight(a, verbs, things, patterns, held) for a in actions]
            action = rng.choices(actions, weights)[0]
            observation, valid = world.step(action)
            taken.append(Step(action, observation, valid))
        context = {"start": start, "things": sorted(things), "patterns": sorted(patterns)}
        return Exploration(exploration_id, signal, start, tuple(taken), context)

    @staticmethod
    def _weight(action: str, verbs: set, things: set, patterns: set, held: set) -> float:
        """Favours the signal's verbs, things and patterns, and doing something with what is held."""
        verb = _verb(action)
        weight = 0.2 if verb in IDLE_VERBS else 1.0
        weight *= FAVOURED if verb != "pick up {}" and held & set(_things(action)) else 1.0
        weight *= FAVOURED if verb in verbs else 1.0
        weight *= FAVOURED if things & set(_things(action)) else 1.0
        return weight * (FAVOURED**2 if builtin_pattern(action) in patterns else 1.0)

    # -- abstraction ---------------------------------------------------------------------------------------
    def abstract(self, env, exploration, *, min_steps):
        start = env.task(exploration.parent).start
        actions = [step.action for step in exploration.steps if step.ok]
        end = _play(start, actions)
        if end is None:
            return "walk does not replay"
        candidates = _changed_conditions(start, end)
        if not candidates:
            return "no state change"
        favoured = set(exploration.context.get("things", ()))
        patterns = set(exploration.context.get("patterns", ()))
        if patterns:  # rare: only the end states a rare-pattern action made
            made = _conditions_made_by(start, actions, patterns)
            candidates = [c for c in candidates if c in made]
            if not candidates:
                return "no state change from a rare pattern"
        ranked = sorted(candidates, key=lambda c: (c[1] not in favoured, candidates.index(c)))
        goal = ranked[:MAX_GOALS]
        solution = _prune(start, actions, goal)
        if len(solution) < min_steps:
            return "solution too short"
        if patterns and not {builtin_pattern(a) for a in solution} & patterns:
            return "solution drops the rare pattern"
        return self._spec(start, goal, solution, _instruction(start, goal))

    def _spec(self, start: World, goal, solution: list[str], instruction: str) -> TaskSpec:
        subgoals = _subgoals(start, solution, goal)
        state = {"world": start.to_json(), "subgoals": [[list(c) for c in sub] for sub in subgoals]}
        digest = spec_digest(self.env_name, state, solution)
        return TaskSpec(ID_PREFIX + digest[:16], instruction, state, tuple(solution), self.env_name)

    def step_ok(self, observation, info):
        return bool(info.get("valid", False))

    def task_from_actions(self, env, parent, actions, instruction, *, min_steps):
        """The end state the actions reach from the parent's start (at most two conditions), the actions
        pruned to a minimal solution; the instruction is the given one, or the templates' when empty."""
        start = env.task(parent).start
        end = _play(start, actions)
        if end is None:
            return "action sequence does not replay"
        goal = _changed_conditions(start, end)[:MAX_GOALS]
        if not goal:
            return "no state change"
        solution = _prune(start, list(actions), goal)
        if len(solution) < min_steps:
            return "solution too short"
        return self._spec(start, goal, solution, instruction.strip() or _instruction(start, goal))


def _play(start: World, actions: Sequence[str]) -> World | None:
    """The world after `actions` from `start`, or None if one of them is refused."""
    world = start.copy()
    for action in actions:
        if not world.step(action)[1]:
            return None
    return world


def _changed_conditions(start: World, end: World) -> list[Condition]:
    """End conditions worth a task that hold in `end` and not in `start`, in a fixed order."""
    found = []
    for name, thing in sorted(end.things.items()):
        if thing.kind != "item":
            continue
        if thing.temperature and not holds(start, (thing.temperature, name)):
            found.append((thing.temperature, name))
        if thing.sliced and not holds(start, ("sliced", name)):
            found.append(("sliced", name))
        holder = end.things.get(thing.location)
        if holder is not None and holder.kind in (CONTAINER, DEVICE) and name != MIXTURE:
            if not holds(start, ("inside", name, holder.name)):
                found.append(("inside", name, holder.name))
        if name == MIXTURE:
            found.append(("mixed", MIXTURE, *thing.ingredients))
    return found


def _conditions_made_by(start: World, actions: Sequence[str], patterns: set) -> set[Condition]:
    """The end conditions that first came to hold at an action whose pattern is in `patterns`."""
    world, made = start.copy(), set()
    for action in actions:
        before = world.copy()
        world.step(action)
        if builtin_pattern(action) in patterns:
            made |= set(_changed_conditions(before, world))
    return made


def _reaches(start: World, actions: Sequence[str], goal: Sequence[Condition]) -> bool:
    end = _play(start, actions)
    return end is not None and all(holds(end, c) for c in goal)


def _prune(start: World, actions: list[str], goal: Sequence[Condition]) -> list[str]:
    """`actions` cut to the first point where the goal holds, then without every run of up to three steps and
    every pair of steps it does not need (a detour of walks, or a put and its later pick up, is only removable
    whole), until none is left."""
    for length in range(1, len(actions) + 1):
        if _reaches(start, actions[:length], goal):
            actions = actions[:length]
            break
    changed = True
    while changed:
        changed = False
        for size in (3, 2, 1):
            index = len(actions) - size
            while index >= 0:
                shorter = actions[:index] + actions[index + size :]
                if _reaches(start, shorter, goal):
                    actions, changed = shorter, True
                index -= 1
        for first, second in itertools.combinations(range(len(actions)), 2):  # a put down, picked up later
            shorter = [a for i, a in enumerate(actions) if i not in (first, second)]
            if _reaches(start, shorter, goal):
                actions, changed = shorter, True
                break
    return actions


def _subgoals(start: World, solution: Sequence[str], goal: Sequence[Condition]):
    """One subgoal per condition on the goal's things that the solution reaches on the way (held, put in
    something) or that the goal asks for, in the order the solution first reaches them, the last subgoal the
    whole end state; the environment's own tasks are graded the same way."""
    names = {c[1] for c in goal} | {n for c in goal if c[0] == "mixed" for n in c[2:]}
    world, reached = start.copy(), []
    for action in solution:
        world.step(action)
        on_the_way = []
        for name in sorted(names):
            thing = world.things.get(name)
            if thing is None:
                continue
            if thing.location == INVENTORY:
                on_the_way.append(("holding", name))
            elif thing.location in world.things:
                on_the_way.append(("inside", name, thing.location))
        for condition in [*on_the_way, *goal]:
            if condition not in reached and holds(world, condition) and not holds(start, condition):
                reached.append(condition)
    subgoals = [(c,) for c in reached if len(goal) > 1 or c != goal[0]]
    return [*subgoals, tuple(goal)]


def _clause(world: World, condition: Condition, first: bool) -> str:
    kind, name, *args = condition
    it = f"the {name}" if first or kind == "mixed" else "it"
    if kind in ("hot", "cold"):
        return f"{'heat' if kind == 'hot' else 'cool'} {it}"
    if kind == "sliced":
        return f"slice {it}"
    if kind == "mixed":
        return f"mix the {join_words(args)} in the {BOWL}"
    holder = args[0]
    where = (
        "" if world.things[holder].kind == DEVICE or holder == BOWL else f" in the {world.room_of(holder)}"
    )
    return f"put {it} in the {holder}{where}"


def _instruction(start: World, goal: Sequence[Condition]) -> str:
    """The task text, in the environment's own wording: the goal, where its things are, where you are."""
    clauses, previous = [], None
    for condition in goal:
        clauses.append(_clause(start, condition, first=condition[1] != previous))
        previous = condition[1]
    names = sorted({n for c in goal for n in ([c[1]] if c[0] != "mixed" else c[2:]) if n in start.things})
    hints = " ".join(f"The {n} is in the {start.room_of(n)}." for n in names)
    return f"Your task is to {', then '.join(clauses)}. {hints} You are in the {start.room}.".replace(
        "  ", " "
    )
