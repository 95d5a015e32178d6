"""SmolLM2-135M-Instruct (bundled GGUF, offline) on ScienceWorld (ETO's splits): SFT, RFT, ETO, co-evolution.

The SQL config's CPU sizing (`sql_smollm2.smollm2_config`) with gold-path experts of the first 64 train tasks
(ScienceWorld's expert episodes are 2.3x as long as SQL's: 1,408 tokens on average with SmolLM2's tokenizer),
32 explored per iteration, 32 per test split (seen = ETO's dev split, unseen = its test split). Needs Java
(launch/install_java.sh).

    python -m coevo_jax.main --config=configs/sciworld_smollm2.py --workdir=workdir_sciworld
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sql_smollm2 import smollm2_config  # noqa: E402


def get_config():
    return smollm2_config("sciworld", {"java_max_heap": "384m"}, expert_tasks=64, rows=4)
