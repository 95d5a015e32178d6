"""SmolLM2-135M-Instruct (bundled GGUF, offline) on InterCode-SQL: SFT, RFT, ETO and co-evolution.

Sized for one seed in about 1 h 45 min and 10 GB on 2 CPU cores: full fine-tuning, SFT for two epochs on 96
GPT-4 expert episodes, one iteration exploring 32 train tasks, DPO phases of 6 updates of 4 pairs at lr 1e-6,
32 tasks per test split. The paper runs 5 iterations on the whole split; on a GPU raise `iterations`, the task
counts and the updates. Why each setting: studies/smollm2/README.md. Needs only the package (SQLite,
bundled data).

    python -m coevo_jax.main --config=configs/sql_smollm2.py --workdir=workdir_sql
"""

from ml_collections import ConfigDict

from coevo_jax.experiment.config import default_config


def smollm2_config(env_name: str, env_kwargs: dict, *, expert_tasks: int, rows: int) -> ConfigDict:
    """The CPU-sized SmolLM2-135M-Instruct settings shared by the SQL and ScienceWorld configs."""
    config = default_config()
    config.seed = 0
    config.methods = ("sft", "rft", "eto", "coevo")
    config.iterations = 1
    config.max_length = 2048
    config.min_bucket = 512
    # Steps of 256 tokens: SQL experts are 617 tokens on average, so power-of-two buckets would pad ~40 %.
    config.length_buckets = (512, 768, 1024, 1280, 1536, 2048)
    # Two micro-batches a step: one pass of 4 pairs ran out of memory (studies/smollm2/README.md).
    config.num_microbatches = 2
    config.checkpoint_every_steps = 50
    config.log_every_steps = 5
    config.show_progress = True

    config.env.name = env_name
    config.env.kwargs = ConfigDict(env_kwargs)
    config.env.expert_tasks = expert_tasks
    config.env.explore_tasks = 32
    config.env.eval_tasks = 32

    config.model.source = "smollm2"
    config.model.compute_dtype = "bfloat16"
    config.model.sample_dtype = "float32"
    config.model.remat = True
    config.model.lora_rank = 0  # > 0: LoRA adapters of this rank train; the base is frozen and shared
    config.model.lora_alpha = 16.0
    config.model.lora_dropout = 0.0
    config.model.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")

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


def get_config() -> ConfigDict:
    # Large result sets are cut so that observations stay within the context. The embedded SQLite backend by
    # default; `--config.env.kwargs.backend=mariadb` runs the statements on the project's MariaDB server
    # (`bash launch/mariadb.sh start` first), the MySQL-family engine InterCode scores on.
    return smollm2_config(
        "intercode_sql", {"max_observation_chars": 1000, "backend": "sqlite"}, expert_tasks=96, rows=8
    )
