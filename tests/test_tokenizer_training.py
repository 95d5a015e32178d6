"""The offline-trained byte-level BPE chat tokenizer: round trips, fixed ChatML ids, template, masks, saving."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from transformers import AutoTokenizer

from coevo_jax.data.chat_format import chat_format_for, describe_mask, tokenize_trajectory
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Message, Trajectory
from coevo_jax.tokenization.training import (
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    chat_corpus,
    render_chatml,
    train_chat_tokenizer,
    train_tokenizer_for_trajectories,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "tests", "data", "eto_records.jsonl")
VOCAB_SIZE = 1024

CONVERSATION = (
    Message("system", "You are an agent."),
    Message("user", "Task: boil water."),
    Message("assistant", "Thought: go.\nAction: look around"),
    Message("user", "Observation: a kitchen."),
)
CONVERSATION_TEXT = (
    "<|im_start|>system\nYou are an agent.<|im_end|>\n"
    "<|im_start|>user\nTask: boil water.<|im_end|>\n"
    "<|im_start|>assistant\nThought: go.\nAction: look around<|im_end|>\n"
    "<|im_start|>user\nObservation: a kitchen.<|im_end|>\n"
)
REACT = Trajectory(
    "react_0",
    "react",
    (
        Message("user", "Interact with a household to solve a task."),
        Message("assistant", "OK"),
        Message("user", "Your task is to: heat 2 eggs."),
        Message("assistant", "Thought: eggs are in the fridge.\nAction: go to fridge 1"),
        Message("user", "Observation: The fridge 1 is closed."),
        Message("assistant", "Thought: open it.\nAction: open fridge 1"),
        Message("user", "Observation: You see 2 eggs, a tomato and ünïcödé 🥚."),
    ),
    1.0,
    prompt_len=3,
)
REACT_MARKED = (
    "<|im_start|>user\nInteract with a household to solve a task.<|im_end|>\n"
    "<|im_start|>assistant\nOK<|im_end|>\n"
    "<|im_start|>user\nYour task is to: heat 2 eggs.<|im_end|>\n"
    "<|im_start|>assistant\n«Thought: eggs are in the fridge.\nAction: go to fridge 1<|im_end|>»\n"
    "<|im_start|>user\nObservation: The fridge 1 is closed.<|im_end|>\n"
    "<|im_start|>assistant\n«Thought: open it.\nAction: open fridge 1<|im_end|>»\n"
    "<|im_start|>user\nObservation: You see 2 eggs, a tomato and ünïcödé 🥚.<|im_end|>\n"
)
# Trains the same corpus in a fresh process with one thread and another hash seed; prints the result's hash.
FRESH_PROCESS_TRAINING = f"""
import hashlib
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.tokenization.training import train_tokenizer_for_trajectories
tok = train_tokenizer_for_trajectories(read_trajectories({RECORDS!r}), {VOCAB_SIZE})
print(hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest())
"""


@pytest.fixture(scope="module")
def trajectories():
    return read_trajectories(RECORDS)


@pytest.fixture(scope="module")
def tokenizer(trajectories):
    return train_tokenizer_for_trajectories(trajectories, VOCAB_SIZE)


def _sha256(tokenizer) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


def test_special_tokens_have_fixed_small_ids(tokenizer):
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2]
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 0)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.bos_token is None and tokenizer.unk_token is None
    assert sorted(tokenizer.all_special_ids) == [0, 1, 2]
    assert tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)[::5] == [1, 2]
    assert tokenizer.decode([1, 2, 0], skip_special_tokens=True) == ""


def test_special_tokens_are_not_learned_as_merges(tokenizer):
    """The corpus is split at special tokens before BPE, so no vocabulary is spent on their pieces."""
    learned = [token for token, i in tokenizer.get_vocab().items() if i >= len(SPECIAL_TOKENS)]
    assert not [token for token in learned if "<|" in token or "|>" in token or "im_" in token]


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii: Thought: go.\nAction: look around",
        "ünïcödé, 中文字符, Ελληνικά, עברית, emoji 🥚🤖👩‍👩‍👧, math ∑∫√∞",
        "digits 3141592653 and -0.5e10, $64.98, 100.00",
        "control\x00chars\x07\x1b[0m\t\r\n\x7f and a lone surrogate-free 𝔘𝔫𝔦",
        "   leading and trailing whitespace \n\n\t ",
        "special tokens inline: <|im_start|>assistant\nok<|im_end|>\n<|endoftext|>",
        "",
    ],
)
def test_any_string_round_trips(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < len(tokenizer) for i in ids)
    assert tokenizer.decode(ids) == text


def test_unseen_characters_round_trip_through_the_byte_alphabet(tokenizer, trajectories):
    corpus = "".join(chat_corpus(trajectories))
    unseen = "ß→Ω😀"
    assert not any(char in corpus for char in unseen)
    ids = tokenizer.encode(unseen, add_special_tokens=False)
    assert tokenizer.decode(ids) == unseen
    assert len(ids) == len(unseen.encode("utf-8"))  # one byte symbol each: no merges, no unknown token


def test_digits_are_split_one_by_one(tokenizer):
    assert tokenizer.tokenize("2048") == ["2", "0", "4", "8"]
    assert tokenizer.tokenize(" 12") == ["Ġ", "1", "2"]


def test_chatml_glue_is_merged(tokenizer):
    """Rendering the corpus through the template lets BPE learn the template's words whole."""
    for word in ("assistant", "user", "Action", "Observation"):
        assert tokenizer.tokenize(word) == [word]


