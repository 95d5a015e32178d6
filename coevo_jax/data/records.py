"""Trajectories: the data model, and its lossless JSON Lines records and their writer.

A trajectory e = (u, a_1, o_1, ..., a_n) (paper section 4.1) is a message list whose first `prompt_len`
messages are the instruction u (never trained on) and whose remaining messages alternate assistant actions
a_t (ReAct text, `Thought: ...` included) and user observations o_t. One record, one JSON line:

    {"id": "webshop_12_target_0",          # unique trajectory id (required)
     "task_id": "webshop_12",              # the instruction u; pairs are only formed within one task_id
     "env": "webshop",                     # environment name ("" = unknown)
     "agent": "target",                    # who produced it: expert | target | failure | other
     "iteration": 2,                       # co-evolution iteration that sampled it; null for expert data
     "reward": 0.75,                       # r(u, e) in [0, 1]
     "prompt_len": 3,                      # leading messages that make up u
     "sampling": {"temperature": 1.0, "seed": 7, "model": "..."},   # free-form sampling metadata
     "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...],
     "tokens": {"ids": [...], "reply_spans": [[start, end], ...], "logprobs": [...]},   # optional
     ...}                                  # any other key is kept verbatim in `Trajectory.extra`

This is ETO's conversation record (see `formats` for ETO's exact layout) plus the fields co-evolution needs.
`tokens` (`TokenTrace`) is written by a model actor's rollouts: the exact token ids the policy was conditioned
on and sampled, which of them it sampled (one span per assistant turn), and the sampler's log-prob of each
sampled token. GRPO trains on these ids as they are (no re-tokenisation).
Messages may also be spelled `{"role": "user"|"assistant"|"system", "content": ...}`. Defaults: `task_id` =
`id`, `agent` = "expert", `env` = "", `iteration` = null, `sampling` = {}; a missing `reward` is an error
unless the reader gets `default_reward`. A missing `prompt_len` is 1 (2 after a system message), or 3 (4) when
the conversation opens with ETO's layout (instruction, an assistant "OK", the task): the "OK" is prompt.

The strict reader of these records (`parse_record`, `read_trajectories`) is `record_reader`. Files are JSON
(a list) or JSON Lines (`.jsonl`), read and written by `json_files`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coevo_jax.data.json_files import write_json_records

USER, ASSISTANT, SYSTEM = "user", "assistant", "system"
ROLE_ALIASES = {"human": USER, "user": USER, "gpt": ASSISTANT, "assistant": ASSISTANT, "system": SYSTEM}
ETO_ROLE_NAMES = {USER: "human", ASSISTANT: "gpt", SYSTEM: "system"}
AGENTS = ("expert", "target", "failure", "other")
ETO_ACK = "OK"  # the assistant's acknowledgement of the instruction turn in ETO's layout


@dataclass(frozen=True)
class Message:
    role: str  # "user" (instruction or observation), "assistant" (action), or "system"
    content: str


@dataclass(frozen=True)
class Turn:
    """One ReAct step: the action a_t (with its `Thought:`) and the observation o_t after it (None at the end)."""

    action: str
    observation: str | None


@dataclass(frozen=True)
class TokenTrace:
    """The exact tokens of one sampled episode, as the policy saw and produced them.

    `ids` is the whole context: prompt, replies and observations in the sampler's own tokenization.
    `reply_spans` holds one [start, end) span of `ids` per assistant turn after the prompt: the tokens the
    policy sampled and kept in its context (its end-of-turn token included when it sampled it; a reply cut
    at a stop string keeps only the tokens before the cut). `logprobs` are the sampler's log-probs of the
    span tokens, in order (see `coevo_jax.sampling.sample_with_logprobs`).
    """

    ids: tuple[int, ...]
    reply_spans: tuple[tuple[int, int], ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))
        object.__setattr__(self, "reply_spans", tuple((int(a), int(b)) for a, b in self.reply_spans))
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        problem = self.problem()
        if problem:
            raise ValueError(f"token trace: {problem}")

    def problem(self) -> str | None:
        """Why this trace is inconsistent, or None."""
        if any(i < 0 for i in self.ids):
            return "negative token id"
        end = 0
        for start, stop in self.reply_spans:
            if not end <= start <= stop <= len(self.ids):
                return (
                    f"reply span {[start, stop]} overlaps the previous one or leaves the {len(self.ids)} ids"
                )
            end = stop
        if len(self.logprobs) != self.num_reply_tokens:
            return f"{len(self.logprobs)} logprobs for {self.num_reply_tokens} reply tokens"
        if not all(math.isfinite(x) and x <= 0.0 for x in self.logprobs):
            return "logprobs must be finite and <= 0"
        return None

    @property
    def num_reply_tokens(self) -> int:
        return sum(stop - start for start, stop in self.reply_spans)

    def to_record(self) -> dict[str, list]:
        return {
            "ids": list(self.ids),
            "reply_spans": [list(s) for s in self.reply_spans],
            "logprobs": list(self.logprobs),
        }


@dataclass(frozen=True)
class Trajectory:
    """One episode for one instruction. The first `prompt_len` messages are the instruction u."""

    traj_id: str
    task_id: str
    messages: tuple[Message, ...]
    reward: float
    agent: str = "expert"
    prompt_len: int = 1
    env: str = ""
    iteration: int | None = None
    sampling: Mapping[str, object] = field(default_factory=dict)
    extra: Mapping[str, object] = field(default_factory=dict, compare=False)
    tokens: TokenTrace | None = None  # the sampled episode's exact tokens (model actors' rollouts)

    def __post_init__(self) -> None:
        if self.agent not in AGENTS:
            raise ValueError(f"{self.traj_id}: agent {self.agent!r} is not one of {AGENTS}")
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"{self.traj_id}: reward {self.reward!r} is outside [0, 1]")
        if self.tokens is not None and len(self.tokens.reply_spans) != len(self.actions):
            raise ValueError(
                f"{self.traj_id}: token trace has {len(self.tokens.reply_spans)} reply spans for "
                f"{len(self.actions)} actions"
            )

    @property
    def prompt(self) -> tuple[Message, ...]:
        return self.messages[: self.prompt_len]

    @property
    def instruction(self) -> str:
        """The task as the agent was given it: the last user message of the prompt."""
        return next(m.content for m in reversed(self.prompt) if m.role == USER)

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The ReAct steps after the prompt, (a_1, o_1), ..., (a_n, None or a trailing observation)."""
        rest = self.messages[self.prompt_len :]
        return tuple(
            Turn(rest[i].content, rest[i + 1].content if i + 1 < len(rest) else None)
            for i in range(0, len(rest), 2)
        )

    @property
    def actions(self) -> tuple[str, ...]:
        """The assistant turns after the prompt: a_1 ... a_n."""
        return tuple(m.content for m in self.messages[self.prompt_len :] if m.role == ASSISTANT)

    @property
    def observations(self) -> tuple[str, ...]:
        """The user turns after the prompt: o_1 ... o_{n-1} (and o_n if the record kept it)."""
        return tuple(m.content for m in self.messages[self.prompt_len :] if m.role == USER)


