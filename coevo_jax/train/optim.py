"""AdamW with global-norm clipping and the two learning-rate schedules of the paper's phases.

* SFT (behavioural cloning, eq. 3/5): cosine decay after a linear warmup; ETO uses lr 2e-5 for 3 epochs.
* DPO phases (eq. 7: ETO and the failure agent; eq. 9: the target agent): constant after a linear warmup
  (lr 1e-6 / 5e-7).

Weight decay applies to matrices only (kernels, embeddings), not to norm scales or biases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import optax

from coevo_jax.train.mapping import dataclass_from_mapping

SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW hyper-parameters and the learning-rate schedule of one training phase.

    `warmup_steps` counts optimizer updates; `total_steps` (warmup included) is the length of the cosine
    decay and is ignored by the constant schedule.
    """

    learning_rate: float
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    final_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = 1.0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} not in {SCHEDULES}")
        if self.schedule == "cosine" and self.total_steps <= self.warmup_steps:
            raise ValueError(f"cosine: total_steps={self.total_steps} must exceed warmup={self.warmup_steps}")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> OptimizerConfig:
        """From a ConfigDict/dict with (a subset of) the field names."""
        return dataclass_from_mapping(cls, config, "optimizer")


def dpo_config(learning_rate: float = 1e-6, warmup_steps: int = 0) -> OptimizerConfig:
    """DPO phases: constant lr (1e-6, or 5e-7 for the target agent) after a linear warmup."""
    return OptimizerConfig(learning_rate=learning_rate, schedule="constant", warmup_steps=warmup_steps)


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Learning rate as a function of the optimizer step (0-based)."""
    peak, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=peak,
            warmup_steps=warmup,
            decay_steps=config.total_steps,
            end_value=peak * config.final_lr_ratio,
        )
    if warmup == 0:
        return optax.constant_schedule(peak)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], boundaries=[warmup]
    )


def _decay_mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping (if set) followed by AdamW on `make_schedule(config)`."""
    adamw = optax.adamw(
        make_schedule(config),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=_decay_mask,
    )
    if config.grad_clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adamw)
