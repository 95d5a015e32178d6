"""Trajectories: the data model, and its lossless JSON Lines records with a strict reader and a writer.

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

A malformed record raises `DataFormatError` naming the file, the record index and the field. With
`skip_bad=True` the reader skips such records instead, logs each one, and can return a `ReadReport`
(`return_report=True`); nothing is ever dropped silently. Files are JSON (a list) or JSON Lines (`.jsonl`),
read and written by `json_files`, which also defines `DataFormatError`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coevo_jax.data.json_files import DataFormatError, load_json_records, write_json_records

USER, ASSISTANT, SYSTEM = "user", "assistant", "system"
ROLE_ALIASES = {"human": USER, "user": USER, "gpt": ASSISTANT, "assistant": ASSISTANT, "system": SYSTEM}
ETO_ROLE_NAMES = {USER: "human", ASSISTANT: "gpt", SYSTEM: "system"}
AGENTS = ("expert", "target", "failure", "other")
ETO_ACK = "OK"  # the assistant's acknowledgement of the instruction turn in ETO's layout

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class ReadReport:
    """What a reader did with a file: how many records it read and which it skipped, and why."""

    path: str
    num_records: int
    errors: tuple[DataFormatError, ...] = ()

    @property
    def num_bad(self) -> int:
        return len(self.errors)

    @property
    def num_read(self) -> int:
        return self.num_records - self.num_bad

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "num_records": self.num_records,
            "num_read": self.num_read,
            "num_bad": self.num_bad,
            "bad": [{"index": e.index, "field": e.field_name, "problem": e.problem} for e in self.errors],
        }


def _parse_message(raw: object, source: str, index: int, where: str) -> Message:
    if not isinstance(raw, Mapping):
        raise DataFormatError(source, index, where, f"expected an object, got {type(raw).__name__}")
    role_key = "from" if "from" in raw else "role" if "role" in raw else None
    if role_key is None:
        raise DataFormatError(source, index, f"{where}.from", "missing role (neither 'from' nor 'role')")
    role = ROLE_ALIASES.get(raw[role_key]) if isinstance(raw[role_key], str) else None
    if role is None:
        raise DataFormatError(source, index, f"{where}.{role_key}", f"unknown role {raw[role_key]!r}")
    text_key = "value" if "value" in raw else "content" if "content" in raw else None
    if text_key is None:
        raise DataFormatError(source, index, f"{where}.value", "missing text (neither 'value' nor 'content')")
    if not isinstance(raw[text_key], str):
        problem = f"expected a string, got {type(raw[text_key]).__name__}"
        raise DataFormatError(source, index, f"{where}.{text_key}", problem)
    return Message(role, raw[text_key])


def parse_messages(raw_messages: object, source: str, index: int) -> tuple[Message, ...]:
    """`conversations`: a system message only first, then user and assistant alternating from user."""
    if not isinstance(raw_messages, list) or not raw_messages:
        raise DataFormatError(source, index, "conversations", "expected a non-empty list of messages")
    messages = tuple(
        _parse_message(raw, source, index, f"conversations[{i}]") for i, raw in enumerate(raw_messages)
    )
    expected = USER
    for i, message in enumerate(messages):
        if message.role == SYSTEM:
            if i != 0:
                raise DataFormatError(
                    source, index, f"conversations[{i}].from", "a system message may only come first"
                )
            continue
        if message.role != expected:
            problem = f"expected role {expected}, got {message.role}"
            raise DataFormatError(source, index, f"conversations[{i}].from", problem)
        expected = ASSISTANT if expected == USER else USER
    if not any(m.role == ASSISTANT for m in messages):
        raise DataFormatError(source, index, "conversations", "no assistant turn")
    return messages


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


def _require_str(record: Mapping, key: str, source: str, index: int, default: str | None = None) -> str:
    value = record.get(key, default)
    if not isinstance(value, str) or not value:
        raise DataFormatError(source, index, key, f"expected a non-empty string, got {value!r}")
    return value


def parse_reward(value: object, source: str, index: int, field_name: str = "reward") -> float:
    if value is None:
        raise DataFormatError(source, index, field_name, "missing (pass default_reward for files without)")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataFormatError(source, index, field_name, f"expected a finite number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise DataFormatError(source, index, field_name, f"{value!r} is outside [0, 1]")
    return float(value)


def parse_weight(value: object, source: str, index: int, field_name: str) -> float:
    """A loss weight (eq. 9's lambda_dpo, lambda_sft): a finite number >= 0 (NaN and infinities refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataFormatError(source, index, field_name, f"unexpected value {value!r}")
    if not (math.isfinite(value) and value >= 0.0):
        raise DataFormatError(source, index, field_name, f"expected a finite number >= 0, got {value!r}")
    return float(value)


def parse_metadata(
    record: Mapping, source: str, index: int, *, env: str, agent: str, iteration: int | None
) -> dict[str, object]:
    """The `env`, `agent`, `iteration` and `sampling` fields (each falling back to the given default)."""
    env_value = record.get("env", env)
    if not isinstance(env_value, str):
        raise DataFormatError(source, index, "env", f"expected a string, got {env_value!r}")
    agent_value = record.get("agent", agent)
    if agent_value not in AGENTS:
        raise DataFormatError(source, index, "agent", f"expected one of {AGENTS}, got {agent_value!r}")
    iteration_value = record.get("iteration", iteration)
    if iteration_value is not None and (
        isinstance(iteration_value, bool) or not isinstance(iteration_value, int) or iteration_value < 0
    ):
        raise DataFormatError(
            source, index, "iteration", f"expected null or an int >= 0, got {iteration_value!r}"
        )
    sampling = record.get("sampling", {})
    if not isinstance(sampling, Mapping) or not all(isinstance(k, str) for k in sampling):
        raise DataFormatError(source, index, "sampling", f"expected an object, got {sampling!r}")
    return {"env": env_value, "agent": agent_value, "iteration": iteration_value, "sampling": dict(sampling)}


KNOWN_KEYS = frozenset(
    {
        "id",
        "task_id",
        "env",
        "agent",
        "iteration",
        "reward",
        "prompt_len",
        "sampling",
        "conversations",
        "tokens",
    }
)


def parse_token_trace(raw: object, source: str, index: int) -> TokenTrace | None:
    """The optional `tokens` field: {"ids": [int], "reply_spans": [[start, end]], "logprobs": [float]}."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) != {"ids", "reply_spans", "logprobs"}:
        raise DataFormatError(source, index, "tokens", "expected an object with ids, reply_spans, logprobs")
    ids, spans, logprobs = raw["ids"], raw["reply_spans"], raw["logprobs"]
    is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)
    if not isinstance(ids, list) or not all(is_int(i) for i in ids):
        raise DataFormatError(source, index, "tokens.ids", "expected a list of ints")
    if not isinstance(spans, list) or not all(
        isinstance(s, list) and len(s) == 2 and all(is_int(i) for i in s) for s in spans
    ):
        raise DataFormatError(
            source, index, "tokens.reply_spans", "expected a list of [start, end] int pairs"
        )
    if not isinstance(logprobs, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs
    ):
        raise DataFormatError(source, index, "tokens.logprobs", "expected a list of numbers")
    try:
        return TokenTrace(ids, spans, logprobs)
    except ValueError as error:
        raise DataFormatError(source, index, "tokens", str(error)) from None


def parse_record(
    record: object,
    *,
    source: str = "<memory>",
    index: int = 0,
    default_reward: float | None = None,
    env: str = "",
    agent: str = "expert",
    iteration: int | None = None,
) -> Trajectory:
    """Validate one trajectory record and return it as a `Trajectory` (`env`, `agent`, ... are defaults)."""
    if not isinstance(record, Mapping):
        raise DataFormatError(source, index, "<record>", f"expected an object, got {type(record).__name__}")
    traj_id = _require_str(record, "id", source, index)
    task_id = _require_str(record, "task_id", source, index, default=traj_id)
    metadata = parse_metadata(record, source, index, env=env, agent=agent, iteration=iteration)
    messages = parse_messages(record.get("conversations"), source, index)
    prompt_len = record.get("prompt_len", default_prompt_len(messages))
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 1 <= prompt_len < len(messages):
        problem = f"expected an int in [1, {len(messages) - 1}], got {prompt_len!r}"
        raise DataFormatError(source, index, "prompt_len", problem)
    if messages[prompt_len - 1].role != USER:
        raise DataFormatError(source, index, "prompt_len", "the prompt must end with a user turn")
    reward = parse_reward(record.get("reward", default_reward), source, index)
    tokens = parse_token_trace(record.get("tokens"), source, index)
    extra = {k: v for k, v in record.items() if k not in KNOWN_KEYS}
    try:
        return Trajectory(
            traj_id, task_id, messages, reward, prompt_len=prompt_len, extra=extra, tokens=tokens, **metadata
        )
    except ValueError as error:  # a token trace that does not fit the conversation
        raise DataFormatError(source, index, "tokens", str(error)) from None


def parse_all(
    records: object, parse_one: Callable[[object, int], Trajectory], *, source: str, skip_bad: bool
) -> tuple[list[Trajectory], ReadReport]:
    """Parse every record (ids must be unique); with `skip_bad`, collect errors instead of raising."""
    if not isinstance(records, list):
        raise DataFormatError(
            source, -1, "<file>", f"expected a list of records, got {type(records).__name__}"
        )
    trajectories, errors, first_index = [], [], {}
    for index, record in enumerate(records):
        try:
            if isinstance(record, DataFormatError):  # a JSON Lines line that did not parse
                raise record
            trajectory = parse_one(record, index)
            if trajectory.traj_id in first_index:
                problem = (
                    f"duplicate id {trajectory.traj_id!r} (first at record {first_index[trajectory.traj_id]})"
                )
                raise DataFormatError(source, index, "id", problem)
        except DataFormatError as err:
            if not skip_bad:
                raise
            errors.append(err)
            continue
        first_index[trajectory.traj_id] = index
        trajectories.append(trajectory)
    report = ReadReport(source, len(records), tuple(errors))
    if errors:
        log.warning(
            "%s: skipped %d bad record(s) of %d:\n%s",
            source,
            report.num_bad,
            report.num_records,
            "\n".join(str(e) for e in errors),
        )
    return trajectories, report


def parse_records(
    records: object, *, source: str = "<memory>", default_reward: float | None = None
) -> list[Trajectory]:
    """Parse a list of records strictly; trajectory ids must be unique."""
    parse_one = lambda r, i: parse_record(r, source=source, index=i, default_reward=default_reward)
    return parse_all(records, parse_one, source=source, skip_bad=False)[0]


def read_trajectories(
    path: str | os.PathLike[str],
    *,
    default_reward: float | None = None,
    skip_bad: bool = False,
    return_report: bool = False,
    env: str = "",
    agent: str = "expert",
) -> list[Trajectory] | tuple[list[Trajectory], ReadReport]:
    """Read and validate a trajectory file (`.json` list or `.jsonl`); `(trajectories, report)` on request."""
    source = os.fspath(path)

    def parse_one(record: object, index: int) -> Trajectory:
        return parse_record(
            record, source=source, index=index, default_reward=default_reward, env=env, agent=agent
        )

    records = load_json_records(source, strict=False)  # bad lines surface in record order
    trajectories, report = parse_all(records, parse_one, source=source, skip_bad=skip_bad)
    return (trajectories, report) if return_report else trajectories


def messages_to_conversations(messages: Iterable[Message]) -> list[dict[str, str]]:
    return [{"from": ETO_ROLE_NAMES[m.role], "value": m.content} for m in messages]


def trajectory_to_record(trajectory: Trajectory) -> dict[str, object]:
    """The full record of a trajectory (`from`/`value` spelling); inverse of `parse_record`."""
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
    """Write full trajectory records; `read_trajectories` gives back equal trajectories (extra included)."""
    write_json_records(path, (trajectory_to_record(t) for t in trajectories))
