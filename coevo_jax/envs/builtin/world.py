"""The world of the built-in environment: rooms, things, and the rules of its eleven verbs.

State and rules only; tasks and rewards live in `tasks`, the expert in `experts`. Every room can be reached from
every other (`go to ROOM`); the agent carries things in its inventory; containers and devices hold things one
level deep; while on, the stove makes what is in it hot and the freezer makes it cold; a held knife slices
food; `mix bowl` turns the bowl's contents into one "mixture". Each verb has a check (the feedback when the
action cannot be done, else None) and an effect, so `admissible_actions` lists exactly what `step` accepts.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace

ROOMS = ("hallway", "kitchen", "workshop", "greenhouse")
INVENTORY = "inventory"
ITEM, TOOL, CONTAINER, DEVICE = "item", "tool", "container", "device"
KNIFE, BOWL, STOVE, FREEZER, MIXTURE = "knife", "bowl", "stove", "freezer", "mixture"
DEVICE_TEMPERATURE = {STOVE: "hot", FREEZER: "cold"}
MASS_NOUNS = frozenset({"bread", "butter", "cheese", "cocoa", "flour", "honey", "rice", "salt", "sugar"})
NO_MATCH = "No known action matches that input."


@dataclass
class Thing:
    """One object; `location` is a room, INVENTORY, or the name of the container or device holding it."""

    name: str
    kind: str  # ITEM, TOOL, CONTAINER or DEVICE
    location: str
    temperature: str = ""  # "", "hot" or "cold"
    sliceable: bool = False
    sliced: bool = False
    active: bool = False
    ingredients: tuple[str, ...] = ()  # what a mixture was made of, sorted


def noun_phrase(thing: Thing) -> str:
    """'a hot sliced apple', 'some flour': the thing with its visible state."""
    words = " ".join(w for w in (thing.temperature, "sliced" if thing.sliced else "", thing.name) if w)
    article = "some" if thing.name in MASS_NOUNS else "an" if words[0] in "aeiou" else "a"
    return f"{article} {words}"


def join_words(words: Sequence[str]) -> str:
    """'x', 'x and y', 'x, y and z'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


@dataclass
class World:
    """The mutable state of one episode: where the agent is, every thing, and what it focused on."""

    room: str
    things: dict[str, Thing]
    focus: str | None = None

    def copy(self) -> World:
        return World(self.room, {name: replace(t) for name, t in self.things.items()}, self.focus)

    def to_json(self) -> dict:
        """The state as JSON values (`from_json` gives an equal world)."""
        things = [
            asdict(thing) | {"ingredients": list(thing.ingredients)}
            for _, thing in sorted(self.things.items())
        ]
        return {"room": self.room, "focus": self.focus, "things": things}

    @classmethod
    def from_json(cls, data: dict) -> World:
        """The world `to_json` wrote; ValueError naming what does not fit the house's rules."""
        try:
            room, focus, raw_things = data["room"], data.get("focus"), data["things"]
            names = {f.name for f in fields(Thing)}
            things = {}
            for raw in raw_things:
                unknown = set(raw) - names
                if unknown:
                    raise ValueError(f"thing {raw.get('name')!r}: unknown fields {sorted(unknown)}")
                thing = Thing(**{**raw, "ingredients": tuple(raw.get("ingredients", ()))})
                things[thing.name] = thing
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"builtin: not a world: {error!r}") from None
        world = cls(room, things, focus)
        if room not in ROOMS:
            raise ValueError(f"builtin: the agent is in {room!r}, not a room")
        for thing in things.values():
            if thing.kind not in (ITEM, TOOL, CONTAINER, DEVICE):
                raise ValueError(f"builtin: {thing.name}: unknown kind {thing.kind!r}")
            holder = things.get(thing.location)
            if thing.location not in (*ROOMS, INVENTORY) and (
                holder is None or holder.kind not in (CONTAINER, DEVICE)
            ):
                raise ValueError(f"builtin: {thing.name} is in {thing.location!r}, not a room or a container")
        return world

    def room_of(self, name: str) -> str:
        location = self.things[name].location
        if location == INVENTORY:
            return self.room
        return self.things[location].location if location in self.things else location

    def contents(self, holder: str) -> list[Thing]:
        """Things directly in `holder` (a room, INVENTORY or a container), sorted by name."""
        return [t for name, t in sorted(self.things.items()) if t.location == holder]

    def visible(self) -> list[str]:
        """Names of the things in the current room (inside containers too) and in the inventory, sorted."""
        return [name for name in sorted(self.things) if self.room_of(name) == self.room]

    def is_visible(self, name: str) -> bool:
        return name in self.things and self.room_of(name) == self.room

    def step(self, action: str) -> tuple[str, bool]:
        """Applies `action`; returns the observation and whether the action was valid (else nothing changed)."""
        parsed = parse(action)
        if parsed is None:
            return NO_MATCH, False
        verb, operands = parsed
        error = verb.check(self, *operands)
        if error is not None:
            return error, False
        return verb.apply(self, *operands), True

    def admissible_actions(self) -> list[str]:
        """Every action (in canonical wording) that `step` would accept now, sorted."""
        actions = []
        for verb in VERBS:
            candidates = ROOMS if verb.template.startswith("go to") else self.visible()
            for operands in itertools.product(candidates, repeat=verb.template.count("{}")):
                if verb.check(self, *operands) is None:
                    actions.append(verb.template.format(*operands))
        return sorted(actions)


