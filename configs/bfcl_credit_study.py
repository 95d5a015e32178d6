"""Credit where GRPO has none, on BFCL with SmolLM2: GRPO, GiGPO, GRPO with dead-group pairs and both
(`grpo_credit_study.VARIANTS`), with `bfcl_smollm2.py`'s SFT (32 experts, two epochs), 2 GRPO steps of 4 tasks x
K = 4 episodes and greedy evaluation on 16 test tasks. There the SFT policy's sampled episodes all score 0,
so plain GRPO drops every group and makes no update; the question is which variant finds a gradient (BFCL's
per-turn accuracy ranks dead groups' failures; GiGPO's step groups need different returns from one state).
The first variant trains the SFT policy (about 25 min on 2 cores), the others start from it (`--reuse_from`,
about 10 min each); studies/credit/README.md:

    python -m coevo_jax.main --config=configs/bfcl_credit_study.py:episode --workdir=workdir_bfcl_credit_episode
    for v in gigpo pairs both; do
        python -m coevo_jax.main --config=configs/bfcl_credit_study.py:$v --workdir=workdir_bfcl_credit_$v \\
            --reuse_from=workdir_bfcl_credit_episode; done
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bfcl_smollm2 import get_config as bfcl_config  # noqa: E402
from grpo_credit_study import VARIANTS  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402


def get_config(variant: str = "episode") -> ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"bfcl_credit_study: variant {variant!r}, one of {', '.join(VARIANTS)}")
    config = bfcl_config()
    config.methods = ("sft", "grpo")
    for field, value in VARIANTS[variant].items():
        config.grpo[field] = value
    return config
