"""Trajectory data for coevo_jax: records, formats, chat rendering with action masks, preference pairs, batches.

Data flows top-down: trajectory file -> `read_trajectories` -> pair builders (eq. 6, eq. 8) ->
`tokenize_pairs` (action masks, over-long policy) -> `plan_batches` + `collate_dpo` (bucketed [2B, L]).

* `records`: `Trajectory` / `Message` / `Turn` / `TokenTrace`, lossless JSONL records and their writer.
* `record_reader`: the strict reader of those records (`read_trajectories`, `parse_record`; `skip_bad` with a
  `ReadReport`) and the field checks the other formats share.
* `json_files`: `.json` / `.jsonl` record files read strictly (UTF-8, `DataFormatError` naming the file,
  record and field) and written exactly.
* `stream`: `TrajectoryStream`, a trajectory file written an episode at a time that resumes after a crash.
* `formats`: ETO conversation files in and out, TRL preference files out, lossless pair JSONL.
* `converters`: real ETO in-context examples and InterCode-SQL GPT-4 episodes as trajectories.
* `chat_format`: Llama-2 (ETO/FastChat) and tokenizer chat-template rendering; token-level action masks.
* `chat_templates`: Jinja templates for Llama-2-chat and ChatML (Qwen) written from the published formats.
* `pairs`: eq. 6 `build_failure_pairs`, eq. 8 `build_target_pairs`, `build_eto_pairs`,
  `build_positive_agent_pairs`, `select_rft`; each builder returns a `PreferenceDataset` with its report.
* `reports`: `DatasetReport` (counts by pair type, hard negatives, rejected-reward histogram).
* `batching`: over-long policy (`FitReport`), bucketed fixed-shape SFT and DPO batches.
* `grpo_rows`: GRPO's rows and batches from the sampled episodes' recorded token ids (`sampled_sequence`),
  with an advantage per episode or per reply (GiGPO).
* `sources`: trajectories and pairs read by path, a record file or a TFDS split (`DIR[:SPLIT]`); the main
  job reads `env.experts_path` through it, so a run can clone a published run's experts.
* `tfds_builders` (import it explicitly; it loads tensorflow_datasets): array_record datasets of trajectories
  and pairs (pair splits with their build report), no TensorFlow; what `python -m coevo_jax.experiment.export`
  writes and `sources` reads.
"""

from coevo_jax.data.batching import (
    DEFAULT_BUCKETS,
    OVERFLOW_POLICIES,
    FitReport,
    TokenizedPair,
    bucket_for,
    collate_dpo,
    collate_sft,
    fit_to_length,
    iter_sft_batches,
    next_token_targets,
    plan_batches,
    power_of_two_buckets,
    tokenize_pairs,
    tokenize_sft_examples,
)
from coevo_jax.data.chat_format import (
    CHAT_FORMATS,
    ChatTemplateFormat,
    Llama2ChatFormat,
    RenderedConversation,
    TokenizedTrajectory,
    chat_format_for,
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
from coevo_jax.data.formats import (
    eto_conversation_record,
    read_eto_conversations,
    read_pairs_jsonl,
    trl_preference_record,
    with_eto_prompt,
    write_eto_conversations,
    write_pairs_jsonl,
    write_trl_preferences,
)
from coevo_jax.data.grpo_rows import SampledSequence, collate_grpo, sampled_sequence
from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.pair_pool import (
    DEFAULT_HARD_NEGATIVE_THRESHOLD,
    EXPERT_VS_FAILURE,
    EXPERT_VS_POSITIVE,
    EXPERT_VS_TARGET,
    FAILURE_AGENT_VS_FAILURE_AGENT,
    FAILURE_VS_FAILURE,
    TARGET_VS_TARGET,
    PreferenceDataset,
    PreferencePair,
    deduplicate,
)
from coevo_jax.data.pairs import (
    build_eto_pairs,
    build_failure_pairs,
    build_positive_agent_pairs,
    build_target_pairs,
    select_rft,
)
from coevo_jax.data.record_reader import ReadReport, parse_record, parse_records, read_trajectories
from coevo_jax.data.records import AGENTS, Message, TokenTrace, Trajectory, Turn, write_trajectories
from coevo_jax.data.reports import DatasetReport, reward_histogram
from coevo_jax.data.stream import TrajectoryStream

__all__ = [
    "AGENTS",
    "CHATML_TEMPLATE",
    "CHAT_FORMATS",
    "DEFAULT_BUCKETS",
    "DEFAULT_HARD_NEGATIVE_THRESHOLD",
    "EXPERT_VS_FAILURE",
    "EXPERT_VS_POSITIVE",
    "EXPERT_VS_TARGET",
    "FAILURE_AGENT_VS_FAILURE_AGENT",
    "FAILURE_VS_FAILURE",
    "LLAMA2_CHAT_TEMPLATE",
    "OVERFLOW_POLICIES",
    "TARGET_VS_TARGET",
    "ChatTemplateFormat",
    "DataFormatError",
    "DatasetReport",
    "FitReport",
    "Llama2ChatFormat",
    "Message",
    "PreferenceDataset",
    "PreferencePair",
    "ReadReport",
    "RenderedConversation",
    "SampledSequence",
    "TokenTrace",
    "TokenizedPair",
    "TokenizedTrajectory",
    "Trajectory",
    "TrajectoryStream",
    "Turn",
    "bucket_for",
    "build_eto_pairs",
    "build_failure_pairs",
    "build_positive_agent_pairs",
    "build_target_pairs",
    "chat_format_for",
    "collate_dpo",
    "collate_grpo",
    "collate_sft",
    "deduplicate",
    "describe_mask",
    "eto_conversation_record",
    "fit_to_length",
    "icl_examples_to_trajectories",
    "intercode_episode_to_trajectory",
    "iter_sft_batches",
    "next_token_targets",
    "parse_record",
    "parse_records",
    "plan_batches",
    "power_of_two_buckets",
    "read_eto_conversations",
    "read_icl_examples",
    "read_intercode_trajectories",
    "read_pairs_jsonl",
    "read_trajectories",
    "reward_histogram",
    "sampled_sequence",
    "select_rft",
    "tokenize_pairs",
    "tokenize_sft_examples",
    "tokenize_trajectory",
    "trl_preference_record",
    "with_eto_prompt",
    "write_eto_conversations",
    "write_pairs_jsonl",
    "write_trajectories",
    "write_trl_preferences",
]
