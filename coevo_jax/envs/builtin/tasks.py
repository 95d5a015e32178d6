"""Task families of the built-in environment: procedural generation and graded subgoals.

A task chains skills, each a few actions in the world of `world`; each skill adds subgoals:
    heat X      put X in the stove, switch it on           X in the stove, X hot
    cool X      the same with the freezer                   X in the freezer, X cold
    move X C    carry X to container C (in a named room)    X in C
    slice X     hold the knife, use it on X                 knife held, X sliced
    mix A B     put A and B in the bowl, mix it             A in the bowl, B in the bowl, a mixture of A and B
Every task first asks to focus on its subject (X, or the bowl for a mix), and a heat, cool or move that opens
a task first needs X in hand (subgoal: X held). The last subgoal is the whole end state (e.g. "X is hot and in
C"), so a task is complete exactly when all its subgoals have been reached.

Seen families (splits train, dev and test_seen, disjoint instances): heat, cool, move, slice, mix, cool-move,
mix-heat. Unseen families (splits test_unseen and dev_unseen) recombine the same skills in ways training never
shows: heat-move, mix-cool, slice-heat. The two dev splits are for choosing hyperparameters, so that the test
splits are never tuned on. Subgoals per task: 3 (move, slice), 4 (heat, cool, mix), 5 (cool-move,
heat-move, slice-heat) or 6 (mix-heat, mix-cool).

A task id is "FAMILY/NNNN"; its world comes from a `random.Random` seeded with crc32("SEED/FAMILY/NNNN"), so
(seed, task id) alone rebuild it. An instance whose key layout (subject, targets, their rooms, start room)
repeats an earlier index of its family is skipped, so a test_seen or dev task is never a train task with other
distractors. Each seen family's distinct instances go to test_seen first, then dev, then train, so the test
and dev tasks do not change with the number of train tasks; likewise test_unseen before dev_unseen.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from coevo_jax.envs.builtin.world import (
    BOWL,
    CONTAINER,
    DEVICE,
    DEVICE_TEMPERATURE,
    FREEZER,
    INVENTORY,
    ITEM,
    KNIFE,
    MIXTURE,
    ROOMS,
    STOVE,
    TOOL,
    Thing,
    World,
)

SEEN_FAMILIES = ("heat", "cool", "move", "slice", "mix", "cool-move", "mix-heat")
UNSEEN_FAMILIES = ("heat-move", "mix-cool", "slice-heat")
SLICEABLE = ("apple", "banana", "bread", "carrot", "cheese", "cucumber", "onion", "pear", "potato", "tomato")
MIXABLE = ("butter", "cocoa", "egg", "flour", "honey", "rice", "salt", "sugar")
ITEMS = SLICEABLE + MIXABLE + ("lemon", "mushroom")
CONTAINERS = ("basket", "bin", "box", "crate", "jar", "tray")
DEVICE_FOR = {"heat": STOVE, "cool": FREEZER}
MAX_INDEX = 100_000  # instance indices tried per family before giving up on distinct layouts

Condition = tuple[str, ...]  # (kind, thing, *args), e.g. ("inside", "apple", "stove"); see `holds`
Subgoal = tuple[Condition, ...]  # reached when all its conditions hold at once


@dataclass(frozen=True)
class Task:
    """One task instance. `start` is never mutated: episodes and the expert work on copies of it."""

    task_id: str
    family: str
    text: str
    subgoals: tuple[Subgoal, ...]
    start: World
    subject: str  # the thing the skills act on (MIXTURE for a mix)
    ingredients: tuple[str, ...]  # for a mix, sorted
    target: str | None  # the container of a move
    layout: tuple  # what makes two instances the same task
    solution: tuple[str, ...] = ()  # an added task's reference actions (generated tasks are planned instead)


CONDITION_KINDS = ("focus", "holding", "inside", "hot", "cold", "sliced", "mixed")
ADDED_FAMILY = "added"  # the family of tasks given by `TaskSpec` (`task_from_spec`)


def task_from_spec(spec) -> Task:
    """An added task (`envs.base.TaskSpec`): `state` holds the start world (`World.to_json`) and the subgoals,
    lists of conditions `[kind, thing, *args]`; the task text is `instruction`, the solution the spec's."""
    state = spec.state
    if not isinstance(state, dict) or not {"world", "subgoals"} <= set(state):
        raise ValueError(f"builtin: task {spec.task_id}: state needs 'world' and 'subgoals'")
    world = World.from_json(state["world"])
    subgoals = []
    for subgoal in state["subgoals"]:
        conditions = tuple(tuple(str(part) for part in condition) for condition in subgoal)
        for condition in conditions:
            if len(condition) < 2 or condition[0] not in CONDITION_KINDS:
                raise ValueError(f"builtin: task {spec.task_id}: {list(condition)} is not a condition")
        if not conditions:
            raise ValueError(f"builtin: task {spec.task_id}: an empty subgoal")
        subgoals.append(conditions)
    if not subgoals or not spec.solution:
        raise ValueError(f"builtin: task {spec.task_id}: needs subgoals and a solution")
    subject = subgoals[-1][0][1]
    return Task(
        spec.task_id,
        ADDED_FAMILY,
        spec.instruction,
        tuple(subgoals),
        world,
        subject,
        (),
        None,
        (),
        solution=tuple(spec.solution),
    )


