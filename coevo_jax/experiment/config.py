"""`ExperimentConfig`: everything one run of the main job needs, as frozen dataclasses.

Built once from the ml_collections ConfigDict at the entry point (`from_mapping`); the library below never
reads a ConfigDict. Unknown fields are errors naming the group they were found in.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from ml_collections import ConfigDict, config_dict

from coevo_jax.coevolve.config import ABLATIONS, CoEvolveConfig
from coevo_jax.data.batching import power_of_two_buckets
from coevo_jax.experiment.task_subsets import ALL_WITH_EXPERTS, TASK_SUBSETS
from coevo_jax.train.mapping import dataclass_from_mapping

PAPER_METHODS = ("sft", "rft", "eto", "coevo", "coevo_positive", "coevo_frozen")  # Table 1 and ablations
# the authors' latest version (arXiv 2511.22254 v5): its pairing, its "w/o co-evolution", its sampling control
LATEST_METHODS = ("coevo_expert_pairs", "coevo_frozen_after_1", "best_of_4")
BEST_OF_N = 4  # episodes `best_of_4` samples per train task
COEVOLVE_METHODS = tuple(ABLATIONS)  # CoEvolve (arXiv 2604.15840): GRPO + rounds, and its ablations
# GRPO is ours (the paper's RL row is PPO); zero-shot evaluates the checkpoint untrained (CoEvolve's tables)
METHODS = ("zero_shot", *PAPER_METHODS, *LATEST_METHODS, "grpo", *COEVOLVE_METHODS)
METHOD_TITLES = {
    "zero_shot": "Zero-shot",
    "sft": "SFT",
    "rft": "RFT",
    "eto": "ETO",
    "coevo": "CoEvolving",
    "coevo_positive": "CoEvolving (positive agent)",
    "coevo_frozen": "CoEvolving (frozen failure agent)",
    "coevo_expert_pairs": "CoEvolving (expert–failure pairs)",
    "coevo_frozen_after_1": "CoEvolving (frozen after iteration 1)",
    "best_of_4": "Best-of-4",
    "grpo": "GRPO",
    "coevolve": "CoEvolve",
    "coevolve_forgetting": "CoEvolve (forgetting only)",
    "coevolve_boundary": "CoEvolve (boundary only)",
    "coevolve_rare": "CoEvolve (rare only)",
    "coevolve_no_verify": "CoEvolve (no verification)",
    "coevolve_unguided": "CoEvolve (unguided exploration)",
}


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The environment, its splits and how many tasks of each are used (None: all of them)."""

    name: str = "builtin"
    kwargs: tuple[tuple[str, Any], ...] = ()
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("test_seen", "test_unseen")
    # train tasks explored per iteration: the first N (an environment's own experts are its first train tasks',
    # and ETO and co-evolution pair an explored episode with its task's expert); None: all of them; 0
    # (`ALL_WITH_EXPERTS`): every train task that has an expert, the paper's and ETO's protocol
    explore_tasks: int | None = None
    eval_tasks: int | None = None  # tasks per evaluation split (the first N, or N spread: `eval_task_subset`)
    expert_tasks: int | None = None  # expert trajectories used for SFT (the first N)
    experts_path: str = ""  # a trajectory file or a TFDS split `DIR[:SPLIT]` instead of the env's own experts
    eval_task_subset: str = "first"  # how eval_tasks are picked: the 'first' N or N 'spread' over the split
    # False: the methods' policies are evaluated at the SFT policy and after the last iteration only (a sweep
    # point's final scores for fewer episodes); True: after every iteration as well (the reward curves)
    eval_every_iteration: bool = True

    def __post_init__(self):
        if self.explore_tasks is not None and self.explore_tasks < 0:
            raise ValueError(
                f"env.explore_tasks {self.explore_tasks}: a count of first train tasks, None for all, or "
                f"{ALL_WITH_EXPERTS} for every train task that has an expert"
            )
        if self.eval_task_subset not in TASK_SUBSETS:
            raise ValueError(f"env.eval_task_subset {self.eval_task_subset!r}: one of {TASK_SUBSETS}")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where the policy comes from: 'scratch' (random init, tokenizer trained on the experts) or a
    checkpoint ('smollm2' for the bundled GGUF, or a local HF directory / .gguf path), and how it trains:
    every weight (`lora_rank` 0) or LoRA adapters on one frozen base shared by both agents (`lora_rank` > 0;
    see `coevo_jax.models.ModelConfig`)."""

    source: str = "scratch"
    vocab_size: int = 1024  # scratch: size of the trained tokenizer
    hidden_size: int = 256
    intermediate_size: int = 688
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 32
    compute_dtype: str = "bfloat16"  # training
    param_dtype: str = "float32"
    sample_dtype: str = "float32"  # rollouts (float32 decodes faster on CPUs)
    remat: bool = False
    unroll_layers: bool = False  # train steps unroll the layer scan (GPUs, no remat; `ModelConfig`)
    right_padded: bool = True  # batches are right-padded (checked): cuDNN attention without fallback
    attention: str = "auto"  # full-sequence passes: 'auto' (cuDNN's fused kernel on GPUs), 'blocked', 'cudnn'
    token_shift: int = 0  # scratch: previous tokens mixed into each input (`coevo_jax.models.token_shift`)
    lora_rank: int = 0  # 0: full fine-tuning
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Behavioural cloning (eq. 3/5): ETO's recipe by default (lr 2e-5 cosine, 3 epochs, 3% warmup)."""

    epochs: int = 3
    learning_rate: float = 2e-5
    warmup_ratio: float = 0.03
    batch_size: int = 16
    rft_epochs: int | None = None  # RFT's per-iteration fine-tuning of the current policy (None: `epochs`)


