"""SmolLM2-135M-Instruct (bundled GGUF, offline) on InterCode-SQL: SFT, RFT, ETO and co-evolving agents.

Scaled down for 2 CPU cores (a SmolLM2 train step is ~22 s for 4 sequences there): 96 of the GPT-4 expert
episodes for two SFT epochs at lr 1e-4 (on 16 held-out train tasks this SFT policy succeeds on 8 and submits
within 2-7 steps; after one epoch at 2e-5 it never submitted: `bench/lora_vs_full_sft.py`, bench/README.md),
one iteration exploring 32 train tasks, 6 DPO updates of 4 pairs per phase at lr 1e-6 (chosen on 16 held-out
train tasks by `bench/dpo_lr_probe.py`: ETO's phase at 1e-6 kept 7 of the SFT policy's 8 successes, at 5e-6 3,
and at 2e-5 the test episodes stopped submitting; bench/README.md), 32 tasks per test split. Full fine-tuning: on 2 cores it lowered the held-out experts' NLL 1.7x as much per CPU hour as
LoRA r = 16. The paper runs 5 iterations on the whole split; on a GPU raise `iterations`, the task counts and
the updates.

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
    # Two micro-batches a step: a DPO step of 4 pairs (8 sequences of up to 2,048 tokens) in one pass took the
    # SQL job past 21.9 GB resident, and the kernel killed it (bench/README.md).
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
    # Large result sets are cut so that observations stay within the context.
    return smollm2_config("intercode_sql", {"max_observation_chars": 1000}, expert_tasks=96, rows=8)
