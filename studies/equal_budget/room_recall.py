"""How often a built-in-environment policy misremembers where the task said a thing is.

    python -m studies.equal_budget.room_recall WORKDIR/rollouts/sft_target_test_seen.jsonl [FILE ...]

The built-in task text gives the room of every thing the agent must carry ("The rice is in the workshop."),
and the expert's thoughts restate it before walking there ("I need the rice; it is in the workshop.", or
"..., and it is here." when the agent stands in that room). A small policy trained from scratch has to copy
that room from the task text many turns back; the SFT policies of different seeds fail whole task families
when they copy it wrong (they walk to the wrong room and search there). This counts, per rollout file, the
episodes with at least one thought that places a thing the agent has not picked up yet in another room than
the task text gave, and how many of those episodes failed.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import ASSISTANT, Trajectory

TASK_ROOM = re.compile(r"The ([a-z][a-z ]*?) is in the ([a-z]+)\.")
START_ROOM = re.compile(r"You are in the ([a-z]+)\.")
CLAIM_ROOM = re.compile(r"the ([a-z][a-z ]*?); it is in the ([a-z]+)\.")
CLAIM_HERE = re.compile(r"I need the ([a-z][a-z ]*?), and it is here\.")
WENT = re.compile(r"^Observation: You go to the ([a-z]+)\.")
PICKED = re.compile(r"^Observation: You pick up the ([a-z][a-z ]*?)\.")


@dataclass(frozen=True)
class RecallCount:
    episodes: int
    failures: int
    misplaced: int  # episodes with a thought that puts a thing elsewhere than the task text said
    misplaced_failures: int


def misplaced_claims(trajectory: Trajectory) -> list[tuple[str, str, str]]:
    """(thing, room the task gave, room a thought gave) for each thought that places a thing the agent has not
    picked up yet in another room than the task text; "here" is the room the agent stands in then."""
    task = trajectory.instruction
    given = dict(TASK_ROOM.findall(task))
    start = START_ROOM.search(task)
    room = start.group(1) if start else None
    held: set[str] = set()
    wrong = []
    for message in trajectory.messages[trajectory.prompt_len :]:
        text = message.content
        if message.role != ASSISTANT:
            if went := WENT.match(text):
                room = went.group(1)
            elif picked := PICKED.match(text):
                held.add(picked.group(1))
            continue
        claims = CLAIM_ROOM.findall(text) + [(thing, room) for thing in CLAIM_HERE.findall(text)]
        wrong += [
            (thing, given[thing], claimed)
            for thing, claimed in claims
            if thing in given and thing not in held and claimed != given[thing]
        ]
    return wrong


def recall_count(trajectories: Iterable[Trajectory], success: float = 1.0) -> RecallCount:
    """Episodes, failures (reward below `success`), and episodes with a misplaced thing among them."""
    episodes = failures = misplaced = misplaced_failures = 0
    for trajectory in trajectories:
        failed = trajectory.reward < success
        wrong = bool(misplaced_claims(trajectory))
        episodes += 1
        failures += failed
        misplaced += wrong
        misplaced_failures += wrong and failed
    return RecallCount(episodes, failures, misplaced, misplaced_failures)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="rollout .jsonl files of the built-in environment")
    args = parser.parse_args(argv)
    print("| file | episodes | failed | misplace a thing | of them failed |")
    print("|---|---:|---:|---:|---:|")
    for path in args.files:
        count = recall_count(
            read_trajectories(path)
        )  # a malformed record: an error naming file, record, field
        print(
            f"| {path} | {count.episodes} | {count.failures} | {count.misplaced} | {count.misplaced_failures} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
