"""The tiny run: a one-layer policy on 8 built-in train tasks (4 + 4 test tasks), one iteration.

Seconds per stage on a CPU: the one small config, for the tests' end-to-end runs (`tests/test_experiment.py`),
the reproduction notebook's smoke budget and the kill-and-resume drill, each with its own overrides. Like
every config it starts from `default_config()`, so any field can be overridden with
`--config.group.field=value`. Needs only the package.

    python -m coevo_jax.main --config=configs/tiny.py --workdir=workdir_tiny
    python -m coevo_jax.main --config=configs/tiny.py:drill --workdir=workdir_drill

`drill` (run by `launch/kill_resume_drill.py`): 5 updates in every DPO phase with a checkpoint every 2, so a
kill lands between two checkpoints and the resumed phase must redo the updates after the last committed one.
"""

from ml_collections import ConfigDict, config_dict

from coevo_jax.experiment import config_blocks as blocks
from coevo_jax.experiment.config import default_config

VARIANTS = ("", "drill")


def get_config(variant: str = "") -> ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"configs/tiny.py: unknown variant {variant!r}; one of {VARIANTS}")
    config = default_config()
    config.seed = 0
    config.methods = ("sft", "eto", "coevo")
    config.iterations = 1
    config.max_length = 2048
    config.min_bucket = 1024
    config.checkpoint_every_steps = 2
    config.log_every_steps = 1
    config.show_progress = False

    blocks.environment(
        config,
        "builtin",
        seed=0,
        num_train=8,
        num_test_seen=4,
        num_test_unseen=4,
        budget_per_expert_step=2,
        budget_extra_steps=5,
    )
    config.env.eval_splits = ("test_seen", "test_unseen")
    config.env.explore_tasks = 8

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
    config.model.token_shift = 0
    blocks.lora_settings(config)

    config.sft.epochs = 2
    config.sft.learning_rate = 3e-3
    config.sft.batch_size = 8

    config.dpo.epochs = 2
    config.dpo.pairs_per_batch = 8
    config.dpo.learning_rates = (1e-3,)
    config.dpo.betas = (0.1,)
    config.dpo.max_pairs_per_task = config_dict.placeholder(int)
    config.dpo.updates_per_phase = 5 if variant == "drill" else config_dict.placeholder(int)

    config.grpo.learning_rate = 1e-4
    config.grpo.samples_per_task = 4
    config.grpo.tasks_per_step = 4
    config.grpo.steps_per_iteration = 2
    config.grpo.batch_size = 16
    config.grpo.updates_per_batch = 1
    config.grpo.beta = 1e-3
    config.grpo.temperature = 0.9
    config.grpo.drop_equal_groups = False

    config.coevolve.every_steps = 1
    config.coevolve.signals = ("forgetting", "boundary", "rare")
    config.coevolve.window = 3
    config.coevolve.theta = 5.0
    config.coevolve.min_seen = 8  # rollouts before a pattern can be rare (one step of 2 tasks x 4 samples)
    config.coevolve.max_signals = 4
    config.coevolve.explorations_per_signal = 1
    config.coevolve.exploration_steps = 12
    config.coevolve.min_solution_steps = 3
    config.coevolve.verify = True
    config.coevolve.guided = True

    config.rollout.temperature = 1.0
    config.rollout.max_new_tokens = 16
    config.rollout.cache_len = 2048
    config.rollout.rows = 8
    config.rollout.groups = 1
    config.rollout.env_workers = 2
    config.rollout.merge_lora = True
    return config
