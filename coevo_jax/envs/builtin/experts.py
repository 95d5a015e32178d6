"""The built-in environment's expert: a planner that solves a task with a short thought per action.

The planner plays on a copy of the task's start world (`tasks.Task.start`), so every action it plans is
checked by the rules of `world` as it goes: focus on the task's subject, then each skill of the family in
order (fetch, carry, put in, switch on, slice, mix), walking only when the next thing is in another room.
"""

from __future__ import annotations

from coevo_jax.envs.base import ExpertStep
from coevo_jax.envs.builtin.tasks import DEVICE_FOR, Task
from coevo_jax.envs.builtin.world import BOWL, DEVICE_TEMPERATURE, INVENTORY, KNIFE


class _Planner:
    """Plays the expert on a copy of a task's world, so every planned action is checked by the rules."""

    def __init__(self, task: Task):
        self.world = task.start.copy()
        self.steps: list[ExpertStep] = []

    def act(self, thought: str, action: str) -> None:
        observation, valid = self.world.step(action)
        if not valid:
            raise RuntimeError(f"builtin expert: {action!r} failed: {observation}")
        self.steps.append(ExpertStep(thought, action))

    def go(self, room: str, thought: str) -> None:
        if self.world.room != room:
            self.act(thought, f"go to {room}")

    def take(self, name: str) -> None:
        if self.world.things[name].location != INVENTORY:
            room = self.world.room_of(name)
            if self.world.room != room:
                self.act(f"I need the {name}; it is in the {room}.", f"go to {room}")
                self.act(f"I pick up the {name}.", f"pick up {name}")
            else:
                self.act(f"I need the {name}, and it is here.", f"pick up {name}")

    def put(self, name: str, holder: str, thought: str) -> None:
        self.take(name)
        room = self.world.room_of(holder)
        self.go(room, f"The {holder} is in the {room}.")
        self.act(thought, f"put {name} in {holder}")

    def focus(self, name: str) -> None:
        room = self.world.room_of(name)
        self.go(room, f"The task is about the {name}; it is in the {room}.")
        self.act(f"First I focus on the {name}.", f"focus on {name}")

    def change_temperature(self, name: str, device: str) -> None:
        self.put(name, device, f"I put the {name} in the {device}.")
        if not self.world.things[device].active:
            temperature = DEVICE_TEMPERATURE[device]
            self.act(f"I turn on the {device} to make the {name} {temperature}.", f"activate {device}")

    def slice(self, name: str) -> None:
        if self.world.room_of(KNIFE) != self.world.room_of(name):
            self.take(name)  # carry it to the knife rather than walk back
        self.take(KNIFE)
        self.act(f"Now I slice the {name} with the knife.", f"use knife on {name}")

    def mix(self, ingredients: tuple[str, ...]) -> None:
        for name in sorted(ingredients, key=lambda n: self.world.room_of(n) != self.world.room):
            self.take(name)
        for name in ingredients:
            self.put(name, BOWL, f"I put the {name} in the bowl.")
        self.act("Both are in the bowl, so I mix them.", f"mix {BOWL}")


def expert_steps(task: Task) -> list[ExpertStep]:
    """A short solution planned from the task's world: focus, then each skill in order."""
    planner = _Planner(task)
    skills = task.family.split("-")
    planner.focus(BOWL if skills[0] == "mix" else task.subject)
    for skill in skills:
        if skill == "mix":
            planner.mix(task.ingredients)
        elif skill == "slice":
            planner.slice(task.subject)
        elif skill == "move":
            planner.put(task.subject, task.target, f"I put the {task.subject} in the {task.target}.")
        else:
            planner.change_temperature(task.subject, DEVICE_FOR[skill])
    return planner.steps
