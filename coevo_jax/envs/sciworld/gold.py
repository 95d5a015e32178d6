"""ScienceWorld expert demonstrations from the simulator's gold action paths, with short templated thoughts.

ScienceWorld generates a gold action sequence for every task variation (`load(..., generateGoldPath=True)`).
The paths walk from room to room ("open door to hallway", "go to hallway", "open door to kitchen", "go to
kitchen") although ETO's "easy" setting opens every door and allows teleporting, and they often run a few
actions past the one that completes the task (ScienceWorld then reports the episode done). So
`gold_expert_steps` first tries the path with each such walk replaced by one "teleport to ROOM"
(`shortcut_navigation`; about a third shorter, e.g. 43 -> 17 actions), and falls back to the path as
generated when the shortcut does not reach reward 1.0 (tasks that count the time it takes, such as watching
a life cycle); either is cut at the action that ends the episode, found by a replay. Each action gets a
thought from a template keyed by its verb ("go to kitchen" -> "I should go to the kitchen."): short,
deterministic, and never claiming more than the action does. `SciWorldEnv.expert_result` replays the steps
through the environment and says why a demonstration is unusable when it does not reach 1.0 (`ExpertResult`).

Replays go through the `Environment` interface only, so this module never imports `env` (which imports it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment, ExpertStep

# (pattern, template): the first pattern that matches the whole action gives its thought.
THOUGHT_TEMPLATES: tuple[tuple[re.Pattern, str], ...] = tuple(
    (re.compile(pattern), template)
    for pattern, template in (
        (r"look around", "I should look around to see what is here."),
        (r"look at (.+)", "I should look at {0}."),
        (r"examine (.+)", "I should examine {0}."),
        (r"read (.+)", "I should read {0}."),
        (r"inventory", "I should check what I am carrying."),
        (r"(?:go|teleport) to (.+)", "I should go to {0}."),
        (r"open door to (.+)", "I need to open the door to {0}."),
        (r"open (.+)", "I should open {0}."),
        (r"close (.+)", "I should close {0}."),
        (r"pick up (.+)", "I need to pick up {0}."),
        (r"(?:drop|put down) (.+)", "I should put down {0}."),
        (r"move (.+) to (.+)", "I should move {0} to {1}."),
        (r"pour (.+) (?:into|in) (.+)", "I should pour {0} into {1}."),
        (r"use (.+) on (.+)", "I will use {0} on {1}."),
        (r"use (.+)", "I will use {0}."),
        (r"activate (.+)", "I should turn on {0}."),
        (r"deactivate (.+)", "I should turn off {0}."),
        (r"connect (.+) to (.+)", "I need to connect {0} to {1}."),
        (r"disconnect (.+)", "I should disconnect {0}."),
        (r"mix (.+)", "Now I can mix {0}."),
        (r"focus on (.+)", "I should focus on {0}, as the task asks."),
        (r"eat (.+)", "I should eat {0}."),
        (r"flush (.+)", "I should flush {0}."),
        (r"wait1", "I need to wait one step."),
        (r"wait\d*", "I need to wait for a while."),
        (r"(\d+)", "Several things match that, so I choose option {0}."),
    )
)
FALLBACK_THOUGHT = "Next, I will {0}."
_NAVIGATION = re.compile(r"(open door to|go to|teleport to) (.+)")
_ARTICLES = ("a ", "an ", "the ")


def _noun(phrase: str) -> str:
    """'kitchen' -> 'the kitchen' (left alone when it already has an article)."""
    return phrase if phrase.startswith(_ARTICLES) else f"the {phrase}"


def thought_for(action: str) -> str:
    """The templated thought that goes with a gold action."""
    for pattern, template in THOUGHT_TEMPLATES:
        match = pattern.fullmatch(action)
        if match:
            args = [g if g.isdigit() else _noun(g) for g in match.groups()]
            return template.format(*args)
    return FALLBACK_THOUGHT.format(action)


def shortcut_navigation(actions: list[str]) -> list[str]:
    """Each run of door-opening and room-to-room moves replaced by one teleport to where the run ends.

    A run that opens doors without moving is dropped (the "easy" setting has every door open already).
    """
    shortened: list[str] = []
    index = 0
    while index < len(actions):
        destination, end = None, index
        while end < len(actions) and (match := _NAVIGATION.fullmatch(actions[end])):
            if match.group(1) != "open door to":
                destination = match.group(2)
            end += 1
        if end == index:
            shortened.append(actions[index])
            index += 1
            continue
        if destination is not None:
            shortened.append(f"teleport to {destination}")
        index = end
    return shortened


def _until_done(env: Environment, task_id: str, actions: list[str]) -> tuple[list[str], float]:
    """The actions up to the one that ends the episode (all when none does), and the reward reached."""
    env.reset(task_id)
    reward = 0.0
    for index, action in enumerate(actions):
        _, reward, done, _ = env.step(action)
        if done:
            return actions[: index + 1], reward
    return actions, reward


def gold_expert_steps(
    env: Environment, task_id: str, actions: list[str], simplification: str
) -> list[ExpertStep]:
    """The (shortcut, else generated) gold path `actions` of `task_id` up to the action that ends the episode.

    See the module docstring. Candidates are replayed in `env`; the shortcut is tried only when `simplification`
    (the environment's ScienceWorld setting) allows teleporting. A path that reaches no reward 1.0 is returned
    as generated (its replay then shows the reward it does reach).
    """
    candidates = [actions]
    if any(s in simplification.split(",") for s in ("easy", "teleportAction")):
        shortcut = shortcut_navigation(actions)
        if shortcut != actions:
            candidates.insert(0, shortcut)
    for candidate in candidates:  # the last one is the path as generated
        kept, reward = _until_done(env, task_id, candidate)
        if reward >= 1.0:
            break
    return [ExpertStep(thought_for(action), action) for action in kept]


@dataclass(frozen=True)
class ExpertResult:
    """The outcome of one task's gold-path demonstration."""

    task_id: str
    trajectory: Trajectory | None  # None when the simulator failed
    reason: str | None  # why it is not a usable demonstration; None when it reaches reward 1.0
    steps: int  # actions replayed into the trajectory
    gold_seconds: float  # generating and cutting the gold path (expert_steps)
    replay_seconds: float  # the recorded replay, its reset included

    @property
    def ok(self) -> bool:
        return self.reason is None
