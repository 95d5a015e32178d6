"""SmolLM2-135M-Instruct (bundled GGUF, offline) on InterCode-SQL: SFT, RFT, ETO and co-evolution.

Sized for one seed in about 1 h 45 min and 10 GB on 2 CPU cores: full fine-tuning, SFT for two epochs on 96
GPT-4 expert episodes, one iteration exploring 32 train tasks, DPO phases of 6 updates of 4 pairs at lr 1e-6,
32 tasks per test split. The paper runs 5 iterations on the whole split; on a GPU raise `iterations`, the task
counts and the updates. Why each setting: studies/smollm2/README.md. Needs only the package (SQLite,
bundled data).

    python -m coevo_jax.main --config=configs/sql_smollm2.py --workdir=workdir_sql
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config() -> ConfigDict:
    config = blocks.smollm2_run(default_config(), rows=8)
    blocks.environment(config, "intercode_sql", max_observation_chars=1000, backend="sqlite")
    config.methods = ("sft", "rft", "eto", "coevo")
    config.env.expert_tasks = 96
    config.env.explore_tasks = 32
    config.env.eval_tasks = 32
    return config
