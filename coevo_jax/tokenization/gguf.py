"""Rebuild a Hugging Face fast tokenizer from a GGUF file's metadata.

A GGUF file carries no `tokenizer.json`; llama.cpp stores the vocabulary, the BPE merges, the token
types, the special-token ids and the chat template as metadata under `tokenizer.*` keys. This module
reads those keys and assembles the equivalent `tokenizers` pipeline (byte-level BPE with the
pre-tokenizer split that `tokenizer.ggml.pre` names), wrapped in a `PreTrainedTokenizerFast` whose
`apply_chat_template` uses the file's template.

Only byte-level BPE (`tokenizer.ggml.model == "gpt2"`, used by SmolLM2, Qwen2 and Qwen3) is supported;
other tokenizer models raise a `ValueError` naming the file.

The pre-tokenizer follows llama.cpp's own choice for each `tokenizer.ggml.pre` value, so token ids match
what the model was trained on. For SmolLM2 (`pre == "smollm"`) this means digits are split off one by
one *before* the GPT-2 regex runs, exactly like the original `tokenizer.json` (Digits + ByteLevel).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

GGUF_MAGIC = b"GGUF"

# llama.cpp's `llama_token_type` values stored in `tokenizer.ggml.token_type`.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# Pre-tokenizer families, keyed by `tokenizer.ggml.pre`, mirroring llama.cpp's `llama_vocab` table.
GPT2_PRE_TYPES = frozenset({"default", "gpt2", "mpt", "olmo", "jais"})
DIGITS_THEN_GPT2_PRE_TYPES = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
REGEX_PRE_TYPES = {
    "qwen2": QWEN2_SPLIT,
    "deepseek-r1-qwen": QWEN2_SPLIT,
    "stablelm2": QWEN2_SPLIT,
    "llama-bpe": LLAMA3_SPLIT,
    "llama3": LLAMA3_SPLIT,
    "llama-v3": LLAMA3_SPLIT,
    "smaug-bpe": LLAMA3_SPLIT,
    "dbrx": LLAMA3_SPLIT,
}


def open_gguf_reader(path: str | os.PathLike[str]) -> gguf.GGUFReader:
    """Open `path` with `gguf.GGUFReader`, with errors that name the file.

    Raises FileNotFoundError when it does not exist and ValueError when it is not a GGUF file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with open(path, "rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(path)
    except Exception as error:  # the reader raises assorted errors on truncated/corrupt files
        raise ValueError(f"cannot read GGUF file {path}: {error}") from error


def metadata_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """The decoded value of metadata `key` (str, number, bool or list), or `default` if absent."""
    field = reader.get_field(key)
    return default if field is None else field.contents()


def require_metadata(reader: gguf.GGUFReader, key: str) -> Any:
    """The value of metadata `key`; ValueError naming the file when the key is missing."""
    value = metadata_value(reader, key)
    if value is None:
        raise ValueError(f"GGUF file {reader.data.filename} has no metadata key {key!r}")
    return value


def byte_level_pre_tokenizer(pre_type: str, path: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre == pre_type` on a byte-level vocabulary."""
    if pre_type in GPT2_PRE_TYPES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre_type in DIGITS_THEN_GPT2_PRE_TYPES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre_type in REGEX_PRE_TYPES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(REGEX_PRE_TYPES[pre_type]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    known = sorted(GPT2_PRE_TYPES | DIGITS_THEN_GPT2_PRE_TYPES | REGEX_PRE_TYPES.keys())
    raise ValueError(f"GGUF file {path}: unsupported tokenizer.ggml.pre {pre_type!r}; known: {known}")


def special_added_tokens(tokens: Sequence[str], token_types: Sequence[int]) -> list[AddedToken]:
    """Control tokens (e.g. `<|im_start|>`) as special added tokens, user-defined ones as plain added tokens.

    Added tokens are matched whole in the raw text before BPE, as llama.cpp does, so they never get split.
    """
    added = []
    for token, token_type in zip(tokens, token_types, strict=True):
        if token_type == TOKEN_TYPE_CONTROL:
            added.append(AddedToken(token, special=True, normalized=False))
        elif token_type == TOKEN_TYPE_USER_DEFINED:
            added.append(AddedToken(token, special=False, normalized=False))
    return added


def template_post_processor(
    tokens: Sequence[str], bos_id: int | None, eos_id: int | None, add_bos: bool, add_eos: bool
) -> processors.PostProcessor:
    """Post-processor adding BOS/EOS around each sequence as the file's add_bos/add_eos flags ask."""
    prefix = [tokens[bos_id]] if add_bos and bos_id is not None else []
    suffix = [tokens[eos_id]] if add_eos and eos_id is not None else []
    if not prefix and not suffix:
        return processors.ByteLevel(trim_offsets=False)
    single = " ".join([*prefix, "$A", *suffix])
    pair = " ".join([single, *prefix, "$B:1", *suffix])
    specials = {tokens[i]: i for i, used in ((bos_id, prefix), (eos_id, suffix)) if used}
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(specials.items()))


def build_byte_level_bpe(
    tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], pre_type: str, path: str
) -> Tokenizer:
    """A `tokenizers.Tokenizer` for a byte-level BPE vocabulary stored as llama.cpp does (GPT-2 alphabet)."""
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"GGUF file {path}: tokenizer.ggml.tokens has duplicate entries")
    merge_pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = byte_level_pre_tokenizer(pre_type, path)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens(special_added_tokens(tokens, token_types))
    return tokenizer


def token_or_none(tokens: Sequence[str], token_id: int | None) -> str | None:
    """The token string for `token_id`, or None when the id is absent."""
    return None if token_id is None else tokens[int(token_id)]


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """Build the `PreTrainedTokenizerFast` described by a GGUF file's `tokenizer.*` metadata."""
    return tokenizer_from_reader(open_gguf_reader(path))


def tokenizer_from_reader(reader: gguf.GGUFReader) -> PreTrainedTokenizerFast:
    """`load_gguf_tokenizer` for an already opened reader (so a checkpoint is parsed only once)."""
    path = str(reader.data.filename)
    model_type = require_metadata(reader, "tokenizer.ggml.model")
    if model_type != "gpt2":
        raise ValueError(
            f"GGUF file {path}: tokenizer.ggml.model {model_type!r} is not supported (only byte-level 'gpt2')"
        )
    tokens = list(require_metadata(reader, "tokenizer.ggml.tokens"))
    merges = list(require_metadata(reader, "tokenizer.ggml.merges"))
    token_types = list(metadata_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    pre_type = metadata_value(reader, "tokenizer.ggml.pre", "default")
    bos_id = metadata_value(reader, "tokenizer.ggml.bos_token_id")
    eos_id = metadata_value(reader, "tokenizer.ggml.eos_token_id")
    backend = build_byte_level_bpe(tokens, merges, token_types, pre_type, path)
    backend.post_processor = template_post_processor(
        tokens,
        bos_id,
        eos_id,
        add_bos=bool(metadata_value(reader, "tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(metadata_value(reader, "tokenizer.ggml.add_eos_token", False)),
    )
    architecture = metadata_value(reader, "general.architecture", "")
    context_length = metadata_value(reader, f"{architecture}.context_length")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token_or_none(tokens, bos_id),
        eos_token=token_or_none(tokens, eos_id),
        unk_token=token_or_none(tokens, metadata_value(reader, "tokenizer.ggml.unknown_token_id")),
        pad_token=token_or_none(tokens, metadata_value(reader, "tokenizer.ggml.padding_token_id")),
        chat_template=metadata_value(reader, "tokenizer.chat_template"),
        model_max_length=int(context_length) if context_length else int(1e30),
        clean_up_tokenization_spaces=False,
    )
