"""Kill-and-resume drill: the quickstart's methods (SFT, ETO, co-evolution) shrunk to seconds per stage.

Used by `launch/kill_resume_drill.py`, which runs it once uninterrupted and again with SIGKILLs at chosen
points, and compares the results. A one-layer policy on 8 built-in train tasks (as the tests' tiny config);
one iteration. SFT takes 4 updates and every DPO phase 5, with a mid-phase checkpoint every 2, so a kill at
an update lands between two checkpoints and the resumed phase must redo the updates after the last
committed one.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.methods = ("sft", "eto", "coevo")
    config.iterations = 1
    config.max_length = 2048
    config.min_bucket = 1024
    config.checkpoint_every_steps = 2
    config.log_every_steps = 1
    config.show_progress = False

    config.env = ConfigDict()
    config.env.name = "builtin"
    config.env.kwargs = ConfigDict({"seed": 0, "num_train": 8, "num_test_seen": 4, "num_test_unseen": 4})
    config.env.eval_splits = ("test_seen", "test_unseen")
    config.env.explore_tasks = 8

    config.model = ConfigDict()
    config.model.source = "scratch"
    config.model.vocab_size = 300
    config.model.hidden_size = 32
    config.model.intermediate_size = 64
    config.model.num_layers = 1
    config.model.num_heads = 2
    config.model.num_kv_heads = 1
    config.model.head_dim = 16
    config.model.compute_dtype = "float32"
    config.model.sample_dtype = "float32"

    config.sft = ConfigDict()
    config.sft.epochs = 2
    config.sft.learning_rate = 3e-3
    config.sft.batch_size = 8

    config.dpo = ConfigDict()
    config.dpo.epochs = 2
    config.dpo.pairs_per_batch = 8
    config.dpo.learning_rates = (1e-3,)
    config.dpo.betas = (0.1,)
    config.dpo.updates_per_phase = 5

    config.rollout = ConfigDict()
    config.rollout.temperature = 1.0
    config.rollout.max_new_tokens = 16
    config.rollout.cache_len = 2048
    config.rollout.rows = 8
    config.rollout.groups = 1
    config.rollout.env_workers = 2
    return config
