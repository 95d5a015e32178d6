"""The paper's comparison on the built-in environment: SFT, RFT, ETO, co-evolving agents and its two ablations
(positive agent, frozen failure agent), 3 iterations, on the whole 200-task test_seen and test_unseen splits.

Training is the paper's (the quickstart's policy and recipes): every preference phase passes 3 epochs over its
own pairs, eq. 9's SFT term as written. The SFT base trains 24 epochs, not the quickstart's 10: on the dev
splits of 5 seeds it has the highest mean reward of 10, 16 and 24 epochs and the seeds closest together
(studies/equal_budget/README.md). ETO and RFT explore each task twice,
as many episodes as co-evolution's two agents play together (`match_exploration`). Five seeds, then the
paired table:

    for s in 0 1 2 3 4; do python -m coevo_jax.main --config=configs/builtin_study.py --config.seed=$s \\
        --workdir=workdir_study24_$s; done
    python -m coevo_jax.reporting.report workdir_study24_{0,1,2,3,4} --figures studies/equal_budget
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config() -> ConfigDict:
    config = blocks.scratch_builtin_run(default_config())
    config.methods = ("sft", "rft", "eto", "coevo", "coevo_positive", "coevo_frozen")
    config.match_exploration = True
    config.env.explore_tasks = 160
    config.env.eval_tasks = None  # the whole splits
    config.sft.epochs = 24
    config.sft.rft_epochs = (
        1  # RFT fine-tunes the current policy on experts + successes: one pass each iteration
    )
    return config
