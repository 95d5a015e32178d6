"""Action-token masks with SmolLM2's real tokenizer and template, ChatML (Qwen) and Llama-2 (Jinja and direct)."""

import copy
import os

import numpy as np
import pytest

from coevo_jax.data.batching import collate_dpo, tokenize_pairs, tokenize_sft_examples
from coevo_jax.data.chat_format import (
    ChatTemplateFormat,
    Llama2ChatFormat,
    action_mask_from_offsets,
    describe_mask,
    tokenize_trajectory,
)
from coevo_jax.data.chat_templates import CHATML_TEMPLATE, LLAMA2_CHAT_TEMPLATE
from coevo_jax.data.pairs import build_target_pairs
from coevo_jax.data.records import Message, Trajectory, read_trajectories
from coevo_jax.models.gguf_tokenizer import load_gguf_tokenizer

RECORDS = os.path.join(os.path.dirname(__file__), "data", "eto_records.jsonl")

CONVERSATION = (
    Message("user", "Task: boil water."),
    Message("assistant", "Thought: go.\nAction: look around"),
    Message("user", "Observation: a kitchen."),
    Message("assistant", "Action: done"),
)
SMOL_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)
QWEN_SYSTEM = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
)
CHATML_BODY = (
    "<|im_start|>user\nTask: boil water.<|im_end|>\n"
    "<|im_start|>assistant\n«Thought: go.\nAction: look around<|im_end|>»\n"
    "<|im_start|>user\nObservation: a kitchen.<|im_end|>\n"
    "<|im_start|>assistant\n«Action: done<|im_end|>»\n"
)
LLAMA2_MARKED = (
    "<s>[INST] Task: boil water. [/INST]« Thought: go.\nAction: look around </s>»"
    "<s>[INST] Observation: a kitchen. [/INST]« Action: done </s>»"
)


@pytest.fixture(scope="module")
def formats(smollm2_gguf_path):
    """name -> (tokenizer, chat format, end-of-turn token id)."""
    smol = load_gguf_tokenizer(smollm2_gguf_path)
    qwen = copy.deepcopy(smol)
    qwen.chat_template = CHATML_TEMPLATE
    llama = copy.deepcopy(smol)  # the vocabulary does not matter here; Llama-2's bos/eos strings do
    llama.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>"})
    llama.chat_template = LLAMA2_CHAT_TEMPLATE
    im_end = smol.convert_tokens_to_ids("<|im_end|>")
    return {
        "smollm2": (smol, ChatTemplateFormat(smol), im_end),
        "qwen_chatml": (qwen, ChatTemplateFormat(qwen), im_end),
        "llama2_jinja": (llama, ChatTemplateFormat(llama), llama.eos_token_id),
        "llama2_direct": (llama, Llama2ChatFormat.for_tokenizer(llama), llama.eos_token_id),
    }


def trajectory(messages, prompt_len=1):
    return Trajectory("t", "t", tuple(messages), 0.5, prompt_len=prompt_len)


@pytest.mark.parametrize(
    "name, marked",
    [
        ("smollm2", SMOL_SYSTEM + CHATML_BODY),
        ("qwen_chatml", QWEN_SYSTEM + CHATML_BODY),
        ("llama2_jinja", LLAMA2_MARKED),
        ("llama2_direct", LLAMA2_MARKED),
    ],
    ids=["smollm2", "qwen_chatml", "llama2_jinja", "llama2_direct"],
)
def test_mask_covers_action_and_end_of_turn_only(formats, name, marked):
    """«...» marks action tokens: content plus end-of-turn; not the header, not the newline after <|im_end|>."""
    tokenizer, chat_format, end_of_turn = formats[name]
    tokens = tokenize_trajectory(tokenizer, chat_format, trajectory(CONVERSATION))
    assert describe_mask(tokenizer, tokens) == marked
    ids, mask = tokens.input_ids, tokens.action_mask
    run_ends = np.flatnonzero(mask & ~np.append(mask[1:], False))
    assert ids[run_ends].tolist() == [end_of_turn, end_of_turn]


def test_llama2_direct_rendering_equals_the_jinja_template(formats):
    tokenizer, jinja, _ = formats["llama2_jinja"]
    direct = Llama2ChatFormat.for_tokenizer(tokenizer)
    with_system = (Message("system", "Be brief."), *CONVERSATION)
    for messages, prompt_len in ((CONVERSATION, 1), (with_system, 2)):
        assert direct.render(messages, prompt_len).text == jinja.render(messages, prompt_len).text
        a = tokenize_trajectory(tokenizer, direct, trajectory(messages, prompt_len))
        b = tokenize_trajectory(tokenizer, jinja, trajectory(messages, prompt_len))
        np.testing.assert_array_equal(a.input_ids, b.input_ids)
        np.testing.assert_array_equal(a.action_mask, b.action_mask)
    text = direct.render(with_system, 2).text
    assert text.startswith("<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nTask: boil water. [/INST] Thought")