@dataclasses.dataclass(frozen=True)
class DPOConfig:
    """DPO phases (ETO, eq. 7, eq. 9): per-iteration lr and beta (the last value repeats)."""

    epochs: int = 3
    pairs_per_batch: int = 8
    learning_rates: tuple[float, ...] = (1e-6,)
    betas: tuple[float, ...] = (0.1,)
    warmup_steps: int = 0
    max_pairs_per_task: int | None = None
    updates_per_phase: int | None = None  # fixed optimizer updates per phase (pairs cycled) instead of epochs
    include_within_agent: bool = False  # D_fail also pairs failures within each agent (not in eq. 6)
    # episodes that ran out of context also make pairs, as failures scored at their last complete turn (as
    # one that ran out of steps is); False leaves them out, like episodes an environment error ended
    pair_context_limited: bool = False

    def learning_rate(self, iteration: int) -> float:
        return self.learning_rates[min(iteration, len(self.learning_rates)) - 1]

    def beta(self, iteration: int) -> float:
        return self.betas[min(iteration, len(self.betas)) - 1]


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """GRPO (`grpo` in `methods`), from the SFT target policy; defaults are CoEvolve's Table 9 (AdamW lr 1e-6
    constant, K = 8 samples per task, 32 tasks per step, clip 0.2 / 0.28, KL 1e-3 to the SFT policy, rollout
    temperature 0.9; evaluation stays greedy).

    One GRPO step samples K episodes of each of `tasks_per_step` train tasks (a fresh seeded draw without
    replacement per step) with the current policy at `temperature` (no top-p), computes group-relative
    advantages per task (`advantage_scale`), and trains on the episodes' own tokens in length-bucketed
    batches of `batch_size` episodes, `updates_per_batch` (mu) optimizer updates per batch. An iteration is
    `steps_per_iteration` steps followed by the evaluation (CoEvolve regenerates its data every 10 steps).
    The optimizer state carries over from step to step and iteration to iteration.
    """

    learning_rate: float = 1e-6
    warmup_steps: int = 0  # optimizer updates
    samples_per_task: int = 8  # K
    tasks_per_step: int = 32
    steps_per_iteration: int = 10
    # Episodes per optimizer update (32 tasks x 8 samples: one update per length bucket).
    batch_size: int = 256
    updates_per_batch: int = 1  # mu
    clip_low: float = 0.2
    clip_high: float = 0.28
    beta: float = 1e-3  # KL to the SFT policy (k3); 0 skips the reference pass
    temperature: float = 0.9
    aggregation: str = "token_mean"  # | "sequence_mean" | "sum_norm" (Dr. GRPO)
    advantage_scale: str = "group"  # | "none" (Dr. GRPO: r - mean)
    # drop tasks with no advantage on any token (equal rewards; with GiGPO, no step signal either)
    drop_equal_groups: bool = False
    # "episode": every token of an episode gets its group-relative advantage; "gigpo" (arXiv 2505.10978): each
    # reply's tokens also get `step_weight` (omega) x its step advantage, the discounted return (`gamma`) from
    # that reply against the other replies of the task's episodes written in the same environment state
    advantage: str = "episode"
    step_weight: float = 1.0
    gamma: float = 0.95
    # "pairs": a group whose episodes all failed with one reward also trains, in the same step, by eq. 9's
    # failure-pair term on its failures ranked by the environment's graded score (`experiment.dead_groups`),
    # at most `dead_group_max_pairs` pairs a group, DPO beta `dead_group_beta`
    dead_groups: str = "none"
    dead_group_max_pairs: int = 4
    dead_group_beta: float = 0.1

    def __post_init__(self):
        if self.samples_per_task < 2:
            raise ValueError(
                f"grpo.samples_per_task must be >= 2 (group-relative), got {self.samples_per_task}"
            )
        if min(self.tasks_per_step, self.steps_per_iteration, self.batch_size, self.updates_per_batch) < 1:
            raise ValueError(f"grpo: tasks, steps, batch size and updates must be >= 1: {self}")
        if self.aggregation not in ("token_mean", "sequence_mean", "sum_norm"):
            raise ValueError(f"grpo.aggregation {self.aggregation!r}: token_mean, sequence_mean or sum_norm")
        if self.advantage_scale not in ("group", "none"):
            raise ValueError(f"grpo.advantage_scale {self.advantage_scale!r}: group or none")
        if self.temperature <= 0 or self.beta < 0:
            raise ValueError(f"grpo: temperature must be > 0 and beta >= 0: {self}")
        if self.advantage not in ("episode", "gigpo"):
            raise ValueError(f"grpo.advantage {self.advantage!r}: episode or gigpo")
        if self.dead_groups not in ("none", "pairs"):
            raise ValueError(f"grpo.dead_groups {self.dead_groups!r}: none or pairs")
        if self.dead_group_max_pairs < 1 or self.dead_group_beta <= 0:
            raise ValueError(f"grpo: dead_group_max_pairs must be >= 1 and dead_group_beta > 0: {self}")
        if not 0.0 <= self.gamma <= 1.0 or self.step_weight < 0:
            raise ValueError(f"grpo: gamma must be in [0, 1] and step_weight >= 0: {self}")


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Sampling for exploration (evaluation is always greedy) and the rollout loop's shape."""

    temperature: float = 1.0
    top_p: float = 1.0
    samples_per_task: int = 1
    max_new_tokens: int = 128
    cache_len: int = 2048
    rows: int = 8  # KV-cache rows per group
    groups: int = 2  # groups alternate between device and environments
    env_workers: int = 4
    stop_strings: tuple[str, ...] = ("Observation:",)
    merge_lora: bool = True  # LoRA: sample with the adapters merged into the base (else applied per token)


