"""Credit where GRPO has none, on BFCL with SmolLM2: GRPO, GiGPO, GRPO with dead-group pairs and both
(`config_blocks.CREDIT_VARIANTS`), with `bfcl_smollm2.py`'s SFT (32 experts, two epochs), 2 GRPO steps of 4 tasks x
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

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config(variant: str = "episode") -> ConfigDict:
    config = blocks.bfcl_smollm2_run(default_config())
    config.methods = ("sft", "grpo")
    return blocks.credit_variant(config, variant, "bfcl_credit_study")
