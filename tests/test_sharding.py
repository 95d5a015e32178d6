"""Mesh construction, logical-axis rules, FSDP parameter placement and the device batch layout."""

import re

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from train_fixtures import (
    MESHES,
    PAD,
    SCALARS,
    TINY,
    dpo_batch,
    mesh_of,
    pairs,
    setup,
    sft_batch,
    single_mesh,
)

from coevo_jax import sharding
from coevo_jax.data.batching import collate_dpo
from coevo_jax.models import abstract_model
from coevo_jax.train.state import init_train_state


def test_eight_fake_devices():
    assert jax.device_count() == 8


def test_mesh_config_fills_the_free_axis_and_rejects_misfits():
    cfg = sharding.MeshConfig.from_mapping(ml_collections.ConfigDict({"axes": [["data", -1], ["fsdp", 2]]}))
    assert cfg.shape(8) == (4, 2)
    assert dict(sharding.make_mesh(cfg).shape) == {"data": 4, "fsdp": 2}
    with pytest.raises(ValueError, match="do not fit 8 devices"):
        sharding.MeshConfig(axes=(("data", 3), ("fsdp", -1))).shape(8)
    with pytest.raises(ValueError, match="at most one"):
        sharding.MeshConfig(axes=(("data", -1), ("fsdp", -1)))


def test_a_process_mesh_folds_the_storage_axes_and_keeps_tensor_parallelism():
    rules = sharding.ShardingRules()
    local = lambda axes: sharding.process_mesh_config(sharding.MeshConfig(axes=axes), rules).axes
    assert local((("data", -1), ("fsdp", 1), ("tensor", 1))) == (("data", -1), ("fsdp", 1), ("tensor", 1))
    assert local((("data", 1), ("fsdp", 8), ("tensor", 2))) == (("data", -1), ("fsdp", 1), ("tensor", 2))
    assert local((("data", 1), ("fsdp", 1), ("tensor", -1))) == (("data", 1), ("fsdp", 1), ("tensor", -1))
    # one process: its rows are the whole batch
    batch = sharding.device_layout(sft_batch(0, rows=16))
    rows = sharding.process_rows(batch, mesh_of(MESHES["data2_fsdp4"]), rules)
    assert all(np.array_equal(rows[k], batch[k]) for k in batch)


def test_default_rules_shard_weights_fsdp_and_tensor():
    mesh = mesh_of(MESHES["cube2"])
    _, abstract = abstract_model(TINY)
    specs = jax.tree.map(lambda s: s.spec, sharding.param_shardings(abstract, mesh, sharding.ShardingRules()))
    assert specs["embed"] == P("tensor", "fsdp")
    assert specs["lm_head"] == P("fsdp", "tensor")
    assert specs["layers"]["attn"]["q_kernel"] == P(None, "fsdp", "tensor", None)  # [L, D, H, E]
    assert specs["layers"]["attn"]["o_kernel"] == P(None, "tensor", None, "fsdp")
    assert specs["layers"]["mlp"]["down_kernel"] == P(None, "tensor", "fsdp")
    assert specs["final_norm"]["scale"] == P(None)


def test_indivisible_dimension_is_an_error_naming_the_parameter():
    mesh = mesh_of((("data", 1), ("fsdp", 1), ("tensor", 8)))  # 2 kv heads cannot split 8 ways
    _, abstract = abstract_model(TINY)
    with pytest.raises(ValueError, match=r"layers/attn/k_kernel.*kv_heads=2"):
        sharding.param_shardings(abstract, mesh, sharding.ShardingRules())


def _bytes_on_device(tree, device) -> int:
    return sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves(tree)
        for shard in leaf.addressable_shards
        if shard.device == device
    )


def test_fsdp_shrinks_per_device_state_bytes():
    mesh = mesh_of((("data", 1), ("fsdp", 8), ("tensor", 1)))
    _, shardings, _, tx, _ = setup(mesh)
    state = init_train_state(TINY, tx, shardings, jax.random.key(0))
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    per_device = [_bytes_on_device(state, d) for d in jax.devices()]
    # Only norm scales and scalars stay replicated: well under 1/8 + 5% of the whole state per device.
    assert max(per_device) < total * (1 / 8 + 0.05)
    assert max(per_device) > total / 8 * 0.99