# Fields (dotted names) that change how a run executes, not what it computes, so a resumed run may change
# them, e.g. to fit a step into memory or to decode more rows at once: micro-batches accumulate to the same
# gradient up to float rounding, and so does a backward pass with kept logits (`keep_logits`); the sampler's
# rows and groups batch the same episodes differently (each episode samples with keys of its own task, sample
# and turn, and rollouts return in task and sample order; tests/test_rollout.py plays the same episodes on
# other rows, greedy and sampled).
EXECUTION_FIELDS = (
    "num_microbatches",
    "keep_logits",
    "checkpoint_every_steps",
    "log_every_steps",
    "show_progress",
    "rollout.rows",
    "rollout.groups",
    "warn_failure_pairs_below",
    "concurrent_agents",
)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One run: which methods, for how many iterations, on which environment and policy."""

    env: EnvConfig = EnvConfig()
    model: ModelSpec = ModelSpec()
    sft: SFTConfig = SFTConfig()
    dpo: DPOConfig = DPOConfig()
    rollout: RolloutSpec = RolloutSpec()
    grpo: GRPOConfig = GRPOConfig()
    coevolve: CoEvolveConfig = CoEvolveConfig()  # the CoEvolve methods' rounds (each method's `for_method`)
    methods: tuple[str, ...] = ("sft", "eto", "coevo")
    iterations: int = 3
    seed: int = 0
    max_length: int = 4096
    min_bucket: int = 128
    length_buckets: tuple[int, ...] = ()  # training batch lengths; () = powers of two, min_bucket..max_length
    num_microbatches: int = 1
    sft_per_token: bool = False  # eq. 9's SFT term as written (sequence sum); True divides it by its tokens
    # The backward pass keeps the forward's [tokens, vocabulary] float32 logits instead of computing them
    # again (one product of the unembedding fewer per step): None up to
    # chunked_logprobs.KEEP_LOGITS_MAX_BYTES (512 MiB), True at any size (an accelerator with memory to spare),
    # False never.
    keep_logits: bool | None = None
    checkpoint_every_steps: int = 50  # mid-phase TrainState checkpoints (resume inside a phase)
    mesh_axes: tuple[tuple[str, int], ...] = (("data", -1), ("fsdp", 1), ("tensor", 1))
    log_every_steps: int = 10
    show_progress: bool = True
    # ETO and RFT explore each train task twice as often, so that they play as many episodes per iteration
    # as co-evolution's two agents together (an equal exploration budget per method).
    match_exploration: bool = False
    # The report and the end of the job's log warn when the failure agent trained on fewer D_fail (eq. 6)
    # pairs than this in an iteration: the co-evolution then had little to learn from (`reporting.mechanism`).
    warn_failure_pairs_below: int = 30
    # The two agents' independent stages (base SFT, an iteration's explorations, co-evolution's two phases)
    # run side by side, each computing what it computes alone (`experiment.agent_pairs`); None: on for a
    # single-process CPU run on one device.
    concurrent_agents: bool | None = None

    def __post_init__(self):
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"methods {list(self.methods)}: each must be one of {METHODS}")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.warn_failure_pairs_below < 0:
            raise ValueError(f"warn_failure_pairs_below must be >= 0, got {self.warn_failure_pairs_below}")
        samples = self.rollout.samples_per_task
        if "best_of_4" in self.methods and not (0 < samples <= BEST_OF_N and BEST_OF_N % samples == 0):
            raise ValueError(
                f"best_of_4 samples {BEST_OF_N} episodes per task: rollout.samples_per_task ({samples}) "
                f"must divide {BEST_OF_N}"
            )
        if any(not 0 < b <= self.max_length for b in self.length_buckets):
            raise ValueError(
                f"length_buckets {self.length_buckets}: each must be in 1..max_length ({self.max_length})"
            )

    def buckets(self) -> tuple[int, ...]:
        """The sequence lengths training batches are padded to (max_length always among them)."""
        if not self.length_buckets:
            return power_of_two_buckets(self.max_length, self.min_bucket)
        return tuple(sorted({*self.length_buckets, self.max_length}))

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ExperimentConfig:
        """From a ConfigDict/dict whose groups (env, model, sft, dpo, rollout, grpo, coevolve) are mappings
        too."""
        config = _plain(config)
        groups = {
            "env": EnvConfig,
            "model": ModelSpec,
            "sft": SFTConfig,
            "dpo": DPOConfig,
            "rollout": RolloutSpec,
            "grpo": GRPOConfig,
            "coevolve": CoEvolveConfig,
        }
        fields = dict(config)
        for name, group_cls in groups.items():
            if name in fields:
                fields[name] = dataclass_from_mapping(group_cls, _tuples(fields[name]), name)
        return dataclass_from_mapping(cls, _tuples(fields), "experiment")

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (lists for tuples); `from_mapping(to_json())` gives an equal config."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def _plain(value):
    """ConfigDict / FrozenConfigDict -> nested dicts and tuples."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def _tuples(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Mapping-valued `kwargs` become sorted item tuples; lists become tuples (frozen, hashable)."""
    out = {}
    for key, value in fields.items():
        if key == "kwargs" and isinstance(value, Mapping):  # unset placeholders: the factory's default
            value = tuple(sorted((k, v) for k, v in value.items() if v is not None))
        elif key == "kwargs":
            value = tuple(tuple(item) for item in value)
        elif key == "length_buckets":
            value = tuple(int(v) for v in value)
        elif key == "mesh_axes":
            value = tuple(tuple(pair) for pair in value)
        out[key] = value
    return out


def default_config() -> ConfigDict:
    """Every field of `ExperimentConfig` at its default, as the ConfigDict a config file starts from and edits.

    A locked config accepts command-line overrides only of fields it has (`--config.dpo.warmup_steps=5`), so
    starting from all of them makes every field overridable, whatever a file sets. A field whose default is
    None is a placeholder of its type, so it can be overridden too."""
    return _config_dict(ExperimentConfig())


def _config_dict(instance) -> ConfigDict:
    hints = typing.get_type_hints(type(instance))
    out = ConfigDict()
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value):
            out[field.name] = _config_dict(value)
        elif field.name == "kwargs":
            out[field.name] = ConfigDict(dict(value))
        elif value is None:
            out[field.name] = config_dict.placeholder(_non_none(hints[field.name]))
        else:
            out[field.name] = value
    return out


def _non_none(hint):
    """`int` of `int | None`."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return typing.get_origin(kind) or kind
    return hint
