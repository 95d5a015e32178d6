"""Trajectory data for coevo_jax: records, chat rendering with action masks, preference pairs, batches.

* `records`: `Trajectory` / `Message`, the strict ETO conversation reader and writer (`DataFormatError`).
* `converters`: real ETO in-context examples and InterCode-SQL GPT-4 episodes as trajectories.
* `chat_format`: Llama-2 (ETO/FastChat) and tokenizer chat-template rendering; token-level action masks.
* `chat_templates`: Jinja templates for Llama-2-chat and ChatML (Qwen) written from the published formats.
* `pairs`: eq. 6 `build_failure_pairs`, eq. 8 `build_target_pairs`, `build_eto_pairs`, `select_rft`.
* `batching`: bucketed fixed-shape SFT and DPO batches (`input_ids`, `attention_mask`, `targets`, `loss_mask`).
* `tfds_builders` (import it explicitly; it loads tensorflow_datasets): array_record datasets, no TensorFlow.
"""

from coevo_jax.data.batching import (
    DEFAULT_BUCKETS,
    TokenizedPair,
    bucket_for,
    collate_dpo,
    collate_sft,
    iter_dpo_batches,
    iter_sft_batches,
    next_token_targets,
    plan_batches,
    power_of_two_buckets,
    tokenize_pairs,
    tokenize_sft_examples,
)
from coevo_jax.data.chat_format import (
    ChatTemplateFormat,
    Llama2ChatFormat,
    RenderedConversation,
    TokenizedTrajectory,
    describe_mask,
    tokenize_trajectory,
)
from coevo_jax.data.chat_templates import CHATML_TEMPLATE, LLAMA2_CHAT_TEMPLATE
from coevo_jax.data.converters import (
    icl_examples_to_trajectories,
    intercode_episode_to_trajectory,
    read_icl_examples,
    read_intercode_trajectories,
)
from coevo_jax.data.pairs import (
    PreferencePair,
    build_eto_pairs,
    build_failure_pairs,
    build_target_pairs,
    select_rft,
)
from coevo_jax.data.records import (
    DataFormatError,
    Message,
    Trajectory,
    parse_record,
    parse_records,
    read_trajectories,
    write_trajectories,
)

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_BUCKETS",
    "LLAMA2_CHAT_TEMPLATE",
    "ChatTemplateFormat",
    "DataFormatError",
    "Llama2ChatFormat",
    "Message",
    "PreferencePair",
    "RenderedConversation",
    "TokenizedPair",
    "TokenizedTrajectory",
    "Trajectory",
    "bucket_for",
    "build_eto_pairs",
    "build_failure_pairs",
    "build_target_pairs",
    "collate_dpo",
    "collate_sft",
    "describe_mask",
    "icl_examples_to_trajectories",
    "intercode_episode_to_trajectory",
    "iter_dpo_batches",
    "iter_sft_batches",
    "next_token_targets",
    "parse_record",
    "parse_records",
    "plan_batches",
    "power_of_two_buckets",
    "read_icl_examples",
    "read_intercode_trajectories",
    "read_trajectories",
    "select_rft",
    "tokenize_pairs",
    "tokenize_sft_examples",
    "tokenize_trajectory",
    "write_trajectories",
]
