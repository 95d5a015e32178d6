"""The paper's comparison on the built-in environment: SFT, RFT, ETO, co-evolving agents and its two ablations
(positive agent, frozen failure agent), 3 iterations. One seed takes 27 min wall, 2,670 CPU-seconds and 2.8 GB
on a 2-core AMD EPYC (seed 0, alone; bench/README.md).

Every method gets the same budget per iteration: ETO and RFT play each explored task twice, as many episodes
as co-evolution's two agents play together (`match_exploration`), and every DPO phase runs the same number of
optimizer updates whatever its pair count (`dpo.updates_per_phase`). Evaluation covers the whole test_seen and
test_unseen splits. The policy, SFT recipe and sampling are the quickstart's (chosen on the dev splits).
Run three seeds, then the mean ± std table:

    for s in 0 1 2; do python -m coevo_jax.main --config=configs/builtin_study.py --config.seed=$s \\
        --workdir=workdir_study_$s; done
    python -m coevo_jax.experiment.report workdir_study_0 workdir_study_1 workdir_study_2 --figures docs/study
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ml_collections import ConfigDict  # noqa: E402
from quickstart import get_config as quickstart_config  # noqa: E402


def get_config() -> ConfigDict:
    config = quickstart_config()
    config.methods = ("sft", "rft", "eto", "coevo", "coevo_positive", "coevo_frozen")
    config.match_exploration = True
    config.env.eval_tasks = None  # the whole splits
    config.sft.rft_epochs = (
        1  # RFT fine-tunes the current policy on experts + successes: one pass each iteration
    )
    return config
