"""Quickstart: SFT, ETO and co-evolving agents end to end on the built-in environment, on a laptop CPU.

A tiny Llama-shaped policy (2 layers, hidden 128, a 4-token shift on its input embeddings) trained from
scratch with a tokenizer trained offline on the experts' text, 3 iterations, the paper's training (3 epochs
per preference phase, eq. 9 as written); prints the Table-1-style comparison:

    python -m coevo_jax.main --config=configs/quickstart.py --workdir=workdir_quickstart

Every setting was chosen on the dev splits, never on the test splits; the runs and their commands are in
studies/quickstart/README.md, "How the settings were chosen" (SFT recipe, preference phases, GRPO).
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config() -> ConfigDict:
    config = blocks.scratch_builtin_run(default_config())
    config.methods = ("sft", "eto", "coevo")
    config.env.explore_tasks = 160  # D_fail pairs per iteration: 23-28 with 96 tasks, 27-38 with 128
    config.env.eval_tasks = 50
    return config
