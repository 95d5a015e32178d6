"""SmolLM2-135M-Instruct (bundled GGUF, offline) on BFCL multi_turn_base: zero-shot, SFT, GRPO and CoEvolve.

CoEvolve's BFCL comparison (zero-shot, GRPO, CoEvolve; Qwen3-4B: 26.5 / 58.0 / 63.0) sized for 2 CPU cores:
the SQL config's SmolLM2 settings (`sql_smollm2.smollm2_config`: full fine-tuning, float32 sampling; float32
training here too, 1.4x bf16's speed on AVX2-only CPUs) with BFCL's ground truth as experts for the first 32 of
the 150 train tasks (our split: task numbers n % 4 != 3) for two SFT epochs at lr 1e-4, then one iteration of 2
GRPO steps (4 train tasks x K = 4 episodes at T = 0.9 each, lr 1e-5, beta 1e-3, all-equal groups dropped: they
carry no policy gradient), CoEvolve on the same 2 steps with a round after the first, and the first 16 of the
50 test tasks evaluated greedily, 16 sampler rows at once. With the compact function docs the task text is 836
SmolLM2 tokens on average and an expert episode 1,833 (p90 2,317, max 2,821; bench/bfcl_sizes.py), so
sequences and the sampling cache are 3,072 tokens long (2,048 would cut a third of the experts). Observations
are cut at 1,000 characters. The reward is BFCL's checker over the whole conversation (1.0 or 0.0); the
per-turn accuracy is beside it (`metrics` in results.json). The GRPO rate is not tuned: between the DPO rate
that kept SmolLM2's SQL policy intact (1e-6) and SFT's. On 2 cores the SFT policy solves none of the train
tasks it samples, so every group is all-zero and GRPO makes no update (README, "SmolLM2-135M on BFCL").
Needs `pip install --no-deps bfcl-eval==2026.3.23` and mpmath (the `bfcl` extra).

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
    config.model.compute_dtype = "float32"  # AVX2-only CPUs: 1.4x bf16's speed (bench/README.md)
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