def holds(world: World, condition: Condition) -> bool:
    """Whether `condition` is true in `world`."""
    kind, name, *args = condition
    if kind == "focus":
        return world.focus == name
    thing = world.things.get(name)
    if thing is None:
        return False
    if kind == "holding":
        return thing.location == INVENTORY
    if kind == "inside":
        return thing.location == args[0]
    if kind in ("hot", "cold"):
        return thing.temperature == kind
    if kind == "sliced":
        return thing.sliced
    if kind == "mixed":
        return thing.ingredients == tuple(args)
    raise ValueError(f"unknown condition {condition!r}")


def family_subgoals(family: str, subject: str, ingredients: tuple[str, ...], target: str | None):
    """The subgoals of a task, in the order the expert reaches them (see the module docstring)."""
    skills = family.split("-")
    subgoals: list[Subgoal] = [(("focus", BOWL if skills[0] == "mix" else subject),)]
    if skills[0] in ("heat", "cool", "move"):
        subgoals.append((("holding", subject),))
    end_state: list[Condition] = []
    for skill in skills:
        if skill == "mix":
            subgoals += [(("inside", name, BOWL),) for name in ingredients]
            end = ("mixed", MIXTURE, *ingredients)
        elif skill == "slice":
            subgoals.append((("holding", KNIFE),))
            end = ("sliced", subject)
        elif skill == "move":
            end = ("inside", subject, target)
        else:
            subgoals.append((("inside", subject, DEVICE_FOR[skill]),))
            end = (DEVICE_TEMPERATURE[DEVICE_FOR[skill]], subject)
        subgoals.append((end,))
        end_state.append(end)
    subgoals[-1] = tuple(end_state)
    return tuple(subgoals)


def _goal_text(world: World, skills: list[str], subject: str, ingredients: tuple[str, ...], target) -> str:
    clauses = []
    for index, skill in enumerate(skills):
        it = f"the {subject}" if index == 0 else "the mixture" if subject == MIXTURE else "it"
        if skill == "mix":
            clauses.append(f"mix the {ingredients[0]} and the {ingredients[1]} in the bowl")
        elif skill == "move":
            clauses.append(f"move {it} to the {target} in the {world.room_of(target)}")
        else:
            clauses.append(f"{skill} {it}")
    return ", then ".join(clauses)


