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
    chat_format_for,
    describe_mask,
    tokenize_trajectory,
)
from coevo_jax.data.chat_templates import CHATML_TEMPLATE, LLAMA2_CHAT_TEMPLATE
from coevo_jax.data.pairs import build_target_pairs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Message, Trajectory
from coevo_jax.tokenization.gguf import load_gguf_tokenizer

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


# What each format's action span decodes to around the action text: (before, after incl. end-of-turn). The
# Llama-2 spaces are template text that the tokenizer merges into the first content token / emits before </s>.
AROUND_ACTION = {
    "smollm2": ("", "<|im_end|>"),
    "qwen_chatml": ("", "<|im_end|>"),
    "llama2_jinja": (" ", " </s>"),
    "llama2_direct": (" ", " </s>"),
}


@pytest.mark.parametrize("name", ["smollm2", "qwen_chatml", "llama2_jinja", "llama2_direct"])
def test_real_trajectories_masked_tokens_decode_to_exactly_the_actions(formats, name):
    """ETO in-context examples and InterCode GPT-4 episodes (ETO's prompt layout, "OK" included): the masked
    tokens decode to the concatenated actions plus end-of-turn tokens, nothing more, nothing less."""
    tokenizer, chat_format, end_of_turn = formats[name]
    before, after = AROUND_ACTION[name]
    for traj in read_trajectories(RECORDS):
        tokens = tokenize_trajectory(tokenizer, chat_format, traj)
        masked = tokens.input_ids[tokens.action_mask]
        assert tokenizer.decode(masked) == "".join(before + a + after for a in traj.actions), traj.traj_id
        assert len(tokens.action_ends) == len(traj.actions) and traj.prompt_len == 3
        starts = [0, *tokens.action_ends[:-1]]
        for action, start, end in zip(traj.actions, starts, tokens.action_ends, strict=True):
            run = tokens.input_ids[start:end][tokens.action_mask[start:end]]
            assert tokenizer.decode(run) == before + action + after  # one masked run per action
            assert tokens.input_ids[end - 1] == end_of_turn


def test_chat_format_for_config_names(formats):
    tokenizer = formats["llama2_jinja"][0]
    assert isinstance(chat_format_for(tokenizer), ChatTemplateFormat)
    assert chat_format_for(tokenizer, "llama2_fastchat") == Llama2ChatFormat("<s>", "</s>")
    with pytest.raises(ValueError, match="unknown chat format"):
        chat_format_for(tokenizer, "vicuna")


def _intercode(traj_id):
    return next(t for t in read_trajectories(RECORDS) if t.traj_id == traj_id)


def test_real_pairs_to_dpo_batch_scores_exactly_the_actions(formats):
    """Real InterCode episode as expert, a shortened copy as a failed target rollout, through to the batch."""
    tokenizer, chat_format, end_of_turn = formats["smollm2"]
    expert = _intercode("intercode_sql_0_gpt-4")
    failed = Trajectory(
        "intercode_sql_0_target", expert.task_id, expert.messages[:5], 0.0, "target", prompt_len=3
    )
    (pair,) = build_target_pairs([expert], [failed], [])
    (tokenized,), report = tokenize_pairs([pair], tokenizer, chat_format, max_length=1024)
    assert (report.items, report.kept_whole, report.cut, report.dropped) == (1, 1, 0, 0)
    batch = collate_dpo([tokenized], length=1024, pairs_per_batch=2, pad_id=tokenizer.pad_token_id)
    for row, source in ((0, expert), (1, failed)):  # rows 2p, 2p + 1: pair p's chosen and rejected sides
        scored = batch["targets"][row][batch["loss_mask"][row] == 1]
        assert scored.tolist().count(end_of_turn) == len(source.actions)
        assert tokenizer.decode(scored) == "<|im_end|>".join(source.actions) + "<|im_end|>"
    np.testing.assert_array_equal(batch["lambda_dpo"], [0.5, 0.0])
    np.testing.assert_array_equal(batch["lambda_sft"], [0.5, 0.0])