def _describe_holder(world: World, thing: Thing) -> str:
    """'a stove (on) containing an apple', 'a box': a container or device as seen in the room."""
    text = noun_phrase(thing) + (f" ({'on' if thing.active else 'off'})" if thing.kind == DEVICE else "")
    inside = [noun_phrase(t) for t in world.contents(thing.name)]
    return text + (f" containing {join_words(inside)}" if inside else "")


def _room_view(world: World) -> str:
    here = world.contents(world.room)
    if not here:
        return "The room is empty."
    parts = [_describe_holder(world, t) if t.kind in (CONTAINER, DEVICE) else noun_phrase(t) for t in here]
    return f"You see {join_words(parts)}."


# Checks return the feedback for an action that cannot be done, or None; effects return the observation.


def _always_possible(world: World) -> None:
    return None


def _look(world: World) -> str:
    return f"You are in the {world.room}. {_room_view(world)}"


def _inventory(world: World) -> str:
    held = [noun_phrase(t) for t in world.contents(INVENTORY)]
    return f"You are holding {join_words(held)}." if held else "You are not holding anything."


def _check_go(world: World, room: str) -> str | None:
    if room not in ROOMS:
        return f"There is no room called {room}."
    return f"You are already in the {room}." if room == world.room else None


def _go(world: World, room: str) -> str:
    world.room = room
    return f"You go to the {room}. {_room_view(world)}"


def _check_visible(world: World, name: str) -> str | None:
    return None if world.is_visible(name) else f"There is no {name} here."


def _examine(world: World, name: str) -> str:
    thing = world.things[name]
    if thing.kind in (CONTAINER, DEVICE):
        return f"It is {_describe_holder(world, thing)}."
    if thing.ingredients:
        return f"It is {noun_phrase(thing)} of {join_words(thing.ingredients)}."
    return f"It is {noun_phrase(thing)}."


def _focus(world: World, name: str) -> str:
    world.focus = name
    return f"You focus on the {name}."


def _check_pick_up(world: World, name: str) -> str | None:
    if not world.is_visible(name):
        return f"There is no {name} here."
    thing = world.things[name]
    if thing.kind not in (ITEM, TOOL):
        return f"The {name} cannot be picked up."
    return f"You are already holding the {name}." if thing.location == INVENTORY else None


def _pick_up(world: World, name: str) -> str:
    world.things[name].location = INVENTORY
    return f"You pick up the {name}."


def _set_temperature(device: Thing, things: Sequence[Thing]) -> str:
    """Brings `things` to the temperature of the active `device`; describes what changed."""
    temperature = DEVICE_TEMPERATURE[device.name]
    changed = [t for t in things if t.temperature != temperature]
    for thing in changed:
        thing.temperature = temperature
    return "".join(f" The {t.name} becomes {temperature}." for t in changed)


def _check_put(world: World, name: str, holder: str) -> str | None:
    for missing in (name, holder):
        if not world.is_visible(missing):
            return f"There is no {missing} here."
    if world.things[name].location != INVENTORY:
        return f"You are not holding the {name}."
    if world.things[holder].kind not in (CONTAINER, DEVICE):
        return f"You cannot put things in the {holder}."
    return None


def _put(world: World, name: str, holder: str) -> str:
    thing, device = world.things[name], world.things[holder]
    thing.location = holder
    effect = _set_temperature(device, [thing]) if device.active else ""
    return f"You put the {name} in the {holder}.{effect}"