def _new_world(rng: random.Random, loose: list[str]) -> World:
    """Kitchen devices and bowl, three containers in random rooms, and `loose` things scattered about."""
    things = {
        STOVE: Thing(STOVE, DEVICE, "kitchen"),
        FREEZER: Thing(FREEZER, DEVICE, "kitchen"),
        BOWL: Thing(BOWL, CONTAINER, "kitchen"),
    }
    for name in sorted(rng.sample(CONTAINERS, 3)):
        things[name] = Thing(name, CONTAINER, rng.choice(ROOMS))
    for name in loose:
        room = rng.choice(ROOMS)
        holders = [c for c in CONTAINERS if c in things and things[c].location == room]
        location = rng.choice(holders) if holders and rng.random() < 0.3 else room
        things[name] = Thing(name, TOOL if name == KNIFE else ITEM, location, sliceable=name in SLICEABLE)
    return World(rng.choice(ROOMS), things)


def make_task(seed: int, task_id: str) -> Task:
    """Builds task `task_id` ("FAMILY/NNNN") of the environment seeded with `seed`, deterministically."""
    family, _, index = task_id.partition("/")
    if family not in SEEN_FAMILIES + UNSEEN_FAMILIES or not index.isdigit():
        raise ValueError(f"builtin: malformed task id {task_id!r} (expected FAMILY/NNNN)")
    rng = random.Random(zlib.crc32(f"{seed}/{task_id}".encode()))
    skills = family.split("-")
    if "mix" in skills:
        subject, ingredients = MIXTURE, tuple(sorted(rng.sample(MIXABLE, 2)))
        carried = list(ingredients)
    else:
        subject, ingredients = rng.choice(SLICEABLE if "slice" in skills else ITEMS), ()
        carried = [subject]
    distractors = rng.sample([i for i in ITEMS if i not in carried], rng.randint(3, 5))
    world = _new_world(rng, [KNIFE, *carried, *distractors])
    target = None
    if "move" in skills:
        target = rng.choice(
            [c for c in CONTAINERS if c in world.things and c != world.things[subject].location]
        )
    focus = BOWL if skills[0] == "mix" else subject
    hints = [f"The {name} is in the {world.room_of(name)}." for name in carried]
    if "slice" in skills:
        hints.append(f"The knife is in the {world.room_of(KNIFE)}.")
    goal = _goal_text(world, skills, subject, ingredients, target)
    text = (
        f"Your task is to {goal}. First focus on the {focus}. {' '.join(hints)} You are in the {world.room}."
    )
    keys = carried + ([KNIFE] if "slice" in skills else []) + ([target] if target else [])
    layout = (family, tuple((name, world.room_of(name)) for name in keys), world.room)
    subgoals = family_subgoals(family, subject, ingredients, target)
    return Task(task_id, family, text, subgoals, world, subject, ingredients, target, layout)


def distinct_tasks(seed: int, family: str) -> Iterator[Task]:
    """The tasks of `family` in index order, skipping any whose layout repeats an earlier one."""
    layouts = set()
    for index in range(MAX_INDEX):
        task = make_task(seed, f"{family}/{index:04d}")
        if task.layout not in layouts:
            layouts.add(task.layout)
            yield task
    raise ValueError(f"builtin: family {family!r} ran out of distinct task layouts")


def family_share(total: int, num_families: int, family_index: int) -> int:
    """How many of `total` tasks family number `family_index` gets (as even as possible, earlier first)."""
    return total // num_families + int(family_index < total % num_families)


def build_splits(seed: int, sizes: dict[str, int]) -> dict[str, list[Task]]:
    """The tasks of each split, families interleaved; each test split takes its families' first instances."""
    per_family: dict[str, list[list[Task]]] = {split: [] for split in sizes}
    for families, splits in (
        (SEEN_FAMILIES, ("test_seen", "dev", "train")),
        (UNSEEN_FAMILIES, ("test_unseen", "dev_unseen")),
    ):
        for index, family in enumerate(families):
            stream = distinct_tasks(seed, family)
            for split in splits:
                share = family_share(sizes[split], len(families), index)
                per_family[split].append(list(itertools.islice(stream, share)))
    return {
        split: [t for row in itertools.zip_longest(*lists) for t in row if t is not None]
        for split, lists in per_family.items()
    }
