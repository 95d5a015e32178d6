"""SmolLM2-135M-Instruct (bundled GGUF, offline) on ScienceWorld (ETO's splits): SFT, ETO, co-evolution.

Sized for a CPU in a few hours: gold-path experts of the first 200 train tasks, 100 explored per iteration,
60 per test split (seen = ETO's dev split, unseen = its test split). Needs Java (launch/install_java.sh).

    python -m coevo_jax.main --config=configs/sciworld_smollm2.py --workdir=workdir_sciworld
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sql_smollm2 import smollm2_config  # noqa: E402


def get_config():
    return smollm2_config("sciworld", {"java_max_heap": "384m"}, expert_tasks=200, rows=4)
