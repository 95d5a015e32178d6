"""AdamW with global-norm clipping and the two learning-rate schedules of the paper's phases.

* SFT (behavioural cloning, eq. 3/5): cosine decay after a linear warmup; ETO uses lr 2e-5 for 3 epochs.
* DPO phases (eq. 7: ETO and the failure agent; eq. 9: the target agent): constant after a linear warmup
  (lr 1e-6 / 5e-7).

A phase's schedule (peak, warmup, length, final ratio, kind) is data, a `LearningRateSchedule` of scalars
the train step takes as an argument and evaluates at the state's step count, so one compiled step serves
every phase; the optimizer itself (`make_optimizer`) holds only the settings no phase changes
(`AdamWSettings`) and a unit learning rate, and the step scales its update by the schedule's value.

Weight decay applies to matrices only (kernels, embeddings), not to norm scales or biases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from coevo_jax.train.mapping import dataclass_from_mapping

SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class AdamWSettings:
    """The AdamW hyper-parameters that no phase changes: what a compiled train step is specialised on."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = 1.0


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

    def adamw_settings(self) -> AdamWSettings:
        """The phase-independent part: phases that differ only in their schedule share one optimizer."""
        return AdamWSettings(self.b1, self.b2, self.eps, self.weight_decay, self.grad_clip_norm)


def dpo_config(learning_rate: float = 1e-6, warmup_steps: int = 0) -> OptimizerConfig:
    """DPO phases: constant lr (1e-6, or 5e-7 for the target agent) after a linear warmup."""
    return OptimizerConfig(learning_rate=learning_rate, schedule="constant", warmup_steps=warmup_steps)


@flax.struct.dataclass
class LearningRateSchedule:
    """One phase's learning-rate schedule as float32 scalars (`learning_rate` evaluates it): a linear warmup
    from 0 to `peak` over `warmup_steps` updates, then `peak` (constant) or, with `cosine` 1, a cosine decay
    to `peak * final_lr_ratio` at `total_steps` (warmup included)."""

    peak: jax.Array
    warmup_steps: jax.Array
    total_steps: jax.Array
    final_lr_ratio: jax.Array
    cosine: jax.Array


def learning_rate_schedule(config: OptimizerConfig) -> LearningRateSchedule:
    """The schedule of `config` as host float32 scalars."""
    scalar = lambda x: np.asarray(x, np.float32)
    return LearningRateSchedule(
        peak=scalar(config.learning_rate),
        warmup_steps=scalar(config.warmup_steps),
        total_steps=scalar(config.total_steps),
        final_lr_ratio=scalar(config.final_lr_ratio),
        cosine=scalar(config.schedule == "cosine"),
    )


def learning_rate(schedule: LearningRateSchedule, step: jax.Array) -> jax.Array:
    """The learning rate (float32) of optimizer update `step` (0-based).

    Computed in float32 in the order of optax's `warmup_cosine_decay_schedule` / `linear_schedule` (the
    cosine's division by its length as the multiplication XLA makes of it when the length is a constant),
    so the values equal, to the float32 ulp, those of the optax schedules the phases used before."""
    s = schedule
    step = jnp.asarray(step).astype(jnp.float32)
    warmup = s.warmup_steps
    ramp = (0.0 - s.peak) * (1 - jnp.minimum(step, warmup) / jnp.maximum(warmup, 1.0)) + s.peak
    decay_steps = jnp.maximum(s.total_steps - warmup, 1.0)
    t = jnp.minimum(step - warmup, decay_steps)
    alpha = s.final_lr_ratio
    cosine = s.peak * ((1 - alpha) * (0.5 * (1 + jnp.cos(jnp.pi * t * (1.0 / decay_steps)))) + alpha)
    after_warmup = jnp.where(s.cosine > 0, cosine, s.peak)
    return jnp.where(step < warmup, ramp, after_warmup)


def _decay_mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(settings: AdamWSettings) -> optax.GradientTransformation:
    """Global-norm clipping (if set) followed by AdamW at a unit learning rate: the train step multiplies
    the update by its phase's `learning_rate`.

    The unit rate is a schedule, not a number, so the optimizer state keeps its step count and with it
    the layout of the checkpoints saved when the rate was a schedule."""
    adamw = optax.adamw(
        optax.constant_schedule(1.0),
        b1=settings.b1,
        b2=settings.b2,
        eps=settings.eps,
        weight_decay=settings.weight_decay,
        mask=_decay_mask,
    )
    if settings.grad_clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(settings.grad_clip_norm), adamw)