def test_dpo_layout_keeps_whole_pairs_in_every_micro_batch_and_shard():
    """collate_dpo's rows 2p, 2p + 1 are pair p; micro-batches and data shards slice whole pairs from it."""
    real = pairs(0, 8)
    batch = collate_dpo(real, length=32, pairs_per_batch=8, pad_id=PAD)
    layout = sharding.device_layout(batch, num_microbatches=2)
    assert layout["input_ids"].shape == (2, 8, 32) and layout["pair_mask"].shape == (2, 4)
    for k in range(2):  # micro-batch k holds pairs 4k .. 4k + 3, each chosen row followed by its rejected row
        for j, pair in enumerate(real[4 * k : 4 * k + 4]):
            for row, side in ((2 * j, pair.chosen), (2 * j + 1, pair.rejected)):
                np.testing.assert_array_equal(layout["input_ids"][k, row, : len(side)], side.input_ids)
            assert layout["lambda_dpo"][k, j] == pair.lambda_dpo
    placed = sharding.place_batch(layout, mesh_of(MESHES["cube2"]), sharding.ShardingRules())
    rows_by_device = {s.device: s.index[1] for s in placed["input_ids"].addressable_shards}
    for shard in placed["lambda_dpo"].addressable_shards:  # 4 row shards (data x fsdp) of one pair each
        pair_rows = shard.index[1]
        assert pair_rows.stop - pair_rows.start == 1
        assert rows_by_device[shard.device] == slice(2 * pair_rows.start, 2 * pair_rows.stop)
    with pytest.raises(ValueError, match="3 rows do not split into 2 micro-batches"):
        sharding.device_layout(dpo_batch(0, pairs_per_batch=3), num_microbatches=2)


def test_sft_layout_and_placement_shard_rows():
    mesh = mesh_of(MESHES["data2_fsdp4"])
    rules = sharding.ShardingRules()
    placed = sharding.place_batch(sharding.device_layout(sft_batch(0, rows=16), 2), mesh, rules)
    assert placed["input_ids"].shape == (2, 8, 32)
    assert placed["input_ids"].sharding.spec == P(None, ("data", "fsdp"), None)
    assert placed["input_ids"].addressable_shards[0].data.shape == (2, 1, 32)
    with pytest.raises(ValueError, match="do not divide the 8 shards"):
        sharding.place_batch(sharding.device_layout(sft_batch(0, rows=8), 2), mesh, rules)


def test_distributed_initialisation_only_when_asked():
    assert sharding.maybe_initialize_distributed({}) is False
    assert sharding.maybe_initialize_distributed({sharding.DISTRIBUTED_ENV: "0"}) is False


def test_weights_are_gathered_over_storage_axes_for_compute():
    mesh = mesh_of(MESHES["cube2"])
    rules = sharding.ShardingRules.from_mapping(ml_collections.ConfigDict({"storage_axes": ["fsdp"]}))
    _, abstract = abstract_model(TINY)
    compute = sharding.compute_shardings(sharding.param_shardings(abstract, mesh, rules), rules)
    assert compute["embed"].spec == P("tensor", None)
    assert compute["layers"]["attn"]["o_kernel"].spec == P(None, "tensor", None, None)
    assert rules.params == sharding.DEFAULT_PARAM_RULES


@pytest.mark.slow  # 10 s: compiles an FSDP step on 8 devices; the quick loop stays under 5 min
def test_compiled_fsdp_step_holds_about_an_eighth_of_the_state_per_device():
    """The compiled SFT step's per-device argument bytes (XLA's memory analysis) shrink ~1/8 under FSDP=8."""

    def step_argument_bytes(mesh):
        _, shardings, steps, tx, rules = setup(mesh)
        state = init_train_state(TINY, tx, shardings, jax.random.key(0))
        batch = sharding.place_batch(sharding.device_layout(sft_batch(0)), mesh, rules)
        compiled = steps.sft.lower(state, batch, SCALARS).compile()
        return compiled.memory_analysis().argument_size_in_bytes

    single = step_argument_bytes(single_mesh())
    fsdp = step_argument_bytes(mesh_of((("data", 1), ("fsdp", 8), ("tensor", 1))))
    assert single / 8 * 0.99 < fsdp < single * (1 / 8 + 0.05), (single, fsdp)


@pytest.mark.slow  # compiles an FSDP step on 8 devices
def test_fsdp_gathers_one_layer_at_a_time():
    """Inside the scan over the stacked layers each step all-gathers its own layer's weights: the compiled
    FSDP step gathers [D, H, E] query kernels, never the stacked [L, D, H, E] one."""
    mesh = mesh_of((("data", 1), ("fsdp", 8), ("tensor", 1)))
    _, shardings, steps, tx, rules = setup(mesh)
    state = init_train_state(TINY, tx, shardings, jax.random.key(0))
    assert state.params["layers"]["attn"]["q_kernel"].sharding.spec == P(None, "fsdp", "tensor", None)
    batch = sharding.place_batch(sharding.device_layout(sft_batch(0)), mesh, rules)
    hlo = steps.sft.lower(state, batch, SCALARS).compile().as_text()
    gathers = [line for line in hlo.splitlines() if " all-gather(" in line or "all-gather-start(" in line]
    d, h, e = TINY.hidden_size, TINY.num_heads, TINY.head_dim
    layer = re.compile(rf"= f32\[(1,)?{d},{h},{e}\]")  # one layer's slice, before or after the squeeze
    stacked = f"f32[{TINY.num_layers},{d},{h},{e}]"
    assert any(layer.search(line) and "while/body" in line for line in gathers), gathers
    assert not any(stacked in line for line in gathers), gathers