@pytest.mark.parametrize("vocab_size", [MIN_VOCAB_SIZE, 300, VOCAB_SIZE])
def test_vocab_size_is_reached_exactly_when_the_corpus_allows(trajectories, vocab_size):
    tokenizer = train_tokenizer_for_trajectories(trajectories, vocab_size)
    assert len(tokenizer) == vocab_size


def test_vocab_size_is_an_upper_bound_and_has_a_floor(trajectories):
    tokenizer = train_tokenizer_for_trajectories(trajectories, 50_000)
    assert MIN_VOCAB_SIZE < len(tokenizer) < 50_000  # the corpus runs out of pairs seen twice
    assert len(train_chat_tokenizer(["one text"], 10_000, min_frequency=1)) < 300
    with pytest.raises(ValueError, match="below 259"):
        train_chat_tokenizer(["text"], MIN_VOCAB_SIZE - 1)


def test_training_is_deterministic(trajectories, tokenizer):
    """Same corpus and size: identical vocabulary and merges, again in this process and in a fresh one."""
    again = train_tokenizer_for_trajectories(list(trajectories), VOCAB_SIZE)
    assert _sha256(again) == _sha256(tokenizer)
    assert again.get_vocab() == tokenizer.get_vocab()
    env = {**os.environ, "PYTHONPATH": ROOT, "RAYON_NUM_THREADS": "1", "PYTHONHASHSEED": "12345"}
    fresh = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS_TRAINING], env=env, capture_output=True, text=True, check=True
    )
    assert fresh.stdout.strip() == _sha256(tokenizer)


def test_chat_template_renders_chatml_without_a_default_system_prompt(tokenizer):
    messages = [{"role": m.role, "content": m.content} for m in CONVERSATION]
    render = lambda prompt: tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=prompt
    )
    assert render(False) == CONVERSATION_TEXT == render_chatml(CONVERSATION)
    assert render(True) == CONVERSATION_TEXT + "<|im_start|>assistant\n"
    no_system = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert no_system == "<|im_start|>user\nTask: boil water.<|im_end|>\n<|im_start|>assistant\n"


def test_chat_corpus_yields_each_conversation_as_the_template_renders_it(tokenizer):
    trajectory = Trajectory("c", "c", CONVERSATION[1:3], 1.0)
    (text,) = chat_corpus([trajectory])
    assert text == (
        "<|im_start|>user\nTask: boil water.<|im_end|>\n"
        "<|im_start|>assistant\nThought: go.\nAction: look around<|im_end|>\n"
    )
    messages = [{"role": m.role, "content": m.content} for m in trajectory.messages]
    assert text == tokenizer.apply_chat_template(messages, tokenize=False)
    assert list(chat_corpus([REACT, trajectory])) == [render_chatml(REACT.messages), text]


def test_save_and_reload_with_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert _sha256(reloaded) == _sha256(tokenizer)
    assert reloaded.chat_template == tokenizer.chat_template
    assert (reloaded.eos_token_id, reloaded.pad_token_id, reloaded.bos_token_id) == (2, 0, None)
    assert sorted(reloaded.all_special_ids) == [0, 1, 2]
    text = render_chatml(REACT.messages)
    assert reloaded.encode(text) == tokenizer.encode(text)
    messages = [{"role": m.role, "content": m.content} for m in CONVERSATION]
    assert reloaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        CONVERSATION_TEXT + "<|im_start|>assistant\n"
    )


def test_react_trajectory_masks_actions_and_their_end_of_turn(tokenizer, tmp_path):
    """«...» marks action tokens: content plus `<|im_end|>`; not the prompt's "OK", headers or observations."""
    tokenizer.save_pretrained(tmp_path)
    for tok in (tokenizer, AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)):
        tokens = tokenize_trajectory(tok, chat_format_for(tok, "chat_template"), REACT)
        assert describe_mask(tok, tokens) == REACT_MARKED
        assert tokens.input_ids[tokens.action_ends - 1].tolist() == [2, 2]
        assert tok.decode(tokens.input_ids[tokens.action_mask]) == "<|im_end|>".join(REACT.actions) + (
            "<|im_end|>"
        )
        np.testing.assert_array_equal(tokens.input_ids, tok.encode(render_chatml(REACT.messages)))


def test_real_trajectories_masked_tokens_decode_to_exactly_the_actions(tokenizer, trajectories):
    chat_format = chat_format_for(tokenizer, "chat_template")
    for trajectory in trajectories:
        tokens = tokenize_trajectory(tokenizer, chat_format, trajectory)
        masked = tokenizer.decode(tokens.input_ids[tokens.action_mask])
        assert masked == "".join(action + "<|im_end|>" for action in trajectory.actions), trajectory.traj_id
        assert tokenizer.decode(tokens.input_ids) == render_chatml(trajectory.messages)
