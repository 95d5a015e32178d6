"""`policy_model`: the `model.*` options of an experiment config reach the policy's ModelConfig."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coevo_jax import sharding
from coevo_jax.experiment.config import ModelSpec
from coevo_jax.experiment.model import policy_model


def test_the_model_options_of_a_config_reach_a_checkpoint_policys_model_config(tmp_path):
    mesh = sharding.make_mesh(
        sharding.MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))), jax.devices()[:1]
    )
    spec = ModelSpec(
        source="smollm2",
        compute_dtype="float32",
        remat=True,
        unroll_layers=True,
        right_padded=False,
        attention="blocked",
    )
    cfg, tokenizer, params = policy_model(spec, str(tmp_path), [], mesh, sharding.ShardingRules())
    assert (cfg.remat, cfg.unroll_layers, cfg.right_padded, cfg.attention) == (True, True, False, "blocked")
    assert (cfg.dtype, cfg.param_dtype) == (jnp.float32, jnp.float32)
    assert cfg.num_layers == 30 and tokenizer is not None
    assert params["layers"]["attn"]["q_kernel"].dtype == jnp.float32
    defaults = policy_model(ModelSpec(source="smollm2"), str(tmp_path), [], mesh, sharding.ShardingRules())[0]
    assert (defaults.remat, defaults.unroll_layers, defaults.dtype) == (False, False, jnp.bfloat16)
    assert defaults.right_padded  # the main job collates right-padded batches (and checks them)


def test_a_policy_that_assumes_right_padding_refuses_another_batch_before_placing_it():
    from types import SimpleNamespace

    from model_fixtures import KITCHEN_SINK

    from coevo_jax.experiment.train_loop import place_batch

    mask = np.ones((2, 6), np.int32)
    mask[1, :2] = 0  # left-padded
    setup = SimpleNamespace(model_cfg=KITCHEN_SINK.replace(right_padded=True))
    with pytest.raises(ValueError, match="batch row 1: attention_mask is not right-padded"):
        place_batch(setup, {"attention_mask": mask})