def _check_switch(world: World, name: str, on: bool) -> str | None:
    if not world.is_visible(name):
        return f"There is no {name} here."
    thing = world.things[name]
    if thing.kind != DEVICE:
        return f"The {name} cannot be {'activated' if on else 'deactivated'}."
    return f"The {name} is already {'on' if on else 'off'}." if thing.active == on else None


def _check_activate(world: World, name: str) -> str | None:
    return _check_switch(world, name, on=True)


def _check_deactivate(world: World, name: str) -> str | None:
    return _check_switch(world, name, on=False)


def _activate(world: World, name: str) -> str:
    device = world.things[name]
    device.active = True
    return f"The {name} is now on.{_set_temperature(device, world.contents(name))}"


def _deactivate(world: World, name: str) -> str:
    world.things[name].active = False
    return f"The {name} is now off."


def _check_use(world: World, tool: str, target: str) -> str | None:
    for missing in (tool, target):
        if not world.is_visible(missing):
            return f"There is no {missing} here."
    if world.things[tool].kind != TOOL:
        return f"You cannot use the {tool} as a tool."
    if world.things[tool].location != INVENTORY:
        return f"You are not holding the {tool}."
    if not world.things[target].sliceable:
        return f"The {target} cannot be sliced."
    return f"The {target} is already sliced." if world.things[target].sliced else None


def _use(world: World, tool: str, target: str) -> str:
    world.things[target].sliced = True
    return f"You slice the {target} with the {tool}."


def _check_mix(world: World, name: str) -> str | None:
    if not world.is_visible(name):
        return f"There is no {name} here."
    if name != BOWL:
        return "You can only mix things in the bowl."
    inside = world.contents(BOWL)
    if len(inside) < 2:
        return "The bowl needs at least two things to mix."
    if any(t.kind != ITEM for t in inside):
        return "Only food can be mixed."
    if MIXTURE in world.things and world.things[MIXTURE].location != BOWL:
        return "You already made a mixture; there is no room for another."
    return None


def _mix(world: World, name: str) -> str:
    inside = world.contents(BOWL)
    ingredients = sorted({i for t in inside for i in (t.ingredients or (t.name,))})
    for thing in inside:
        del world.things[thing.name]
    world.things[MIXTURE] = Thing(MIXTURE, ITEM, BOWL, ingredients=tuple(ingredients))
    return f"You mix the {join_words(ingredients)} into a mixture."


@dataclass(frozen=True)
class Verb:
    """One action form: its canonical wording, the pattern it is read with, its check and its effect."""

    template: str
    pattern: re.Pattern[str]
    check: Callable[..., str | None]
    apply: Callable[..., str]


VERBS = (
    Verb("look around", re.compile(r"look around|look"), _always_possible, _look),
    Verb("inventory", re.compile(r"inventory|check inventory"), _always_possible, _inventory),
    Verb("go to {}", re.compile(r"go (?:to )?(\w+)"), _check_go, _go),
    Verb("examine {}", re.compile(r"(?:examine|look at) (\w+)"), _check_visible, _examine),
    Verb("focus on {}", re.compile(r"focus on (\w+)"), _check_visible, _focus),
    Verb("pick up {}", re.compile(r"(?:pick up|take) (\w+)"), _check_pick_up, _pick_up),
    Verb("put {} in {}", re.compile(r"(?:put|move|place) (\w+) (?:in|into|on|to) (\w+)"), _check_put, _put),
    Verb("activate {}", re.compile(r"(?:activate|turn on) (\w+)"), _check_activate, _activate),
    Verb("deactivate {}", re.compile(r"(?:deactivate|turn off) (\w+)"), _check_deactivate, _deactivate),
    Verb("use {} on {}", re.compile(r"use (\w+) on (\w+)"), _check_use, _use),
    Verb("mix {}", re.compile(r"mix (\w+)"), _check_mix, _mix),
)
_ARTICLES = re.compile(r"\b(?:the|a|an|some)\b")


def parse(action: str) -> tuple[Verb, tuple[str, ...]] | None:
    """The verb and operands of `action` (case, articles and extra spaces ignored), or None."""
    text = " ".join(_ARTICLES.sub(" ", action.lower()).split()).rstrip(".!?")
    for verb in VERBS:
        match = verb.pattern.fullmatch(text)
        if match is not None:
            return verb, match.groups()
    return None
