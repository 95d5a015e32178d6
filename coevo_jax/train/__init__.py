"""Training of one policy at a time: state, optimizer, objectives (eq. 3/5, 7, 9, GRPO), jitted steps."""

from coevo_jax.train.metrics import MetricsLog
from coevo_jax.train.objectives import GRPOObjective, ObjectiveConfig
from coevo_jax.train.optim import OptimizerConfig, dpo_config, make_optimizer, make_schedule
from coevo_jax.train.reference import reference_logprobs
from coevo_jax.train.state import (
    TrainState,
    abstract_state,
    init_train_state,
    load_sharded,
    sharded_place,
    state_shardings,
    train_state_from_params,
)
from coevo_jax.train.steps import PolicySteps, StepKind, build_steps

__all__ = [
    "GRPOObjective",
    "MetricsLog",
    "ObjectiveConfig",
    "OptimizerConfig",
    "PolicySteps",
    "StepKind",
    "TrainState",
    "abstract_state",
    "build_steps",
    "dpo_config",
    "init_train_state",
    "load_sharded",
    "make_optimizer",
    "make_schedule",
    "reference_logprobs",
    "sharded_place",
    "state_shardings",
    "train_state_from_params",
]
