"""SmolLM2-135M-Instruct (bundled GGUF, offline) on BFCL multi_turn_base: SFT, RFT, ETO and co-evolution.

The SQL config's CPU sizing (`sql_smollm2.smollm2_config`) with BFCL's ground truth as experts for the first
64 of the 150 train tasks (our split: task numbers n % 4 != 3), 32 explored per iteration and 32 of the 50
test tasks evaluated. Not yet run with SmolLM2. An episode is a whole multi-turn conversation: with the compact function docs the task
text is 836 SmolLM2 tokens on average and an expert episode 1,833 (p90 2,317, max 2,821; bench/bfcl_sizes.py),
so sequences and the sampling cache are 3,072 tokens long here (the SQL config's 2,048 would cut a third of
the experts). Observations are cut at 1,000 characters. The reward is BFCL's checker over the whole
conversation (1.0 or 0.0); the per-turn accuracy is reported beside it (`metrics` in results.json). Needs
`pip install --no-deps bfcl-eval==2026.3.23` and mpmath (the `bfcl` extra).

    python -m coevo_jax.main --config=configs/bfcl_smollm2.py --workdir=workdir_bfcl
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sql_smollm2 import smollm2_config  # noqa: E402


def get_config():
    config = smollm2_config(
        "bfcl",
        {"category": "multi_turn_base", "docs": "compact", "max_observation_chars": 1000},
        expert_tasks=64,
        rows=4,
    )
    config.env.train_split = "train"
    config.env.eval_splits = ("test",)
    config.max_length = 3072
    config.rollout.cache_len = 3072
    return config
