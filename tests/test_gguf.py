"""Tests for reading GGUF checkpoints: tokenizer rebuild, dequantised tensors, config, errors.

References are independent of our code: transformers' own GGUF loaders (tokenizer and torch model,
test-only) and a torch `LlamaForCausalLM` greedy decode built from our config and tensors.
"""

import os

import pytest

from coevo_jax.models.gguf_tokenizer import load_gguf_tokenizer

# Texts where a run of whitespace never precedes a digit: there transformers' GGUF tokenizer (plain GPT-2
# split) and llama.cpp's "smollm" split (digits first) agree, so ids must be equal as they are.
VARIED_TEXTS = [
    "Hello, world!",
    "The capital of France is",
    "  leading spaces and trailing spaces   ",
    "multiple   spaces\there\t\ttabs\nnew line\n\n\nthree newlines\r\nwindows",
    "digits 0123456789, 3.14159, 1e-10, -42 and 1,000,000",
    "punctuation: !?.,;:'\"()[]{}<>@#$%^&*-_=+~`|\\/",
    "contractions: I'm, you're, it's, we've, they'll, he'd, don't",
    "unicode: café naïve Zürich Ελληνικά русский 中文 日本語 한국어 العربية",
    "emoji: 🙂🚀👩‍💻 and flags 🇫🇷",
    "def f(x):\n    return [i**2 for i in range(x) if i % 2 == 0]  # comment\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    'json: {"key": [1, 2, {"nested": null}], "ok": true}',
    "",
    " ",
    "\n",
    "a",
]
# Whitespace runs before digits: llama.cpp splits digits off first, so `"a  5"` -> `a|ĠĠ|5`, whereas
# transformers' GGUF tokenizer gives `a|Ġ|Ġ|5`. We follow llama.cpp (and SmolLM2's own tokenizer.json).
SPACES_BEFORE_DIGITS_TEXTS = [
    "a  5",
    "x\n\n  7",
    "total:   12 items\n\n2024",
    "indent\n    42\n\t\t3",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf_path):
    return load_gguf_tokenizer(smollm2_gguf_path)


@pytest.fixture(scope="module")
def reference_tokenizer(smollm2_gguf_path):
    """transformers' own GGUF tokenizer conversion, loaded offline from the file's folder."""
    from transformers import AutoTokenizer

    folder, name = os.path.split(smollm2_gguf_path)
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def split_digits_off(text: str) -> list[str]:
    """Cut `text` before and after every numeric character, as llama.cpp's `\\p{N}` first pass does."""
    pieces, current = [], ""
    for char in text:
        if char.isnumeric():
            pieces += [current, char] if current else [char]
            current = ""
        else:
            current += char
    return pieces + [current] if current else pieces


def llama_cpp_style_ids(reference_tokenizer, text: str) -> list[int]:
    """Ids llama.cpp gives for a "smollm" vocabulary: digits split off, then GPT-2 BPE on each piece."""
    return [i for piece in split_digits_off(text) for i in reference_tokenizer.encode(piece)]


@pytest.mark.parametrize("text", VARIED_TEXTS + SPACES_BEFORE_DIGITS_TEXTS)
def test_tokenizer_round_trips_text_exactly(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_token_ids_equal_transformers_gguf_tokenizer(tokenizer, reference_tokenizer, text):
    assert tokenizer.encode(text) == reference_tokenizer.encode(text)


@pytest.mark.parametrize("text", VARIED_TEXTS + SPACES_BEFORE_DIGITS_TEXTS)
def test_token_ids_follow_llama_cpp_digit_split(tokenizer, reference_tokenizer, text):
    assert tokenizer.encode(text) == llama_cpp_style_ids(reference_tokenizer, text)


def test_whitespace_before_digit_stays_one_token(tokenizer):
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("a  5")) == ["a", "ĠĠ", "5"]


def test_special_tokens_come_from_metadata(tokenizer):
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<|im_start|>", 1)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|im_end|>", 2)
    assert tokenizer.unk_token == "<|endoftext|>"
    assert len(tokenizer) == 49152
    # Control tokens are matched whole and no BOS/EOS is added (add_bos_token is false in the file).
    assert tokenizer.encode("<|im_start|>hi<|im_end|>") == [1, 6004, 2]


def test_chat_template_renders_conversation(tokenizer, reference_tokenizer):
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in text
    assert "<|im_start|>assistant\nParis.<|im_end|>\n" in text
    assert text == reference_tokenizer.apply_chat_template(messages, tokenize=False)
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(prompt)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    assert tokenizer.decode(ids) == prompt
