"""The paper's setting: Llama-2-7B-Chat on WebShop, ScienceWorld or InterCode-SQL with ETO's hyperparameters.

For GPUs. ETO's recipe (SFT 3 epochs at lr 2e-5, cosine, 3 % warmup, batch 64; DPO beta 0.1, lr 1e-6, 32 pairs
a batch, 3 epochs a phase; 4,096 tokens) and the paper's iterations (3 for WebShop and ScienceWorld, 5 for
InterCode-SQL). Pick the environment after a colon and point `model.source` at a local Hugging Face checkpoint
(nothing is downloaded). Both 7B policies on one 80 GB GPU: LoRA, `--config.model.lora_rank=16`, the command
in docs/memory_plan.md. ScienceWorld needs Java and the `sciworld` extra; WebShop its server package and ETO's
expert file (`env.experts_path`).

    python -m coevo_jax.main --config=configs/paper_llama2_7b.py:sciworld --workdir=/ckpt/coevo_sciworld \\
        --config.model.source=/models/Llama-2-7b-chat-hf
"""

from ml_collections import ConfigDict

from coevo_jax.experiment.config import default_config

ENVIRONMENTS = {
    "webshop": {"name": "webshop", "iterations": 3, "kwargs": {}},
    "sciworld": {"name": "sciworld", "iterations": 3, "kwargs": {"java_max_heap": "1g"}},
    # `--config.env.kwargs.backend=mariadb`: InterCode's MySQL-family engine (`bash launch/mariadb.sh start`)
    "sql": {"name": "intercode_sql", "iterations": 5, "kwargs": {"backend": "sqlite"}},
}


def paper_config(env: str, model_source: str) -> ConfigDict:
    """The shared paper-scale settings for `env` (a key of ENVIRONMENTS) and a checkpoint path."""
    if env not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {env!r}; use one of {sorted(ENVIRONMENTS)}")
    spec = ENVIRONMENTS[env]
    config = default_config()
    config.seed = 0
    config.methods = ("sft", "rft", "eto", "coevo")
    config.iterations = spec["iterations"]
    config.max_length = 4096
    config.min_bucket = 512
    config.checkpoint_every_steps = 100
    config.log_every_steps = 10
    config.show_progress = True
    config.mesh_axes = (("data", 1), ("fsdp", -1), ("tensor", 1))
    config.num_microbatches = 8  # one row of 4096 tokens per device on 8 GPUs (docs/memory_plan.md)

    config.env.name = spec["name"]
    config.env.kwargs = ConfigDict(spec["kwargs"])
    config.env.experts_path = ""

    config.model.source = model_source
    config.model.compute_dtype = "bfloat16"
    config.model.param_dtype = "float32"
    config.model.sample_dtype = "bfloat16"
    config.model.remat = True
    config.model.lora_rank = 0  # > 0: LoRA adapters of this rank train; the base is frozen and shared
    config.model.lora_alpha = 16.0
    config.model.lora_dropout = 0.0
    config.model.lora_targets = ("q", "k", "v", "o", "gate", "up", "down")

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


def get_config(env: str = "sciworld") -> ConfigDict:
    return paper_config(env, "~/models/Llama-2-7b-chat-hf")