def has_eto_prompt(messages: Sequence[Message]) -> bool:
    """Whether the conversation opens with ETO's instruction / "OK" / task turns and has an action after."""
    return (
        len(messages) >= 4
        and [m.role for m in messages[:4]] == [USER, ASSISTANT, USER, ASSISTANT]
        and messages[1].content.strip() == ETO_ACK
    )


def default_prompt_len(messages: Sequence[Message]) -> int:
    """ETO's three turns or else the first user turn, after a system message if there is one."""
    offset = int(messages[0].role == SYSTEM)
    return offset + (3 if has_eto_prompt(messages[offset:]) else 1)


def messages_to_conversations(messages: Iterable[Message]) -> list[dict[str, str]]:
    return [{"from": ETO_ROLE_NAMES[m.role], "value": m.content} for m in messages]


def trajectory_to_record(trajectory: Trajectory) -> dict[str, object]:
    """The full record of a trajectory (`from`/`value` spelling); inverse of `record_reader.parse_record`."""
    record = {
        "id": trajectory.traj_id,
        "task_id": trajectory.task_id,
        "env": trajectory.env,
        "agent": trajectory.agent,
        "iteration": trajectory.iteration,
        "reward": trajectory.reward,
        "prompt_len": trajectory.prompt_len,
        "sampling": dict(trajectory.sampling),
        "conversations": messages_to_conversations(trajectory.messages),
        **dict(trajectory.extra),
    }
    if trajectory.tokens is not None:
        record["tokens"] = trajectory.tokens.to_record()
    return record


def write_trajectories(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> None:
    """Write full trajectory records; `record_reader.read_trajectories` gives them back equal (extra included)."""
    write_json_records(path, (trajectory_to_record(t) for t in trajectories))
