"""SmolLM2-135M-Instruct (bundled GGUF, offline) on ScienceWorld (ETO's splits): SFT, RFT, ETO, co-evolution.

The SQL config's CPU sizing (`sql_smollm2.smollm2_config`), cut further so that one seed fits about two hours
on 2 CPU cores: ScienceWorld's gold-path episodes are 2.4x as long as SQL's experts (1,460 tokens on average
with SmolLM2's tokenizer, 406 of them the instruction; 8 of the first 64 are cut at 2,048 at a turn boundary).
SFT: two epochs over the first 64 train tasks' gold paths, in float32 (faster than bfloat16 on CPUs without
AMX bf16; an SFT step of 4 episodes takes ~20 s on 2 cores). Each iteration explores 32 train tasks; each DPO phase makes 4 updates of 4 pairs. The test splits are
sorted by task kind (ETO's unseen test lists every boiling task first), so the 16 tasks per split are spread
over it (`env.task_subset = "spread"`): seen = ETO's dev split, unseen = its test split. Needs Java
(launch/install_java.sh).

    python -m coevo_jax.main --config=configs/sciworld_smollm2.py --workdir=workdir_sciworld
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sql_smollm2 import smollm2_config  # noqa: E402


def get_config():
    config = smollm2_config("sciworld", {"java_max_heap": "384m"}, expert_tasks=64, rows=16)
    config.env.eval_tasks = 16
    config.env.task_subset = "spread"
    config.model.compute_dtype = "float32"
    config.dpo.updates_per_phase = 4
    config.rollout.groups = 1
    return config
