"""SmolLM2-135M-Instruct (bundled GGUF, offline) on ScienceWorld (ETO's splits): SFT, RFT, ETO, co-evolution.

SmolLM2's CPU recipe (`config_blocks.smollm2_recipe`, as the SQL config) cut further for gold paths 2.4x as long, so that a
seed runs in about 1 h 40 min on 2 CPU cores: float32 training, one SFT epoch on the first 32 train tasks'
gold paths, one iteration exploring 16 of them, DPO phases of 2 updates at lr 1e-5 that also pair episodes cut
at the 2,048-token context, 8 test tasks per split spread over its task kinds (seen = ETO's dev split, unseen
= its test split). Why each setting: studies/smollm2/README.md. Needs Java and the `sciworld`
extra:

    bash launch/install_java.sh && pip install -e ".[sciworld]"
    python -m coevo_jax.main --config=configs/sciworld_smollm2.py --workdir=workdir_sciworld
"""

from ml_collections import ConfigDict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config


def get_config() -> ConfigDict:
    config = blocks.smollm2_run(default_config(), rows=16)
    blocks.environment(config, "sciworld", java_max_heap="384m")
    config.methods = ("sft", "rft", "eto", "coevo")
    config.env.expert_tasks = 32
    config.env.explore_tasks = 16
    config.env.eval_tasks = 8
    config.env.eval_task_subset = "spread"
    config.model.compute_dtype = "float32"
    config.sft.epochs = 1
    config.sft.batch_size = 2
    config.dpo.updates_per_phase = 2
    config.dpo.learning_rates = (1e-5,)
    config.dpo.pair_context_limited = True
    config.rollout.groups = 1
    return config
