"""CoEvolve's comparison on the built-in environment (issue 22): SFT, GRPO and CoEvolve from the same SFT
policy with the same number of GRPO steps, 2 iterations of 10 steps, greedy evaluation on test_seen and
test_unseen after each iteration. The policy, SFT recipe, sampling and GRPO settings are the quickstart's
(chosen on the dev splits), except that a step draws 8 tasks (x K = 8 episodes, one update of 64) instead of
16, so that three seeds fit one 2-core session (about 35 min a seed alone).

CoEvolve runs a round after every 5 GRPO steps (rounds after steps 5, 10 and 15 feed steps 6-20; the round
after step 20 is reported but trains nothing), with `coevolve`'s defaults otherwise (12 signals x 2
explorations of 16 steps a round). Forgetting seldom fires here: a step draws 8 of 160+ tasks, so a task is
rarely seen twice in 20 steps; the rounds come from boundary and rare signals (the policy's own rollouts have
a long tail of verb-object patterns, unlike the experts'). Seeds 0 and 1 in parallel took 43 min wall and
4.2 GB each on 2 cores (README.md has the results).

    for s in 0 1 2; do python -m coevo_jax.main --config=configs/coevolve_study.py --config.seed=$s \\
        --workdir=workdir_coevolve_$s; done
    python -m coevo_jax.experiment.report workdir_coevolve_0 workdir_coevolve_1 workdir_coevolve_2 \\
        --figures docs/coevolve_study
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ml_collections import ConfigDict  # noqa: E402
from quickstart import get_config as quickstart_config  # noqa: E402


def get_config() -> ConfigDict:
    config = quickstart_config()
    config.methods = ("sft", "grpo", "coevolve")
    config.iterations = 2
    config.grpo.tasks_per_step = 8

    config.coevolve.every_steps = 5
    config.coevolve.signals = ("forgetting", "boundary", "rare")
    config.coevolve.max_signals = 12
    config.coevolve.explorations_per_signal = 2
    config.coevolve.exploration_steps = 16
    config.coevolve.verify = True
    config.coevolve.guided = True
    return config
