"""The LLM path: the paper's roles played by a local model (any checkpoint `load_pretrained` reads; the
bundled SmolLM2-135M-Instruct by default), with the same verification by execution as the programmatic path.

1. Reflection (Fig. 11): the signal and its rollout in, a JSON object out (summary, failure_cause,
   instability_pattern, focus_pattern, exploration_objectives, do_not_repeat), read by `parse_reflection`.
2. Exploration (Figs. 9-10): from the signal's task (a random train task when unguided), each step the model
   gets the signal's guidance with the reflection as context, the task text and the steps so far, and
   replies with a reason and an `Action:`; the action is played through the environment's `reset`/`step`,
   and the environment's synthesizer says whether it was accepted (`Synthesizer.step_ok`).
3. Abstraction (Fig. 12): the accepted (action, observation) tuples in, Description / Query / ActionSequence
   blocks out (`parse_abstraction`); the first block whose sequence is long enough becomes a task through the
   environment's synthesizer (`task_from_actions`), which then verifies it (`Synthesizer.verify`).

A small model's output is often not what the prompts ask for. Nothing it writes can raise: a reflection
that is no JSON object, or one without the schema's fields, an abstraction without its blocks, and a
sequence the environment cannot replay are rejections with a reason, which the round counts. The model is
SmolLM2-135M by default because it is the checkpoint this project ships; expect nothing of its quality
(its reflections are rarely valid JSON and its actions rarely valid): the path exists so that a stronger
checkpoint can take the paper's roles with nothing else changed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Callable

from coevo_jax.coevolve import prompts
from coevo_jax.coevolve.config import CoEvolveConfig
from coevo_jax.coevolve.signals import Signal
from coevo_jax.coevolve.synthesis import Exploration, Step, Synthesizer, synthesizer_for
from coevo_jax.react import parse_action

Generate = Callable[[str, str], str]  # (system prompt, user prompt) -> reply
LIST_FIELDS = ("focus_pattern", "exploration_objectives", "do_not_repeat")
TEXT_FIELDS = ("summary", "failure_cause", "instability_pattern")
HISTORY_STEPS = 6  # steps of history shown to the explorer
EVIDENCE_CHARS = 3_000  # trajectory evidence shown to the reflection, from its end
OBSERVATION_CHARS = 300


@dataclasses.dataclass(frozen=True)
class Reflection:
    """The reflection's JSON fields (Fig. 11)."""

    summary: str = ""
    failure_cause: str = ""
    instability_pattern: str = ""
    focus_pattern: tuple[str, ...] = ()
    exploration_objectives: tuple[str, ...] = ()
    do_not_repeat: tuple[str, ...] = ()

    def context(self) -> str:
        """The exploration guidance's {context}."""
        lines = [f"{name}: {getattr(self, name)}" for name in TEXT_FIELDS if getattr(self, name)]
        lines += [f"{name}: {'; '.join(getattr(self, name))}" for name in LIST_FIELDS if getattr(self, name)]
        return "\n".join(lines)


def _json_objects(text: str):
    """Every JSON object in the text, tried from each '{' (then with trailing commas dropped, then as a
    Python literal, which reads single quotes)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            yield decoder.raw_decode(text, match.start())[0]
        except json.JSONDecodeError:
            pass
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        body = re.sub(r",\s*([}\]])", r"\1", text[start : end + 1])
        for parse in (json.loads, ast.literal_eval):
            try:
                yield parse(body)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass


def parse_reflection(text: str) -> Reflection | str:
    """The reflection in a model's reply, or the reason it has none (never raises)."""
    found = [obj for obj in _json_objects(text) if isinstance(obj, dict)]
    if not found:
        return "reflection is not a JSON object"
    data = max(found, key=lambda obj: len(set(obj) & {*TEXT_FIELDS, *LIST_FIELDS}))
    if not set(data) & {*TEXT_FIELDS, *LIST_FIELDS}:
        return "reflection JSON lacks the schema's fields"

    def items(value) -> tuple[str, ...]:
        values = value if isinstance(value, list) else [value] if value else []
        return tuple(str(v) for v in values if str(v).strip())

    return Reflection(
        **{name: str(data.get(name) or "") for name in TEXT_FIELDS},
        **{name: items(data.get(name)) for name in LIST_FIELDS},
    )


@dataclasses.dataclass(frozen=True)
class Abstraction:
    """One block of the abstraction's output (Fig. 12)."""

    description: str
    query: str
    actions: tuple[str, ...]


_BLOCK = re.compile(
    r"Description\s*:\s*(?P<description>.*?)\s*Query\s*:\s*(?P<query>.*?)\s*Action\s*Sequence\s*:\s*"
    r"(?P<actions>.*?)(?=Description\s*:|\Z)",
    re.I | re.S,
)
_ITEM = re.compile(
    r"^\s*(?:\d+\s*[.):]|[-*]|step\s*\d+\s*[:.])?\s*(?:Action\s*:\s*)?(?P<action>.*?)\s*$", re.I
)