def test_assistant_turns_inside_the_prompt_are_not_trained(formats):
    tokenizer, chat_format, _ = formats["smollm2"]
    icl_prompt = (Message("user", "Instruction."), Message("assistant", "OK"), *CONVERSATION)
    tokens = tokenize_trajectory(tokenizer, chat_format, trajectory(icl_prompt, prompt_len=3))
    assert describe_mask(tokenizer, tokens).endswith("assistant\nOK<|im_end|>\n" + CHATML_BODY)


@pytest.mark.parametrize("name", ["smollm2", "qwen_chatml", "llama2_direct"])
def test_prompt_text_then_action_is_what_training_sees(formats, name):
    """Inference prompt + generated action + end-of-turn is a prefix of the training text."""
    tokenizer, chat_format, _ = formats[name]
    rendered = chat_format.render(CONVERSATION, 1)
    for i, (start, end) in zip((1, 3), rendered.action_spans, strict=True):
        prompt = chat_format.prompt_text(CONVERSATION[:i])
        assert rendered.text.startswith(prompt)
        assert rendered.text[start:end].strip().startswith(CONVERSATION[i].content)


def test_template_that_rewrites_history_is_refused(formats):
    tokenizer = copy.deepcopy(formats["smollm2"][0])
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if loop.last %} (latest){% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(ValueError, match="not prefix-stable at message 1"):
        ChatTemplateFormat(tokenizer).render(CONVERSATION, 1)


def test_offsets_to_mask_rules():
    offsets = [(0, 3), (3, 5), (5, 5), (5, 9), (9, 12)]
    np.testing.assert_array_equal(action_mask_from_offsets(offsets, [(4, 9)]), [0, 1, 1, 1, 0])
    np.testing.assert_array_equal(action_mask_from_offsets(offsets, [(0, 3), (10, 11)]), [1, 0, 0, 0, 1])


@pytest.mark.parametrize("name", ["smollm2", "qwen_chatml", "llama2_jinja", "llama2_direct"])
def test_real_trajectories_one_masked_run_per_action(formats, name):
    """ETO in-context examples and InterCode GPT-4 episodes: each action is one run ending in end-of-turn."""
    tokenizer, chat_format, end_of_turn = formats[name]
    for traj in read_trajectories(RECORDS):
        tokens = tokenize_trajectory(tokenizer, chat_format, traj)
        mask = tokens.action_mask
        starts = np.flatnonzero(mask & ~np.insert(mask[:-1], 0, False))
        ends = np.flatnonzero(mask & ~np.append(mask[1:], False)) + 1
        assert len(starts) == len(traj.actions), traj.traj_id
        for action, start, end in zip(traj.actions, starts, ends, strict=True):
            assert tokens.input_ids[end - 1] == end_of_turn
            assert tokenizer.decode(tokens.input_ids[start : end - 1]).strip() == action.strip()


def test_real_pairs_to_dpo_batch_scores_exactly_the_actions(formats):
    """Real InterCode episode as expert, a shortened copy as a failed target rollout, through to the batch."""
    tokenizer, chat_format, end_of_turn = formats["smollm2"]
    expert = next(t for t in read_trajectories(RECORDS) if t.traj_id == "intercode_sql_0_gpt-4")
    failed = Trajectory("intercode_sql_0_target", expert.task_id, expert.messages[:3], 0.0, "target")
    (pair,) = build_target_pairs([expert], [failed], [])
    (tokenized,), counts = tokenize_pairs([pair], tokenizer, chat_format, max_length=1024)
    assert counts == {"kept": 1, "truncated": 0, "dropped": 0}
    batch = collate_dpo([tokenized], length=1024, pairs_per_batch=2, pad_id=tokenizer.pad_token_id)
    for row, source in ((0, expert), (2, failed)):
        scored = batch["targets"][row][batch["loss_mask"][row] == 1]
        assert scored.tolist().count(end_of_turn) == len(source.actions)
        assert tokenizer.decode(scored) == "<|im_end|>".join(source.actions) + "<|im_end|>"
    np.testing.assert_array_equal(batch["lambda_dpo"], [0.5, 0.0])
    np.testing.assert_array_equal(batch["lambda_sft"], [0.5, 0.0])
    _, cut = tokenize_sft_examples(
        [expert, failed], tokenizer, chat_format, max_length=200, overflow="truncate"
    )
    assert cut == {"kept": 1, "truncated": 1, "dropped": 0}
