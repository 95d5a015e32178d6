"""Learning-rate schedules (data evaluated in the step, equal to optax's schedules), the paper presets and
AdamW's weight-decay mask."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from coevo_jax.train import (
    AdamWSettings,
    OptimizerConfig,
    dpo_config,
    learning_rate,
    learning_rate_schedule,
    make_optimizer,
)

SCHEDULE_CASES = [
    OptimizerConfig(learning_rate=2e-5, schedule="cosine", warmup_steps=10, total_steps=110),
    OptimizerConfig(learning_rate=3e-3, schedule="cosine", warmup_steps=0, total_steps=7),
    OptimizerConfig(learning_rate=3e-3, schedule="cosine", warmup_steps=1, total_steps=2),
    OptimizerConfig(
        learning_rate=1e-4, schedule="cosine", warmup_steps=3, total_steps=40, final_lr_ratio=0.1
    ),
    dpo_config(1e-6, warmup_steps=4),
    dpo_config(5e-7),
    OptimizerConfig(learning_rate=1e-3, warmup_steps=7, total_steps=3),  # the constant ignores total_steps
]


def optax_schedule(config: OptimizerConfig) -> optax.Schedule:
    """The phases' schedules as optax builds them (how the optimizer held them before they became data)."""
    peak, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, peak, warmup, config.total_steps, end_value=peak * config.final_lr_ratio
        )
    if warmup == 0:
        return optax.constant_schedule(peak)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], boundaries=[warmup]
    )


def float64_schedule(config: OptimizerConfig, step: np.ndarray) -> np.ndarray:
    """Linear warmup from 0, then constant or cosine decay to peak * final_lr_ratio, in float64."""
    peak, warmup, step = config.learning_rate, config.warmup_steps, step.astype(np.float64)
    ramp = peak * np.minimum(step, warmup) / max(warmup, 1)
    if config.schedule == "constant":
        return np.where(step < warmup, ramp, peak)
    decay = config.total_steps - warmup
    t = np.clip(step - warmup, 0, decay)
    alpha = config.final_lr_ratio
    return np.where(step < warmup, ramp, peak * ((1 - alpha) * 0.5 * (1 + np.cos(np.pi * t / decay)) + alpha))


@pytest.mark.parametrize("config", SCHEDULE_CASES, ids=lambda c: f"{c.schedule}-w{c.warmup_steps}")
def test_the_schedule_as_data_equals_optax_and_float64(config):
    steps = np.arange(0, 2 * config.total_steps + config.warmup_steps + 20, dtype=np.int32)
    schedule = learning_rate_schedule(config)
    # one jitted program for every schedule: its fields are arguments, the step a traced int32 as in the step
    ours = np.asarray(jax.jit(jax.vmap(learning_rate, in_axes=(None, 0)))(schedule, steps))
    expected = np.asarray(jax.jit(jax.vmap(optax_schedule(config)))(steps), np.float32)
    assert ours.dtype == np.float32
    # the same float32 operations as optax's (bitwise equal on CPU today; XLA may fold constants otherwise)
    np.testing.assert_array_max_ulp(ours, expected, maxulp=1)
    # float32 round-off, relative to the peak where the cosine nears 0
    peak = config.learning_rate
    np.testing.assert_allclose(ours, float64_schedule(config, steps), rtol=1e-5, atol=1e-6 * peak)


def test_cosine_with_linear_warmup():
    schedule = learning_rate_schedule(
        OptimizerConfig(learning_rate=2e-5, schedule="cosine", warmup_steps=10, total_steps=110)
    )
    np.testing.assert_allclose(
        [learning_rate(schedule, s) for s in (0, 5, 10, 60, 110)], [0.0, 1e-5, 2e-5, 1e-5, 0.0], atol=1e-12
    )


def test_constant_with_warmup():
    schedule = learning_rate_schedule(dpo_config(1e-6, warmup_steps=4))
    np.testing.assert_allclose([learning_rate(schedule, s) for s in (0, 2, 4, 1000)], [0, 5e-7, 1e-6, 1e-6])


def test_dpo_preset_follows_the_paper():
    assert dpo_config().learning_rate == 1e-6 and dpo_config(5e-7).schedule == "constant"


def test_phases_of_one_adamw_share_its_settings():
    sft = OptimizerConfig(learning_rate=2e-5, schedule="cosine", warmup_steps=3, total_steps=30)
    assert sft.adamw_settings() == dpo_config(1e-6, warmup_steps=2).adamw_settings() == AdamWSettings()
    assert OptimizerConfig(1e-6, weight_decay=0.1).adamw_settings() == AdamWSettings(weight_decay=0.1)


def test_config_from_mapping_rejects_typos():
    cfg = OptimizerConfig.from_mapping(
        ml_collections.ConfigDict({"learning_rate": 1e-6, "weight_decay": 0.1})
    )
    assert cfg.weight_decay == 0.1
    with pytest.raises(ValueError, match="learnin_rate"):
        OptimizerConfig.from_mapping({"learnin_rate": 1e-6})
    with pytest.raises(ValueError, match="schedule"):
        OptimizerConfig(learning_rate=1.0, schedule="linear")


def test_weight_decay_skips_vectors():
    """At its unit learning rate (the step scales the update by the phase's rate)."""
    tx = make_optimizer(AdamWSettings(weight_decay=0.5, grad_clip_norm=1.0))
    params = {"kernel": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
    zero_grads = {"kernel": jnp.zeros((2, 2)), "scale": jnp.zeros((2,))}
    updates, _ = tx.update(zero_grads, tx.init(params), params)
    np.testing.assert_allclose(updates["kernel"], -0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_array_equal(updates["scale"], np.zeros(2))
