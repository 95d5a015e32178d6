"""The paper's setting with Qwen3-4B in place of Llama-2-7B-Chat (same recipe and needs: paper_llama2_7b.py).

    python -m coevo_jax.main --config=configs/paper_qwen3_4b.py:sql --workdir=/ckpt/coevo_sql_qwen3 \\
        --config.model.source=/models/Qwen3-4B
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config(env: str = "sciworld") -> ConfigDict:
    return blocks.paper_run(default_config(), env, "~/models/Qwen3-4B")
