"""SmolLM2-135M-Instruct (bundled GGUF, offline) on BFCL multi_turn_base: zero-shot, SFT, GRPO and CoEvolve.

CoEvolve's BFCL comparison (its Qwen3-4B: 26.5 / 58.0 / 63.0) on the SQL config's settings, sized for one seed
in about 2 h 30 min on 2 CPU cores: float32 training, SFT on the ground truth of 32 of our 150 train tasks, 2
GRPO steps of 4 tasks x K = 4 episodes (CoEvolve: a round after the first), 16 of the 50 test tasks greedily,
3,072-token sequences for 1,833-token experts. Why each setting, and why GRPO makes no update at this size:
studies/smollm2/README.md#bfcl-1. Needs the `bfcl` extra (mpmath) and BFCL itself:

    pip install -e ".[bfcl]" && pip install --no-deps bfcl-eval==2026.3.23
    python -m coevo_jax.main --config=configs/bfcl_smollm2.py --workdir=workdir_bfcl
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config() -> ConfigDict:
    config = blocks.bfcl_smollm2_run(default_config())
    config.methods = ("zero_shot", "sft", "grpo", "coevolve")
    return config
