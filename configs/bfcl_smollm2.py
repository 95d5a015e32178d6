"""SmolLM2-135M-Instruct (bundled GGUF, offline) on BFCL multi_turn_base: zero-shot, SFT, GRPO and CoEvolve.

CoEvolve's BFCL comparison (its Qwen3-4B: 26.5 / 58.0 / 63.0) on the SQL config's settings, sized for one seed
in about 2 h 30 min on 2 CPU cores: float32 training, SFT on the ground truth of 32 of our 150 train tasks, 2
GRPO steps of 4 tasks x K = 4 episodes (CoEvolve: a round after the first), 16 of the 50 test tasks greedily,
3,072-token sequences for 1,833-token experts. Why each setting, and why GRPO makes no update at this size:
studies/smollm2/README.md#bfcl-1. Needs the `bfcl` extra (mpmath) and BFCL itself:

    pip install -e ".[bfcl]" && pip install --no-deps bfcl-eval==2026.3.23
    python -m coevo_jax.main --config=configs/bfcl_smollm2.py --workdir=workdir_bfcl
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sql_smollm2 import smollm2_config  # noqa: E402


def get_config():
    config = smollm2_config(
        "bfcl",
        {"category": "multi_turn_base", "docs": "compact", "max_observation_chars": 1000},
        expert_tasks=32,
        rows=16,
    )
    config.rollout.groups = 1  # 16 rows in one batch: a decode step reads the weights once for all of them
    config.methods = ("zero_shot", "sft", "grpo", "coevolve")
    config.model.compute_dtype = "float32"  # 1.4x bf16 on AVX2 CPUs (studies/smollm2/README.md#bfcl-1)
    config.env.train_split = "train"
    config.env.eval_splits = ("test",)
    config.env.eval_tasks = 16
    config.max_length = 3072
    config.length_buckets = (512, 768, 1024, 1280, 1536, 2048, 2560)  # experts: 1,833 tokens, p90 2,317
    config.rollout.cache_len = 3072

    config.grpo.learning_rate = 1e-5
    config.grpo.samples_per_task = 4
    config.grpo.tasks_per_step = 4
    config.grpo.steps_per_iteration = 2
    config.grpo.batch_size = 8
    config.grpo.updates_per_batch = 1
    config.grpo.beta = 1e-3
    config.grpo.temperature = 0.9
    config.grpo.drop_equal_groups = True

    config.coevolve.every_steps = 1  # a round after the first step, so the second can draw pool tasks
    return config
