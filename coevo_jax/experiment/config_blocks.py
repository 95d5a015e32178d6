"""Named blocks that the config files compose: an environment, a policy, a training recipe.

A config file starts from `config.default_config()` and applies blocks, each setting one group of fields
(and only those) to the values its runs were tuned with; what a file changes after a block is its own
choice. Variants of one file go through its `:arg` string (`--config=configs/F.py:ARG`).

`environment(config, name, **values)` makes every constructor argument of the environment's factory a typed
field of `env.kwargs` (derived from its signature), so `--config.env.kwargs.ARG=VALUE` reaches any of them;
the arguments a block leaves unset are placeholders that the factory's own default fills.
"""

from __future__ import annotations

import inspect
import pathlib
import types
import typing
from typing import Any

from ml_collections import ConfigDict, config_dict

from coevo_jax import envs

_PLAIN = (bool, int, float, str)


def _hints(factory) -> dict[str, Any]:
    """The factory's resolved argument annotations (a class's are its `__init__`'s)."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        return typing.get_type_hints(target)
    except (NameError, TypeError):
        return {}


def _field_type(parameter: inspect.Parameter, hint: Any) -> type | None:
    """The plain type (bool, int, float, str) a constructor argument takes on the command line, or None for
    one that takes no plain value (an object, *args, **kwargs). A path is a str."""
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
        return None
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    kinds = [kind for kind in (typing.get_args(hint) if union else (hint,)) if kind is not type(None)]
    for plain in _PLAIN:
        if plain in kinds:
            return plain
    if any(isinstance(kind, type) and issubclass(kind, pathlib.PurePath) for kind in kinds):
        return str
    default = parameter.default
    return type(default) if isinstance(default, _PLAIN) else None


def environment_fields(name: str, values: dict[str, Any] | None = None) -> ConfigDict:
    """Every plain constructor argument of environment `name` as a field: `values`' where given, else a
    placeholder of its type (None: the factory's default). An argument `values` names that the factory does
    not take is refused, naming the environment."""
    values = dict(values or {})
    envs.check_kwargs(name, values)
    fields = ConfigDict()
    factory = envs.factory(name)
    hints = _hints(factory)
    for parameter in inspect.signature(factory).parameters.values():
        kind = _field_type(parameter, hints.get(parameter.name, inspect.Parameter.empty))
        if parameter.name in values:
            fields[parameter.name] = values.pop(parameter.name)
        elif kind is not None:
            fields[parameter.name] = config_dict.placeholder(kind)
    for key, value in values.items():  # taken by the factory's **kwargs
        fields[key] = value
    return fields


def environment(config: ConfigDict, name: str, **values) -> ConfigDict:
    """`env.name` and `env.kwargs` (every constructor argument of `name`, `values` set)."""
    config.env.name = name
    config.env.kwargs = environment_fields(name, values)
    return config


def builtin_environment(config: ConfigDict, **values) -> ConfigDict:
    """The built-in environment as the quickstart and the built-in studies run it: 1,500 train tasks (each
    with an expert), 200 per test split, 100 per dev split, and the sequence lengths its episodes need."""
    settings = {
        "seed": 0,
        "num_train": 1500,
        "num_test_seen": 200,
        "num_test_unseen": 200,
        "num_dev": 100,
        "num_dev_unseen": 100,
        # expert length + 5 steps (the default is 2x + 5): 97 % of the SFT policy's successes on train tasks
        # took at most 5 steps more than the expert, and failures, which play to the budget, cost a third
        # fewer steps
        "budget_per_expert_step": 1,
        "budget_extra_steps": 5,
    }
    environment(config, "builtin", **{**settings, **values})
    config.env.eval_splits = ("test_seen", "test_unseen")
    config.max_length = 1024
    config.length_buckets = (512, 768)  # experts are 280-790 tokens: less padding than 512/1024 alone
    config.rollout.max_new_tokens = 48
    config.rollout.cache_len = 1280  # the longest episode so far: 970 tokens
    return config


def scratch_policy(config: ConfigDict) -> ConfigDict:
    """The tiny Llama-shaped policy trained from scratch (2 layers, hidden 128, a 4-token shift on its input
    embeddings) with a tokenizer trained offline on the experts' text."""
    config.model.source = "scratch"
    config.model.vocab_size = 1024
    config.model.hidden_size = 128
    config.model.intermediate_size = 384
    config.model.num_layers = 2
    config.model.num_heads = 4
    config.model.num_kv_heads = 2
    config.model.head_dim = 32
    config.model.compute_dtype = "float32"  # on this scale as fast as bf16 on a CPU, and it learned better
    config.model.sample_dtype = "float32"
    config.model.token_shift = 4  # each input also sees the 4 tokens before it (models/token_shift.py)
    return config


def scratch_builtin_run(config: ConfigDict) -> ConfigDict:
    """The built-in environment, the scratch policy and its recipe, seed 0, 3 iterations, a checkpoint every
    200 updates: what the quickstart and the built-in studies share."""
    config.seed = 0
    config.iterations = 3
    config.checkpoint_every_steps = 200
    config.log_every_steps = 10
    config.show_progress = True
    builtin_environment(config)
    scratch_policy(config)
    return scratch_recipe(config)


def scratch_recipe(config: ConfigDict) -> ConfigDict:
    """The scratch policy's training, chosen on the dev splits (studies/quickstart/README.md): SFT, the
    paper's preference phases (3 epochs over each phase's own pairs), exploration and GRPO."""
    config.sft.epochs = 10  # 4 left it short of its plateau: dev success 55 % -> 77 % at 10 (seed 0)
    config.sft.learning_rate = 6e-3
    config.sft.batch_size = 8

    config.dpo.epochs = 3  # the paper's: every preference phase passes 3 times over its own pairs
    config.dpo.pairs_per_batch = 8
    config.dpo.learning_rates = (3e-5,)
    config.dpo.betas = (0.1,)
    config.dpo.include_within_agent = False  # D_fail as eq. 6 (True: also failures within each agent)

    config.rollout.temperature = 1.0
    config.rollout.samples_per_task = 1  # episodes per task and agent in an exploration
    config.rollout.rows = 8
    config.rollout.groups = 2

    config.grpo.learning_rate = 3e-4
    config.grpo.samples_per_task = 8
    config.grpo.tasks_per_step = 16
    config.grpo.steps_per_iteration = 10
    config.grpo.batch_size = 64
    config.grpo.updates_per_batch = 1
    config.grpo.beta = 1e-3
    config.grpo.temperature = 0.9
    return config


def lora_settings(config: ConfigDict) -> ConfigDict:
    """Full fine-tuning, with the adapters `--config.model.lora_rank=R` switches on: alpha 16, no dropout, on
    every projection."""
    config.model.lora_rank = 0  # > 0: LoRA adapters of this rank train; the base is frozen and shared
    config.model.lora_alpha = 16.0
    config.model.lora_dropout = 0.0
    config.model.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")
    return config


def smollm2_policy(config: ConfigDict) -> ConfigDict:
    """SmolLM2-135M-Instruct from its bundled GGUF (offline), fully fine-tuned in bf16 with remat; LoRA
    (`model.lora_rank` > 0) trains adapters on every projection instead."""
    config.model.source = "smollm2"
    config.model.compute_dtype = "bfloat16"
    config.model.sample_dtype = "float32"
    config.model.remat = True
    lora_settings(config)
    return config


def smollm2_recipe(config: ConfigDict, *, rows: int) -> ConfigDict:
    """SmolLM2's CPU-sized training (studies/smollm2/README.md): 2-2,048-token batches in two micro-batches,
    two SFT epochs, DPO phases of 6 updates of 4 pairs at lr 1e-6, exploration at temperature 0.7 on `rows`
    sampler rows."""
    config.max_length = 2048
    config.min_bucket = 512
    config.length_buckets = (512, 768, 1024, 1280, 1536, 2048)
    config.num_microbatches = 2

    config.sft.epochs = 2
    config.sft.learning_rate = 1e-4
    config.sft.batch_size = 4
    config.sft.rft_epochs = 1

    config.dpo.epochs = 1
    config.dpo.updates_per_phase = 6
    config.dpo.pairs_per_batch = 4
    config.dpo.learning_rates = (1e-6,)
    config.dpo.betas = (0.1,)
    config.dpo.max_pairs_per_task = 2

    config.rollout.temperature = 0.7
    config.rollout.max_new_tokens = 96
    config.rollout.cache_len = 2048
    config.rollout.rows = rows
    config.rollout.groups = 2
    config.rollout.merge_lora = True
    return config


def smollm2_run(config: ConfigDict, *, rows: int) -> ConfigDict:
    """SmolLM2 and its CPU recipe on `rows` sampler rows, seed 0, one iteration, a checkpoint every 50
    updates: what the SmolLM2 configs share."""
    config.seed = 0
    config.iterations = 1
    config.checkpoint_every_steps = 50
    config.log_every_steps = 5
    config.show_progress = True
    smollm2_policy(config)
    return smollm2_recipe(config, rows=rows)


def paper_recipe(config: ConfigDict) -> ConfigDict:
    """ETO's recipe at the paper's scale, for GPUs: SFT 3 epochs at lr 2e-5 (cosine, 3 % warmup, batch 64),
    DPO beta 0.1 at lr 1e-6 with 32 pairs a batch and 3 epochs a phase, 4,096-token sequences, FSDP over every
    device, bf16 compute on float32 parameters (LoRA: `model.lora_rank` > 0)."""
    config.max_length = 4096
    config.min_bucket = 512
    config.mesh_axes = (("data", 1), ("fsdp", -1), ("tensor", 1))
    config.num_microbatches = 8  # one row of 4096 tokens per device on 8 GPUs (docs/memory_plan.md)

    config.model.compute_dtype = "bfloat16"
    config.model.param_dtype = "float32"
    config.model.sample_dtype = "bfloat16"
    config.model.remat = True
    lora_settings(config)

    config.sft.epochs = 3
    config.sft.learning_rate = 2e-5
    config.sft.warmup_ratio = 0.03
    config.sft.batch_size = 64

    config.dpo.epochs = 3
    config.dpo.pairs_per_batch = 32
    config.dpo.learning_rates = (1e-6,)
    config.dpo.betas = (0.1,)

    config.rollout.temperature = 1.0
    config.rollout.max_new_tokens = 256
    config.rollout.cache_len = 4096
    config.rollout.rows = 32
    config.rollout.groups = 2
    config.rollout.env_workers = 16
    config.rollout.merge_lora = True
    return config


def bfcl_environment(config: ConfigDict) -> ConfigDict:
    """BFCL multi_turn_base (compact docs, observations cut at 1,000 characters), its train / test splits,
    16 test tasks, and the 3,072-token sequences its experts need (1,833 tokens, p90 2,317)."""
    environment(config, "bfcl", category="multi_turn_base", docs="compact", max_observation_chars=1000)
    config.env.train_split = "train"
    config.env.eval_splits = ("test",)
    config.env.eval_tasks = 16
    config.max_length = 3072
    config.length_buckets = (512, 768, 1024, 1280, 1536, 2048, 2560)
    config.rollout.cache_len = 3072
    config.rollout.groups = 1  # 16 rows in one batch: a decode step reads the weights once for all of them
    return config


def smollm2_grpo(config: ConfigDict) -> ConfigDict:
    """SmolLM2's CPU-sized GRPO: 2 steps an iteration of 4 tasks x K = 4 episodes at temperature 0.9, groups
    whose episodes all score alike dropped; CoEvolve's round after every step."""
    config.grpo.learning_rate = 1e-5
    config.grpo.samples_per_task = 4
    config.grpo.tasks_per_step = 4
    config.grpo.steps_per_iteration = 2
    config.grpo.batch_size = 8
    config.grpo.updates_per_batch = 1
    config.grpo.beta = 1e-3
    config.grpo.temperature = 0.9
    config.grpo.drop_equal_groups = True
    config.coevolve.every_steps = 1  # a round after the first step, so the second can draw pool tasks
    return config


def bfcl_smollm2_run(config: ConfigDict) -> ConfigDict:
    """SmolLM2 on BFCL as both BFCL configs run it: SFT on 32 experts, 32 explored tasks, float32 training
    (1.4x bf16 on AVX2 CPUs, studies/smollm2/README.md#bfcl-1), SmolLM2's GRPO."""
    smollm2_run(config, rows=16)
    bfcl_environment(config)
    smollm2_grpo(config)
    config.env.expert_tasks = 32
    config.env.explore_tasks = 32
    config.model.compute_dtype = "float32"
    return config


# The credit studies' GRPO variants: the `grpo` fields each sets.
CREDIT_VARIANTS = {
    "episode": dict(advantage="episode", dead_groups="none"),
    "gigpo": dict(advantage="gigpo", dead_groups="none"),
    "pairs": dict(advantage="episode", dead_groups="pairs"),
    "both": dict(advantage="gigpo", dead_groups="pairs"),
}


def credit_variant(config: ConfigDict, variant: str, file: str) -> ConfigDict:
    """The `grpo` fields of one of CREDIT_VARIANTS; `file` names the config in the error."""
    if variant not in CREDIT_VARIANTS:
        raise ValueError(f"{file}: variant {variant!r}, one of {', '.join(CREDIT_VARIANTS)}")
    for field, value in CREDIT_VARIANTS[variant].items():
        config.grpo[field] = value
    return config


# The paper's environments: the name, the constructor arguments its runs set and the paper's iterations.
PAPER_ENVIRONMENTS = {
    "webshop": ("webshop", {}, 3),
    "sciworld": ("sciworld", {"java_max_heap": "1g"}, 3),
    "sql": ("intercode_sql", {"backend": "sqlite"}, 5),
}


def paper_run(config: ConfigDict, env: str, model_source: str) -> ConfigDict:
    """The paper's setting: SFT, RFT, ETO and co-evolution on one of its environments with ETO's recipe and
    the checkpoint at `model_source`."""
    config.seed = 0
    config.methods = ("sft", "rft", "eto", "coevo")
    config.checkpoint_every_steps = 100
    config.log_every_steps = 10
    config.show_progress = True
    paper_environment(config, env)
    paper_recipe(config)
    config.model.source = model_source
    return config


def paper_environment(config: ConfigDict, env: str) -> ConfigDict:
    """One of the paper's environments (a key of PAPER_ENVIRONMENTS) and its number of iterations."""
    if env not in PAPER_ENVIRONMENTS:
        raise ValueError(f"unknown environment {env!r}; use one of {sorted(PAPER_ENVIRONMENTS)}")
    name, values, iterations = PAPER_ENVIRONMENTS[env]
    environment(config, name, **values)
    config.env.experts_path = ""
    config.iterations = iterations
    return config
