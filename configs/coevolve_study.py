"""CoEvolve's comparison on the built-in environment: SFT, GRPO and CoEvolve, 3 seeds on 2 CPU cores.

The quickstart's policy, SFT recipe, sampling and GRPO settings, then 2 iterations of 10 GRPO steps each for
GRPO and for CoEvolve from the same SFT policy (CoEvolve: a round of task synthesis every 5 steps, the
`coevolve` group's defaults otherwise), greedy evaluation on test_seen and test_unseen after each iteration. A
step draws 8 tasks (x K = 8 episodes) instead of the quickstart's 16, so that a seed runs in about 40 min on 2
cores. Why, and the timings: studies/coevolve/README.md. Needs only the package.

    for s in 0 1 2; do python -m coevo_jax.main --config=configs/coevolve_study.py --config.seed=$s \\
        --workdir=workdir_coevolve_$s; done
    python -m coevo_jax.reporting.report workdir_coevolve_0 workdir_coevolve_1 workdir_coevolve_2 \\
        --figures studies/coevolve
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config() -> ConfigDict:
    config = blocks.scratch_builtin_run(default_config())
    config.methods = ("sft", "grpo", "coevolve")
    config.iterations = 2
    config.env.explore_tasks = 160
    config.env.eval_tasks = 50
    config.grpo.tasks_per_step = 8

    config.coevolve.every_steps = 5
    config.coevolve.signals = ("forgetting", "boundary", "rare")
    config.coevolve.max_signals = 12
    config.coevolve.explorations_per_signal = 2
    config.coevolve.exploration_steps = 16
    config.coevolve.verify = True
    config.coevolve.guided = True
    return config