def parse_abstraction(text: str) -> list[Abstraction] | str:
    """The Description / Query / ActionSequence blocks in a model's reply, or why there are none."""
    blocks = []
    for match in _BLOCK.finditer(text):
        actions = [_ITEM.match(line)["action"].strip("`") for line in match["actions"].splitlines()]
        actions = [a for a in actions if a]
        blocks.append(Abstraction(match["description"].strip(), match["query"].strip(), tuple(actions)))
    return blocks or "abstraction lacks Description / Query / ActionSequence"


def _evidence(trajectory) -> str:
    text = "\n".join(f"{m.role}: {m.content}" for m in trajectory.messages[trajectory.prompt_len - 1 :])
    return f"(reward {trajectory.reward})\n{text[-EVIDENCE_CHARS:]}"


class LlmSynthesizer(Synthesizer):
    """The paper's roles played by `generate` in the environment `env_name` (see the module docstring)."""

    def __init__(self, env_name: str, generate: Generate, environment: Synthesizer | None = None):
        self.env_name, self.generate = env_name, generate
        self.environment = environment or synthesizer_for(env_name)

    @classmethod
    def from_config(cls, env_name: str, config: CoEvolveConfig) -> LlmSynthesizer:
        """With a model loaded from `config.llm_model` (the bundled SmolLM2 when empty)."""
        from coevo_jax.coevolve.generation import TextGenerator

        generator = TextGenerator.load(
            config.llm_model, max_new_tokens=config.llm_max_new_tokens, temperature=config.llm_temperature
        )
        return cls(env_name, generator)

    def reflect(self, signal: Signal) -> Reflection | str:
        prompt = prompts.REFLECTION.format(
            signal=f"{signal.kind} ({signal.detail})", trajectory_context=_evidence(signal.evidence)
        )
        return parse_reflection(self.generate("", prompt))

    def explore(self, env, signal, rng, *, steps, exploration_id):
        context: dict = {}
        if signal is None:
            parent, guidance = rng.choice(env.tasks("train")), prompts.GUIDANCE["unguided"]
        else:
            parent, reflection = signal.task_id, self.reflect(signal)
            if isinstance(reflection, str):
                return Exploration(exploration_id, signal, parent, (), {"rejection": f"llm: {reflection}"})
            guidance = prompts.GUIDANCE[signal.kind].format(context=reflection.context())
            context["reflection"] = dataclasses.asdict(reflection)
        initial = env.reset(parent)
        system = prompts.EXPLORATION_SYSTEM.format(action_format=env.instruction)
        taken: list[Step] = []
        for _ in range(steps):
            history = "\n".join(
                f"Action: {s.action}\nObservation: {s.observation[:OBSERVATION_CHARS]}"
                for s in taken[-HISTORY_STEPS:]
            )
            user = prompts.EXPLORATION_USER.format(
                exploration_guidance=guidance, initial_obs=initial, history_text=history or "(none yet)"
            )
            action = parse_action(self.generate(system, user))
            if not action:
                taken.append(Step("", "Invalid format: no 'Action: '", False))
                continue
            if action.strip().lower() == "submit":  # would end the episode: nothing to explore there
                taken.append(Step(action, "not played while exploring", False))
                continue
            observation, _, done, info = env.step(action)
            taken.append(Step(action, observation, self.environment.step_ok(observation, info)))
            if done:
                break
        return Exploration(exploration_id, signal, parent, tuple(taken), context)

    def abstract(self, env, exploration, *, min_steps):
        if "rejection" in exploration.context:
            return exploration.context["rejection"]
        accepted = [s for s in exploration.steps if s.ok]
        if not accepted:
            return "llm: no step was accepted"
        tuples = "\n".join(
            f"({i + 1}) action: {s.action}\n    observation: {s.observation[:OBSERVATION_CHARS]}"
            for i, s in enumerate(accepted)
        )
        text = self.generate(
            "", prompts.ABSTRACTION.format(output_format=prompts.OUTPUT_FORMAT, tuples=tuples)
        )
        blocks = parse_abstraction(text)
        if isinstance(blocks, str):
            return f"llm: {blocks}"
        block = next((b for b in blocks if len(b.actions) >= min_steps), None)
        if block is None:
            return "llm: no ActionSequence of min_steps actions"
        spec = self.environment.task_from_actions(
            env, exploration.parent, block.actions, block.query, min_steps=min_steps
        )
        return f"llm: {spec}" if isinstance(spec, str) else spec

    def step_ok(self, observation, info):
        return self.environment.step_ok(observation, info)

    def task_from_actions(self, env, parent, actions, instruction, *, min_steps):
        return self.environment.task_from_actions(env, parent, actions, instruction, min_steps=min_steps)

    def verify(self, env, spec):
        return self.environment.verify(env, spec)
