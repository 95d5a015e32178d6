"""Mid-phase Orbax checkpoints restored onto another mesh, and Hugging Face export / sharded load."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from train_fixtures import MESHES, SCALARS, TINY, fresh_state, mesh_of, placed, setup, sft_batch, to_numpy

from coevo_jax import checkpoints
from coevo_jax.checkpoint_formats import load_pretrained
from coevo_jax.train.state import abstract_state, load_sharded, train_state_from_params


@pytest.mark.slow  # 14 s: two meshes, two runs
def test_resume_on_another_mesh_equals_the_uninterrupted_run(tmp_path):
    mesh_a, mesh_b = mesh_of(MESHES["data2_fsdp4"]), mesh_of(MESHES["fsdp4_tensor2"])
    _, shardings_a, steps_a, tx, rules = setup(mesh_a)
    _, shardings_b, steps_b, _, _ = setup(mesh_b)
    batches = [sft_batch(seed, rows=16) for seed in range(3)]

    state = fresh_state(shardings_a)
    for batch in batches[:2]:
        state, _ = steps_a.sft(state, placed(batch, mesh_a, rules), SCALARS)
    manager = checkpoints.make_manager(tmp_path / "ckpt")
    position = checkpoints.LoopPosition(epoch=1, phase="train/coevo_it1_target", step=2)
    checkpoints.save(manager, 2, state, position)
    manager.wait_until_finished()
    saved = to_numpy(state)

    uninterrupted, metrics_a = steps_a.sft(state, placed(batches[2], mesh_a, rules), SCALARS)

    target = abstract_state(TINY, tx, shardings_b)
    restored, restored_position = checkpoints.restore(checkpoints.make_manager(tmp_path / "ckpt"), target)
    assert restored_position == position
    assert restored.params["embed"].sharding == shardings_b.params["embed"]
    # Parameters, optimizer state and step, bit for bit.
    jax.tree.map(np.testing.assert_array_equal, to_numpy(restored), saved)

    resumed, metrics_b = steps_b.sft(restored, placed(batches[2], mesh_b, rules), SCALARS)
    np.testing.assert_allclose(metrics_b["loss"], metrics_a["loss"], rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
        to_numpy(resumed.params),
        to_numpy(uninterrupted.params),
    )
    assert int(resumed.step) == 3


def test_restore_without_checkpoint_is_an_error(tmp_path):
    _, shardings, _, tx, _ = setup(mesh_of(MESHES["data8"]))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoints.restore(checkpoints.make_manager(tmp_path / "empty"), abstract_state(TINY, tx, shardings))


def test_a_checkpoint_without_the_stacked_layout_is_refused_naming_it(tmp_path):
    """A checkpoint written before the layers were stacked has no layout in its metadata: refused by name."""
    import orbax.checkpoint as ocp

    from coevo_jax.experiment.store import RunStore

    _, shardings, _, tx, _ = setup(mesh_of(MESHES["data8"]))
    state = fresh_state(shardings)
    manager = checkpoints.make_manager(tmp_path / "ckpt")
    position = checkpoints.LoopPosition(epoch=0, phase="train/sft_target", step=1)
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state), position=ocp.args.JsonSave(position.to_json())
    )
    manager.save(1, args=args)  # as before the layout was recorded: no custom metadata
    manager.wait_until_finished()
    target = abstract_state(TINY, tx, shardings)
    with pytest.raises(checkpoints.LayoutMismatchError, match=f"{tmp_path / 'ckpt'}/1: .*'layers/0/"):
        checkpoints.restore(checkpoints.make_manager(tmp_path / "ckpt"), target)

    store = RunStore(tmp_path / "run")
    path = store.policy_dir("sft_target")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state.params)  # an old-layout policy: no custom metadata
    checkpointer.wait_until_finished()
    with pytest.raises(checkpoints.LayoutMismatchError, match="sft_target"):
        store.load_policy("sft_target", target.params)
    store.save_policy("sft_target_new", state.params)
    jax.tree.map(
        np.testing.assert_array_equal,
        to_numpy(store.load_policy("sft_target_new", target.params)),
        to_numpy(state.params),
    )
    store.close()


def test_export_then_load_gives_the_same_logits_and_sharded_load_follows_the_rules(tmp_path):
    mesh = mesh_of(MESHES["cube2"])
    graphdef, shardings, _, tx, rules = setup(mesh)
    params = fresh_state(shardings).params
    checkpoints.export_policy(graphdef, params, tmp_path / "hf")
    ids = jnp.asarray(np.random.RandomState(0).randint(1, TINY.vocab_size, size=(2, 12)), jnp.int32)
    mask = jnp.ones_like(ids)
    expected = np.asarray(nnx.merge(graphdef, to_numpy(params))(ids, mask))

    loaded, _ = load_pretrained(tmp_path / "hf")
    np.testing.assert_allclose(np.asarray(loaded(ids, mask)), expected, atol=1e-6)

    cfg, graphdef2, sharded_params, _ = load_sharded(str(tmp_path / "hf"), mesh, rules)
    assert (cfg.hidden_size, cfg.num_layers, cfg.vocab_size) == (
        TINY.hidden_size,
        TINY.num_layers,
        TINY.vocab_size,
    )
    expected_shardings = dict(jax.tree_util.tree_leaves_with_path(shardings.params))
    for path, value in jax.tree_util.tree_leaves_with_path(sharded_params):
        assert value.sharding == expected_shardings[path], path
    state = train_state_from_params(sharded_params, tx, shardings)
    np.testing.assert_allclose(
        np.asarray(nnx.merge(graphdef2, to_numpy(state.params))(ids, mask)), expected, atol=1e-6
    )
    bf16_dir = tmp_path / "hf_bf16"
    checkpoints.export_policy(graphdef, params, bf16_dir, dtype="bfloat16")
    loaded_bf16, _ = load_pretrained(bf16_dir)
    assert loaded_bf16.embed.get_value().dtype == jnp.float32  # loads to float32 by default
    np.testing.assert_allclose(np.asarray(loaded_bf16(ids, mask)), expected, atol=0.05)


def test_loop_position_json_round_trip():
    position = checkpoints.LoopPosition(epoch=3, phase="train/coevo_it2_failure", step=17)
    assert checkpoints.LoopPosition.from_json(position.to_json()) == position
    # A checkpoint written before the rename stored the epoch as "iteration".
    old = {"iteration": 3, "phase": "train/coevo_it2_failure", "step": 17}
    assert checkpoints.LoopPosition.from_json(old) == position
