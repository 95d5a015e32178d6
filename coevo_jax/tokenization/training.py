"""Train a small byte-level BPE chat tokenizer offline on an environment's own text.

The CPU quickstart runs a tiny model whose vocabulary is trained here rather than borrowed from a 49k-token
checkpoint: with a vocabulary of ~1-2k tokens the embedding and unembedding stay small, and BPE spends its
merges on the words the environment actually uses ("Thought:", "Action:", "Observation:", object names).

The result is a `PreTrainedTokenizerFast` that behaves like SmolLM2's, so everything downstream
(`coevo_jax.data.chat_format`, batching, sampling) treats it the same way:
* byte-level BPE over the full 256-symbol GPT-2 byte alphabet, so any string round-trips, even characters
  never seen in training; no unknown token exists or is needed;
* digits split one by one before the GPT-2 regex (SmolLM2's and llama.cpp's "smollm" pre-tokenizer), so
  numbers never eat vocabulary;
* ChatML special tokens with fixed ids: `<|endoftext|>` = 0 (padding), `<|im_start|>` = 1,
  `<|im_end|>` = 2 (end of turn, the eos); no bos;
* a ChatML chat template with no injected default system prompt: `<|im_start|>{role}\\n{content}<|im_end|>\\n`
  per message, `<|im_start|>assistant\\n` as the generation prompt.

Training text is split at the special tokens before BPE sees it (the `tokenizers` trainer does not do this
itself and would otherwise spend merges on pieces like `)]<|`), which mirrors how the encoder treats text
between added tokens. Training is deterministic: the same texts and settings give the identical vocabulary
and merges, whatever the thread count or process (the trainer breaks count ties by pair id).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from coevo_jax.data.records import Message, Trajectory

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)  # ids 0, 1, 2, in this order
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256  # the specials plus the byte alphabet, before any merge

CHATML_NO_SYSTEM_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SPECIAL_SPLIT = re.compile("|".join(re.escape(token) for token in SPECIAL_TOKENS))


def render_chatml(messages: Sequence[Message]) -> str:
    """The text `CHATML_NO_SYSTEM_TEMPLATE` renders for `messages` (no generation prompt), without Jinja."""
    return "".join(f"{IM_START}{m.role}\n{m.content}{IM_END}\n" for m in messages)


def chat_corpus(trajectories: Iterable[Trajectory]) -> Iterator[str]:
    """Each trajectory's whole conversation as ChatML text: the tokenizer's training corpus."""
    for trajectory in trajectories:
        yield render_chatml(trajectory.messages)


def split_at_special_tokens(texts: Iterable[str]) -> Iterator[str]:
    """The non-empty pieces of each text between special tokens: what BPE sees at encoding time."""
    for text in texts:
        yield from (piece for piece in _SPECIAL_SPLIT.split(text) if piece)


def byte_level_bpe() -> Tokenizer:
    """An untrained byte-level BPE pipeline: single digits, then the GPT-2 regex and byte mapping."""
    tokenizer = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)  # offsets keep their leading space
    return tokenizer


def bpe_trainer(vocab_size: int, min_frequency: int) -> trainers.BpeTrainer:
    """A trainer that puts the special tokens at ids 0, 1, 2 and always keeps all 256 byte symbols."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size {vocab_size} is below {MIN_VOCAB_SIZE} (3 special tokens + 256 bytes)")
    return trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )


def wrap_chat_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """The trained pipeline as a transformers tokenizer with ChatML special tokens and template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHATML_NO_SYSTEM_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def train_chat_tokenizer(
    texts: Iterable[str], vocab_size: int = 1024, *, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE chat tokenizer of at most `vocab_size` tokens (special tokens included).

    `texts` should be ChatML-rendered conversations (see `chat_corpus`) so that the template's glue gets
    merged like the content. Fewer than `vocab_size` tokens result when the corpus runs out of pairs seen at
    least `min_frequency` times.
    """
    backend = byte_level_bpe()
    backend.train_from_iterator(split_at_special_tokens(texts), bpe_trainer(vocab_size, min_frequency))
    ids = [backend.token_to_id(token) for token in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens {SPECIAL_TOKENS} got ids {ids}, expected 0, 1, 2")
    return wrap_chat_tokenizer(backend)


def train_tokenizer_for_trajectories(
    trajectories: Iterable[Trajectory], vocab_size: int = 1024, *, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """`train_chat_tokenizer` on the trajectories' conversations rendered as ChatML."""
    return train_chat_tokenizer(chat_corpus(trajectories), vocab_size, min_frequency=min_frequency)
