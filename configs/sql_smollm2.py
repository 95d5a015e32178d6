"""SmolLM2-135M-Instruct (bundled GGUF, offline) on InterCode-SQL: SFT, ETO and co-evolving agents.

Sized for a CPU in a few hours: a subset of the 464 GPT-4 expert episodes, short SFT, 3 iterations on 100
train tasks (the paper runs 5 iterations on the full split; raise `iterations` and the task counts on a GPU).

    python -m coevo_jax.main --config=configs/sql_smollm2.py --workdir=workdir_sql
"""

from ml_collections import ConfigDict


def smollm2_config(env_name: str, env_kwargs: dict, *, expert_tasks: int, rows: int) -> ConfigDict:
    """The CPU-sized SmolLM2-135M-Instruct settings shared by the SQL and ScienceWorld configs."""
    config = ConfigDict()
    config.seed = 0
    config.methods = ("sft", "eto", "coevo")
    config.iterations = 3
    config.max_length = 2048
    config.min_bucket = 512
    config.checkpoint_every_steps = 50
    config.log_every_steps = 5
    config.show_progress = True

    config.env = ConfigDict()
    config.env.name = env_name
    config.env.kwargs = ConfigDict(env_kwargs)
    config.env.expert_tasks = expert_tasks
    config.env.explore_tasks = 100
    config.env.eval_tasks = 60

    config.model = ConfigDict()
    config.model.source = "smollm2"
    config.model.compute_dtype = "bfloat16"
    config.model.sample_dtype = "float32"
    config.model.remat = True
    config.model.lora_rank = 0  # > 0: LoRA adapters of this rank train; the base is frozen and shared
    config.model.lora_alpha = 16.0
    config.model.lora_dropout = 0.0
    config.model.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")

    config.sft = ConfigDict()
    config.sft.epochs = 2
    config.sft.learning_rate = 2e-5
    config.sft.batch_size = 16

    config.dpo = ConfigDict()
    config.dpo.epochs = 1
    config.dpo.pairs_per_batch = 8
    config.dpo.learning_rates = (1e-6,)
    config.dpo.betas = (0.1,)
    config.dpo.max_pairs_per_task = 2

    config.rollout = ConfigDict()
    config.rollout.temperature = 0.7
    config.rollout.max_new_tokens = 96
    config.rollout.cache_len = 2048
    config.rollout.rows = rows
    config.rollout.groups = 2
    config.rollout.merge_lora = True
    return config


def get_config() -> ConfigDict:
    # Large result sets are cut so that observations stay within the context.
    return smollm2_config("intercode_sql", {"max_observation_chars": 1000}, expert_tasks=240, rows=8)
