"""The paper's setting with Qwen3-4B in place of Llama-2-7B-Chat (same recipe and needs: paper_llama2_7b.py).

    python -m coevo_jax.main --config=configs/paper_qwen3_4b.py:sql --workdir=/ckpt/coevo_sql_qwen3 \\
        --config.model.source=/models/Qwen3-4B
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from paper_llama2_7b import paper_config  # noqa: E402


def get_config(env: str = "sciworld"):
    return paper_config(env, "~/models/Qwen3-4B")