@pytest.mark.parametrize("name", ["smollm2", "llama2_direct"])
def test_over_long_trajectories_lose_whole_turns_from_the_end(formats, name):
    """Cut to fit: prompt + a_1, o_1, ..., a_k, the same tokens as rendering that shorter trajectory."""
    tokenizer, chat_format, end_of_turn = formats[name]
    expert = _intercode("intercode_sql_0_gpt-4")  # 5 actions
    full = tokenize_trajectory(tokenizer, chat_format, expert)
    ends = full.action_ends.tolist()
    assert len(ends) == 5 and ends[-1] == len(full) - (name == "smollm2")  # ChatML's "\n" after <|im_end|>
    (cut,), report = tokenize_sft_examples([expert], tokenizer, chat_format, max_length=ends[2] + 5)
    assert len(cut) == ends[2] and cut.input_ids[-1] == end_of_turn and cut.action_mask[-1]
    assert report.to_dict() == {
        "policy": "cut_turns",
        "max_length": ends[2] + 5,
        "items": 1,
        "kept_whole": 0,
        "cut": 1,
        "dropped": 0,
        "trajectories_cut": 1,
        "trajectories_dropped": 0,
        "turns_cut": 2,
        "identical_after_cut": 0,
    }
    shorter = Trajectory("short", expert.task_id, expert.messages[: 3 + 5], 1.0, prompt_len=3)  # a_1 .. a_3
    rendered = tokenize_trajectory(tokenizer, chat_format, shorter)
    np.testing.assert_array_equal(rendered.input_ids[: len(cut)], cut.input_ids)
    np.testing.assert_array_equal(rendered.action_mask[: len(cut)], cut.action_mask)
    assert len(rendered) - len(cut) == (name == "smollm2")  # only ChatML's untrained trailing "\n" differs
    assert tokenizer.decode(cut.input_ids[cut.action_mask]) == tokenizer.decode(
        rendered.input_ids[rendered.action_mask]
    )


def test_over_long_pairs_are_cut_the_same_way_and_counted(formats):
    tokenizer, chat_format, _ = formats["smollm2"]
    expert = _intercode("intercode_sql_0_gpt-4")  # 5 actions
    target = Trajectory("tgt", expert.task_id, expert.messages[:6], 0.2, "target", prompt_len=3)  # 2 actions
    agent = Trajectory("fail", expert.task_id, expert.messages[:9], 0.4, "failure", prompt_len=3)  # 3 actions
    pairs = build_target_pairs([expert], [target], [agent])  # (exp, fail), (exp, tgt), (fail, tgt)
    ends = tokenize_trajectory(tokenizer, chat_format, expert).action_ends.tolist()
    limit = ends[1] + 1  # room for prompt + a_1, o_1, a_2 (and ChatML's trailing "\n")
    fitted, report = tokenize_pairs(pairs, tokenizer, chat_format, max_length=limit)
    # Each side keeps the shared prompt and its first two actions: the expert loses 3 turns, the failure
    # agent's trajectory 1, the target's fits whole. The failure agent had copied the expert's first three
    # actions, so (expert, failure) is cut to identical sides and dropped: no preference is left in it.
    assert [(len(p.chosen), len(p.rejected)) for p in fitted] == [(ends[1], limit), (ends[1], limit)]
    assert (report.items, report.kept_whole, report.cut, report.dropped) == (3, 0, 2, 1)
    assert (report.trajectories_cut, report.trajectories_dropped, report.turns_cut) == (2, 0, 4)
    assert report.identical_after_cut == 1
    for p in fitted:
        for side in (p.chosen, p.rejected):
            assert tokenizer.decode(side.input_ids[side.action_mask]).count("<|im_end|>") == 2
    fitted, report = tokenize_pairs(pairs, tokenizer, chat_format, max_length=ends[0] - 1)
    assert fitted == [] and (report.dropped, report.trajectories_dropped) == (3, 3)  # prompt + a_1 too long
    fitted, report = tokenize_pairs(pairs, tokenizer, chat_format, max_length=limit, overflow="drop")
    assert fitted == [] and (report.dropped, report.trajectories_dropped) == (
        3,
        2,
    )  # every pair has exp or fail
