"""Credit where GRPO has none, on the built-in environment: GRPO, GiGPO (`grpo.advantage="gigpo"`), GRPO with
dead-group pairs (`grpo.dead_groups="pairs"`) and both, each from the SFT policies of `builtin_study.py`'s
seed on its 10-epoch base (`--config.sft.epochs=10`; that workdir seeds this one: `--reuse_from`),
2 iterations of 10 GRPO steps of 8 train tasks x K = 8 episodes, greedy evaluation on the whole 200-task test
splits after each iteration. The variants differ only in the `grpo` fields named, so their steps draw the
same tasks with the same sampling seeds:

    for s in 0 1 2; do for v in episode gigpo pairs both; do
        python -m coevo_jax.main --config=configs/grpo_credit_study.py:$v --config.seed=$s \\
            --workdir=workdir_credit_${v}_$s --reuse_from=workdir_study_$s; done; done
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from builtin_study import get_config as study_config  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

VARIANTS = {
    "episode": dict(advantage="episode", dead_groups="none"),
    "gigpo": dict(advantage="gigpo", dead_groups="none"),
    "pairs": dict(advantage="episode", dead_groups="pairs"),
    "both": dict(advantage="gigpo", dead_groups="pairs"),
}


def get_config(variant: str = "episode") -> ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"grpo_credit_study: variant {variant!r}, one of {', '.join(VARIANTS)}")
    config = study_config()
    config.sft.epochs = 10  # the SFT base its results were measured from (the 10-epoch study seeds it reuses)
    config.methods = ("sft", "grpo")
    config.iterations = 2
    config.grpo.tasks_per_step = 8
    for field, value in VARIANTS[variant].items():
        config.grpo[field] = value
    return config
