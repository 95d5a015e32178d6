"""Render a trajectory as one token sequence and mark its action tokens (the indicator of paper eq. 5).

Rendering produces the text plus the character spans of every *trained* assistant turn (assistant turns
after the instruction prompt). Tokenizing with offsets then turns spans into a per-token `action_mask`,
aligned with `input_ids` (unshifted): `action_mask[k] = 1` iff token k was generated as part of an action.
The next-token shift for the loss happens in `coevo_jax.data.batching`.

What a span covers, for every format:
* the assistant content, and the end-of-turn token that closes the turn (`<|im_end|>` for ChatML/SmolLM2/
  Qwen, `</s>` for Llama-2), so the model learns to stop;
* not the assistant header (`<|im_start|>assistant\\n`, `[/INST]`): the serving loop writes it, the model
  never generates it;
* not the newline the ChatML template writes after `<|im_end|>`: generation stops at `<|im_end|>`, so the
  model never produces that newline either; it is template glue before the next (user) header.
* Llama-2 only: the space the template puts between the content and `</s>` is inside the span (the model
  emits it before `</s>`); the space after `[/INST]` is outside, but when the tokenizer merges it into the
  first content token (sentencepiece `▁Thought`) that token is marked, since it does carry content.
A token counts as an action token when its character range overlaps a span.

Two formats (`chat_format_for(tokenizer, name)` picks one by its config name):
* `Llama2ChatFormat` ("llama2_fastchat"): ETO's FastChat "llama-2" conversation, rendered directly (no Jinja):
  `<s>[INST] {u} [/INST] {a1} </s><s>[INST] {o1} [/INST] {a2} </s>...` (`</s><s>` between turns), with the `<<SYS>>` block inside the
  first `[INST]` only when a system message is given (ETO's was empty).
* `ChatTemplateFormat` ("chat_template"): any tokenizer chat template through `apply_chat_template`. Assistant spans are found
  by rendering the conversation prefix by prefix: the turn starts where the render of the messages before it
  plus the generation prompt ends, and stops at the last end-of-turn string before the end of the render
  that includes it. Templates whose render of a prefix is not a prefix of the full render (e.g. ones that
  rewrite earlier turns) are refused with an error rather than masked wrongly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coevo_jax.data.records import ASSISTANT, SYSTEM, USER, Message, Trajectory


@dataclass(frozen=True)
class RenderedConversation:
    text: str
    action_spans: tuple[tuple[int, int], ...]  # [start, end) character spans of trained assistant turns


@dataclass(frozen=True)
class TokenizedTrajectory:
    input_ids: np.ndarray  # int32 [n]
    action_mask: np.ndarray  # bool [n], aligned with input_ids (unshifted)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    @property
    def action_ends(self) -> np.ndarray:
        """int [num actions]: one past the last token (the end-of-turn) of each action's masked run.

        Runs never touch: a user turn's header always lies between two actions.
        """
        mask = self.action_mask
        return np.flatnonzero(mask & ~np.append(mask[1:], False)) + 1


def _as_dicts(messages: Sequence[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


@dataclass(frozen=True)
class Llama2ChatFormat:
    """FastChat "llama-2" as ETO used it; each assistant turn ends with `eos`, counted as its end of turn."""

    bos: str = "<s>"
    eos: str = "</s>"
    default_system: str = ""

    @classmethod
    def for_tokenizer(cls, tokenizer, default_system: str = "") -> Llama2ChatFormat:
        return cls(bos=tokenizer.bos_token, eos=tokenizer.eos_token, default_system=default_system)

    def render(self, messages: Sequence[Message], prompt_len: int) -> RenderedConversation:
        system = self.default_system
        if messages and messages[0].role == SYSTEM:
            system, messages, prompt_len = messages[0].content, messages[1:], prompt_len - 1
        pieces, spans, length = [], [], 0

        def emit(piece: str) -> None:
            nonlocal length
            pieces.append(piece)
            length += len(piece)

        for i, message in enumerate(messages):
            if message.role == USER:
                header = f"<<SYS>>\n{system}\n<</SYS>>\n\n" if i == 0 and system else ""
                emit(f"{self.bos}[INST] {header}{message.content} [/INST]")
            elif message.role == ASSISTANT:
                emit(" ")
                start = length
                emit(f"{message.content} {self.eos}")
                if i >= prompt_len:
                    spans.append((start, length))
        return RenderedConversation("".join(pieces), tuple(spans))

    def prompt_text(self, messages: Sequence[Message]) -> str:
        """What the policy is conditioned on before its next action (messages end with a user turn)."""
        return self.render(messages, len(messages)).text


@dataclass(frozen=True)
class ChatTemplateFormat:
    """A tokenizer's own chat template; `end_of_turn` defaults to the tokenizer's eos token."""

    tokenizer: object
    end_of_turn: str | None = None

    def _apply(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            _as_dicts(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def prompt_text(self, messages: Sequence[Message]) -> str:
        """What the policy is conditioned on before its next action (messages end with a user turn)."""
        return self._apply(messages, add_generation_prompt=True)

    def render(self, messages: Sequence[Message], prompt_len: int) -> RenderedConversation:
        end_of_turn = self.end_of_turn or self.tokenizer.eos_token
        full = self._apply(messages, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message.role != ASSISTANT or i < prompt_len:
                continue
            before = self._apply(messages[:i], add_generation_prompt=True)
            through = self._apply(messages[: i + 1], add_generation_prompt=False)
            if not (full.startswith(before) and full.startswith(through) and len(through) > len(before)):
                raise ValueError(
                    f"chat template is not prefix-stable at message {i}; cannot locate the action"
                )
            eot_offset = full.rfind(end_of_turn, len(before), len(through))
            if eot_offset < 0:
                raise ValueError(f"no end-of-turn {end_of_turn!r} after assistant message {i}")
            spans.append((len(before), eot_offset + len(end_of_turn)))
        return RenderedConversation(full, tuple(spans))


CHAT_FORMATS = ("chat_template", "llama2_fastchat")


def chat_format_for(tokenizer, name: str = "chat_template", *, default_system: str = ""):
    """The rendering a config names: the tokenizer's own template, or ETO's FastChat Llama-2 format."""
    if name == "chat_template":
        return ChatTemplateFormat(tokenizer)
    if name == "llama2_fastchat":
        return Llama2ChatFormat.for_tokenizer(tokenizer, default_system=default_system)
    raise ValueError(f"unknown chat format {name!r}; expected one of {CHAT_FORMATS}")


def action_mask_from_offsets(
    offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
) -> np.ndarray:
    """bool [n]: token k is an action token iff its character range overlaps one of the spans.

    A zero-width token (offsets a == b, as some tokenizers report for whitespace) counts when a lies inside.
    """
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    a, b = bounds[:, 0], bounds[:, 1]
    mask = np.zeros(len(bounds), dtype=bool)
    for start, end in spans:
        mask |= ((a < end) & (b > start)) | ((a == b) & (start <= a) & (a < end))
    return mask


def tokenize_rendered(tokenizer, rendered: RenderedConversation) -> TokenizedTrajectory:
    """Tokenize the rendered text as is (special tokens written in the text; none added)."""
    encoding = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    input_ids = np.asarray(encoding["input_ids"], dtype=np.int32)
    mask = action_mask_from_offsets(encoding["offset_mapping"], rendered.action_spans)
    return TokenizedTrajectory(input_ids, mask)


def tokenize_trajectory(tokenizer, chat_format, trajectory: Trajectory) -> TokenizedTrajectory:
    """Render `trajectory` with `chat_format` and tokenize it with its action mask."""
    return tokenize_rendered(tokenizer, chat_format.render(trajectory.messages, trajectory.prompt_len))


def describe_mask(tokenizer, tokenized: TokenizedTrajectory) -> str:
    """The text with action-token runs wrapped in «...»: a human-readable view of the mask."""
    out, run, inside = [], [], False
    for token_id, is_action in zip(tokenized.input_ids.tolist(), tokenized.action_mask.tolist(), strict=True):
        if is_action != inside:
            out.append(tokenizer.decode(run) + ("«" if is_action else "»"))
            run, inside = [], is_action
        run.append(token_id)
    out.append(tokenizer.decode(run) + ("»" if inside else ""))
    return "".join(out)
