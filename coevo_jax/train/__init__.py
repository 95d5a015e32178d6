"""Training of the two co-evolving policies: state, optimizer, objectives (eq. 5, 7, 9), jitted steps."""

from coevo_jax.train.config import TrainConfig
from coevo_jax.train.metrics import MetricsLog
from coevo_jax.train.objectives import ObjectiveConfig
from coevo_jax.train.optim import OptimizerConfig, dpo_config, eto_sft_config, make_optimizer, make_schedule
from coevo_jax.train.policies import CoevoState, park, unpark
from coevo_jax.train.reference import attach_phase_reference, attach_reference, reference_logprobs
from coevo_jax.train.state import (
    TrainState,
    abstract_model,
    abstract_state,
    init_train_state,
    load_sharded,
    sharded_place,
    state_shardings,
    train_state_from_params,
)
from coevo_jax.train.steps import PolicySteps, build_steps

__all__ = [
    "CoevoState",
    "MetricsLog",
    "ObjectiveConfig",
    "OptimizerConfig",
    "PolicySteps",
    "TrainConfig",
    "TrainState",
    "abstract_model",
    "abstract_state",
    "attach_phase_reference",
    "attach_reference",
    "build_steps",
    "dpo_config",
    "eto_sft_config",
    "init_train_state",
    "load_sharded",
    "make_optimizer",
    "make_schedule",
    "park",
    "reference_logprobs",
    "sharded_place",
    "state_shardings",
    "train_state_from_params",
    "unpark",
]
