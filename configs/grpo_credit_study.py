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

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config(variant: str = "episode") -> ConfigDict:
    config = blocks.scratch_builtin_run(default_config())
    # builtin_study.py's settings on its 10-epoch SFT base, whose workdirs seed these runs (--reuse_from)
    config.methods = ("sft", "grpo")
    config.iterations = 2
    config.match_exploration = True
    config.env.explore_tasks = 160
    config.env.eval_tasks = None  # the whole splits
    config.sft.rft_epochs = 1
    config.grpo.tasks_per_step = 8
    return blocks.credit_variant(config, variant, "grpo_credit_study")
