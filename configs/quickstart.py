"""Quickstart: SFT, ETO and co-evolving agents end to end on the built-in environment, on a laptop CPU.

A tiny Llama-shaped policy trained from scratch with a tokenizer trained offline on the experts' text;
everything sized to finish in under 15 minutes on 2 CPU cores and print the Table-1-style comparison:

    python -m coevo_jax.main --config=configs/quickstart.py --workdir=workdir_quickstart
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.methods = ("sft", "eto", "coevo")
    config.iterations = 3
    config.max_length = 1024
    config.min_bucket = 256
    config.checkpoint_every_steps = 100
    config.log_every_steps = 10
    config.show_progress = True

    config.env = ConfigDict()
    config.env.name = "builtin"
    config.env.kwargs = ConfigDict({"seed": 0, "num_train": 300, "num_test_seen": 50, "num_test_unseen": 50})
    config.env.eval_splits = ("test_seen", "test_unseen")
    config.env.explore_tasks = 64
    config.env.eval_tasks = 50

    config.model = ConfigDict()
    config.model.source = "scratch"
    config.model.vocab_size = 1024
    config.model.hidden_size = 128
    config.model.intermediate_size = 384
    config.model.num_layers = 2
    config.model.num_heads = 4
    config.model.num_kv_heads = 2
    config.model.head_dim = 32
    config.model.compute_dtype = "bfloat16"
    config.model.sample_dtype = "float32"

    config.sft = ConfigDict()
    config.sft.epochs = 5
    config.sft.learning_rate = 2e-3
    config.sft.batch_size = 8

    config.dpo = ConfigDict()
    config.dpo.epochs = 2
    config.dpo.pairs_per_batch = 8
    config.dpo.learning_rates = (5e-5,)
    config.dpo.betas = (0.1,)
    config.dpo.max_pairs_per_task = 2

    config.rollout = ConfigDict()
    config.rollout.temperature = 1.0
    config.rollout.max_new_tokens = 48
    config.rollout.cache_len = 1024
    config.rollout.rows = 8
    config.rollout.groups = 2
    return config
