"""Training of one policy at a time: state, optimizer, objectives (eq. 3/5, 7, 9, GRPO), jitted steps."""

from coevo_jax.train.compiled_steps import PolicySteps, StepKind, build_steps
from coevo_jax.train.metrics import MetricsLog
from coevo_jax.train.objectives import GRPOObjective, ObjectiveConfig
from coevo_jax.train.optim import (
    AdamWSettings,
    LearningRateSchedule,
    OptimizerConfig,
    dpo_config,
    learning_rate,
    learning_rate_schedule,
    make_optimizer,
)
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
from coevo_jax.train.steps import PhaseScalars, phase_scalars

__all__ = [
    "AdamWSettings",
    "GRPOObjective",
    "LearningRateSchedule",
    "MetricsLog",
    "ObjectiveConfig",
    "OptimizerConfig",
    "PhaseScalars",
    "PolicySteps",
    "StepKind",
    "TrainState",
    "abstract_state",
    "build_steps",
    "dpo_config",
    "init_train_state",
    "learning_rate",
    "learning_rate_schedule",
    "load_sharded",
    "make_optimizer",
    "phase_scalars",
    "reference_logprobs",
    "sharded_place",
    "state_shardings",
    "train_state_from_params",
]
