"""ReAct text conventions shared by the rollout loop, the expert solvers and the environments.

ETO's semantics (its `parse_action` and `step`): the agent's reply is stripped, the action is everything
after the first `Action: ` (multi-line allowed) with trailing punctuation removed, and a reply without one is
answered with an "Invalid format" observation that still spends a step. Observations are shown to the agent
as `Observation: <environment text>`.
"""

from __future__ import annotations

import re

ACTION_PATTERN = re.compile(r"Action: (.*)", re.DOTALL)
OBSERVATION_PREFIX = "Observation: "
INVALID_FORMAT_OBSERVATION = "Observation: Invalid format. The input must contains 'Action: '"
_TRAILING_PUNCTUATION = ".!?,;:"


def parse_action(reply: str) -> str | None:
    """The action in a ReAct reply (text after the first 'Action: '), or None when there is none."""
    match = ACTION_PATTERN.search(reply.strip())
    if match is None:
        return None
    return match.group(1).rstrip(_TRAILING_PUNCTUATION).strip()


def format_reply(thought: str | None, action: str) -> str:
    """An agent turn: 'Thought: ...\\nAction: ...' (just 'Action: ...' without a thought)."""
    return f"Thought: {thought}\nAction: {action}" if thought else f"Action: {action}"


def format_observation(text: str, prefix: str = OBSERVATION_PREFIX) -> str:
    """An environment reply as the agent sees it (ETO's WebShop uses the prefix "Observation:\\n")."""
    return prefix + text
