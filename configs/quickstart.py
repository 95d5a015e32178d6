"""Quickstart: SFT, ETO and co-evolving agents end to end on the built-in environment, on a laptop CPU.

A tiny Llama-shaped policy (2 layers, hidden 128, a 4-token shift on its input embeddings) trained from
scratch with a tokenizer trained offline on the experts' text; prints the Table-1-style comparison:

    python -m coevo_jax.main --config=configs/quickstart.py --workdir=workdir_quickstart

Chosen on the built-in environment's dev splits (`--config.env.eval_splits="('dev','dev_unseen')"`), never on
the test splits (bench/README.md has the runs):
* SFT. The policy must copy the room or container that the task text names for each object ("The apple is in
  the kitchen."). Greedy dev success after SFT, one run each: without the token shift 2-28 % over six runs
  (seeds, dtypes, shapes at lr 6e-3; 4 % at lr 1e-2); with it 50 % (seed 0; dev_unseen 14 %) and 16 %
  (seed 1), so the shift helps but a seed can still miss. 1,500 expert trajectories and lr 6e-3 beat 300
  trajectories and lr 2e-3.
* DPO lr 3e-5, beta 0.1, 20 updates per phase. From the same iteration-1 policies and explorations, one
  phase each: co-evolution's target at lr 1e-4 fell from 52 % to 28-38 % dev success (its greedy turns
  start ending after the thought, with no action), at 3e-5 it held 50 %; ETO
  reached 56 % at 3e-5 and 54 % at 1e-4; beta 0.5 changed little.
* Exploration: 160 train tasks per agent and iteration, so that D_fail (one episode per task and agent;
  equal rewards make no pair) holds at least 30 pairs (96 tasks gave 23-28, 128 gave 27-38); a step budget
  of the expert's length + 5 (97 % of the SFT policy's successes on train tasks needed no more).
* KV cache of 1,280 tokens: no episode needs more (the longest of 5,440 in the study's seed 0 had 970 tokens,
  a turn adds at most 48), and decoding reads the whole cache at every step, so 2,048 cost 1.5x the
  exploration time (39 s against 26 s for 160 episodes, the same trajectories byte for byte).
* GRPO (`--config.methods="('sft','grpo')"`; not in the default methods): CPU-sized, 10 steps an iteration of
  16 of the 160 train tasks x K = 8 episodes at T = 0.9, batches of 64 episodes, beta 1e-3. lr 3e-4: on dev,
  from the same SFT policy and the same task draws, its sampled reward beat lr 1e-4's by 0.020 a step over
  steps 2-10 (bench/README.md). Table 9's 1e-6 is a 7B model's rate.
"""

from ml_collections import ConfigDict

from coevo_jax.experiment.config import default_config


def get_config() -> ConfigDict:
    config = default_config()
    config.seed = 0
    config.methods = ("sft", "eto", "coevo")
    config.iterations = 3
    config.max_length = 1024
    config.length_buckets = (512, 768)  # experts are 280-790 tokens: less padding than 512/1024 alone
    config.checkpoint_every_steps = 200
    config.log_every_steps = 10
    config.show_progress = True

    config.env.name = "builtin"
    config.env.kwargs = ConfigDict(
        {
            "seed": 0,
            "num_train": 1500,
            "num_test_seen": 200,
            "num_test_unseen": 200,
            "num_dev": 100,
            "num_dev_unseen": 100,
            # expert length + 5 steps (the default is 2x + 5): 97 % of the SFT policy's successes on train
            # tasks took at most 5 steps more than the expert, and failures, which play to the budget, cost
            # a third fewer steps
            "budget_per_expert_step": 1,
            "budget_extra_steps": 5,
        }
    )
    config.env.eval_splits = ("test_seen", "test_unseen")
    config.env.explore_tasks = 160  # D_fail pairs per iteration: 23-28 with 96 tasks, 27-38 with 128
    config.env.eval_tasks = 50

    config.model.source = "scratch"
    config.model.vocab_size = 1024
    config.model.hidden_size = 128
    config.model.intermediate_size = 384
    config.model.num_layers = 2
    config.model.num_heads = 4
    config.model.num_kv_heads = 2
    config.model.head_dim = 32
    config.model.compute_dtype = "float32"  # on this scale as fast as bf16 on a CPU, and it learned better
    config.model.sample_dtype = "float32"
    config.model.token_shift = 4  # each input also sees the 4 tokens before it (models/token_shift.py)

    config.sft.epochs = 4
    config.sft.learning_rate = 6e-3
    config.sft.batch_size = 8

    config.dpo.epochs = 3  # the paper's: every preference phase passes 3 times over its own pairs
    config.dpo.pairs_per_batch = 8
    config.dpo.learning_rates = (3e-5,)
    config.dpo.betas = (0.1,)
    config.dpo.include_within_agent = False  # D_fail as eq. 6 (True: also failures within each agent)

    config.rollout.temperature = 1.0
    config.rollout.samples_per_task = 1  # episodes per task and agent in an exploration
    config.rollout.max_new_tokens = 48
    config.rollout.cache_len = 1280  # the longest episode so far: 970 tokens
    config.rollout.rows = 8
    config.rollout.groups = 2

    config.grpo.learning_rate = 3e-4
    config.grpo.samples_per_task = 8
    config.grpo.tasks_per_step = 16
    config.grpo.steps_per_iteration = 10
    config.grpo.batch_size = 64
    config.grpo.updates_per_batch = 1
    config.grpo.beta = 1e-3
    config.grpo.temperature = 0.9
    return config
