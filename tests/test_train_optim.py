"""Learning-rate schedules, the paper presets and AdamW's weight-decay mask."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from coevo_jax.train import OptimizerConfig, dpo_config, make_optimizer, make_schedule


def test_cosine_with_linear_warmup():
    schedule = make_schedule(
        OptimizerConfig(learning_rate=2e-5, schedule="cosine", warmup_steps=10, total_steps=110)
    )
    np.testing.assert_allclose(
        [schedule(0), schedule(5), schedule(10), schedule(60), schedule(110)],
        [0.0, 1e-5, 2e-5, 1e-5, 0.0],
        atol=1e-12,
    )


def test_constant_with_warmup():
    schedule = make_schedule(dpo_config(1e-6, warmup_steps=4))
    np.testing.assert_allclose([schedule(0), schedule(2), schedule(4), schedule(1000)], [0, 5e-7, 1e-6, 1e-6])


def test_dpo_preset_follows_the_paper():
    assert dpo_config().learning_rate == 1e-6 and dpo_config(5e-7).schedule == "constant"


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
    tx = make_optimizer(OptimizerConfig(learning_rate=0.1, weight_decay=0.5, grad_clip_norm=1.0))
    params = {"kernel": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
    zero_grads = {"kernel": jnp.zeros((2, 2)), "scale": jnp.zeros((2,))}
    updates, _ = tx.update(zero_grads, tx.init(params), params)
    np.testing.assert_allclose(updates["kernel"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_array_equal(updates["scale"], np.zeros(2))
