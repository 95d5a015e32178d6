"""SmolLM2-135M-Instruct (bundled GGUF, offline) on ScienceWorld (ETO's splits): SFT, RFT, ETO, co-evolution.

The SQL config's CPU sizing (`sql_smollm2.smollm2_config`), cut further for 2 CPU cores. ScienceWorld's
gold-path episodes are 2.4x as long as SQL's experts (1,460 tokens on average with SmolLM2's tokenizer, 406 of
them the instruction; 8 of the first 64 are cut at 2,048 at a turn boundary), and a SmolLM2 train step runs at
~60-100 tokens/s on 2 cores in float32 (faster than bfloat16 on CPUs without AMX bf16). So SFT is one epoch over
the first 32 train tasks' gold paths in batches of 2 (17 updates, ~7 min per agent), each iteration explores the
first 16 of those tasks (ETO and co-evolution pair an episode with its own task's gold path), and each DPO phase
makes 2 updates of 4 pairs at lr 1e-5 (chosen on held-out train tasks).
Episodes cut at the context limit make pairs too, as failures scored at their last complete turn
(`dpo.pair_context_limited`): they are most of an exploration (18 of 32 in an earlier run's, its one failure
above 0.6 among them), and the loops that fill the context are what DPO should push down.
The test splits are sorted by task kind (ETO's unseen test lists every boiling task first), so the 8 tasks per
split are spread over it (`env.eval_task_subset = "spread"`): seen = ETO's dev split, unseen = its test split.
Needs Java (launch/install_java.sh).

Sized for about two hours a seed on 2 cores: rollouts are most of the time (episodes that do not finish run to
the 2,048-token context), and 16 rows play the 16 evaluation episodes (8 per split) or the 16 explored tasks in
one wave. Measured on a 2-core AVX-512 EPYC: SFT 7 min per agent, an evaluation of both splits 6.5 min, an
exploration 13 min. The main job resumes where it stopped.

    python -m coevo_jax.main --config=configs/sciworld_smollm2.py --workdir=workdir_sciworld
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sql_smollm2 import smollm2_config  # noqa: E402


def get_config():
    config = smollm2_config("sciworld", {"java_max_heap": "384m"}, expert_tasks=32, rows=16)
    config.env.explore_tasks = 16
    config.env.eval_tasks = 8
    config.env.eval_task_subset = "spread"
    config.model.compute_dtype = "float32"
    config.sft.epochs = 1
    config.sft.batch_size = 2
    config.dpo.updates_per_phase = 2
    # chosen on the 8 train tasks after the 32 expert tasks (bench/dpo_lr_probe.py; bench/README.md): from the
    # SFT policy's 0.180 average reward, 2 updates at 1e-6 left the policy as it was, 1e-5 reached 0.315, 5e-5 0.116
    config.dpo.learning_rates = (1e-5,)
    config.dpo.pair_context_limited = True
    config.rollout.groups = 1
    return config
