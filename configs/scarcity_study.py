"""The scarcity study: K train tasks with an expert, every one of them explored by each agent every iteration.

The paper's and ETO's protocol (`env.explore_tasks = 0`: every train task that has an expert) on the
quickstart's policy and preference recipe, with the expert count K as the axis (studies/scarcity/README.md):

    python -m coevo_jax.main --config=configs/scarcity_study.py:300 --config.seed=0 --workdir=scarcity_k300_s0
    python -m coevo_jax.main --config=configs/scarcity_study.py:300,dev --workdir=scarcity_dev_k300_s0

The argument is K, optionally followed by `,dev`: one iteration of SFT and co-evolution evaluated on the dev
splits, which is how the base each K leaves and what it gives the failure agent are measured before any
test run. SFT trains about as many steps at every K as the quickstart's 10 epochs over 1,500 experts (its
dev plateau), so a smaller K sees each expert more often rather than training less.
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config

QUICKSTART_EXPERTS, QUICKSTART_EPOCHS = 1500, 10


def sft_epochs(experts: int) -> int:
    """Epochs giving about the quickstart's number of SFT steps over `experts` trajectories."""
    return max(QUICKSTART_EPOCHS, round(QUICKSTART_EPOCHS * QUICKSTART_EXPERTS / experts))


def get_config(arg: str = "800") -> ConfigDict:
    parts = [part.strip() for part in arg.split(",") if part.strip()]
    if not parts or not parts[0].isdigit() or set(parts[1:]) - {"dev"}:
        raise ValueError(f"configs/scarcity_study.py:{arg}: expected 'K' or 'K,dev' with K an expert count")
    experts, dev = int(parts[0]), "dev" in parts[1:]
    config = blocks.scratch_builtin_run(default_config())
    config.methods = ("sft", "eto", "coevo", "coevo_expert_pairs")
    config.env.expert_tasks = experts
    config.env.explore_tasks = 0  # every train task with an expert, by each agent, every iteration
    config.env.eval_tasks = None  # the whole splits
    # a sweep point is scored at the SFT policy and after the last iteration; the 5-seed point passes
    # --config.env.eval_every_iteration=True for the reward curves
    config.env.eval_every_iteration = False
    config.sft.epochs = sft_epochs(experts)
    # Exploration samples at the quickstart's temperature 1.0; ETO's released scripts explore greedily.
    config.rollout.temperature = 1.0
    if dev:
        config.methods = ("sft", "coevo")
        config.iterations = 1
        config.env.eval_splits = ("dev", "dev_unseen")
    return config
