"""LoRA train steps and checkpoints: only the adapters train (no gradient, no optimizer state, no change for
the base) in every step kind, sharded == single device, dropout only in training, and checkpoints record
the base they belong to and resume on another mesh. Tiny model, float32, 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from train_fixtures import (
    MESHES,
    OBJ,
    OPT,
    SCALARS,
    TINY,
    dpo_batch,
    mesh_of,
    optimizer,
    placed,
    sft_batch,
    single_mesh,
    to_numpy,
)

from coevo_jax import checkpoints, sharding
from coevo_jax.models import abstract_model, combine_trainable, partition_trainable
from coevo_jax.train import StepKind, build_steps
from coevo_jax.train.state import (
    abstract_state,
    init_params,
    policy_shardings,
    state_shardings,
    train_state_from_params,
)

LORA_TINY = TINY.replace(lora_rank=4, lora_alpha=8.0)
GRAD_TOL = dict(rtol=1e-5, atol=1e-6)
PARAM_TOL = dict(rtol=1e-5, atol=2e-5)  # as tests/test_train_steps.py: Adam's first step near |g| ~ eps


class Policy:
    """Steps, shardings and the initial base + adapters of a LoRA policy on one mesh."""

    def __init__(self, mesh, cfg=LORA_TINY):
        self.mesh, self.cfg, self.rules, self.tx = mesh, cfg, sharding.ShardingRules(), optimizer(OPT)
        self.shardings = state_shardings(cfg, self.tx, mesh, self.rules)
        self.param_shardings = policy_shardings(cfg, mesh, self.rules)
        self.steps = build_steps(
            abstract_model(cfg)[0],
            self.tx,
            self.shardings,
            mesh,
            self.rules,
            OBJ,
            param_shardings=self.param_shardings,
            return_grads=True,
        )
        adapters, self.base = partition_trainable(
            init_params(cfg, self.param_shardings, jax.random.key(0)), cfg
        )
        self._adapters = to_numpy(adapters)

    def fresh_state(self):
        adapters = jax.device_put(self._adapters, self.shardings.params)
        return train_state_from_params(adapters, self.tx, self.shardings)

    def batch(self, raw: dict, num_microbatches: int = 1) -> dict:
        return placed(raw, self.mesh, self.rules, num_microbatches)

    def with_reference(self, state, batch: dict) -> dict:
        chosen, rejected = self.steps.reference(combine_trainable(state.params, self.base), batch)
        return {**batch, "ref_chosen_logps": chosen, "ref_rejected_logps": rejected}

    def run_all(self, num_microbatches: int = 1) -> dict:
        """Adapters and metrics after one SFT step, and after SFT then one coevo / one DPO step."""
        out = {}
        sft_b = self.batch(sft_batch(0, rows=16, real=13), num_microbatches)
        state, metrics = self.steps.sft(self.fresh_state(), sft_b, SCALARS, self.base)
        out[StepKind.SFT] = to_numpy((state.params, metrics))
        for kind in (StepKind.COEVO, StepKind.DPO):
            state = self.fresh_state()
            dpo_b = self.with_reference(state, self.batch(dpo_batch(1, real=7), num_microbatches))
            state, _ = self.steps.sft(state, sft_b, SCALARS, self.base)  # move away from the reference first
            state, metrics = self.steps.step(kind)(state, dpo_b, SCALARS, self.base)
            out[kind] = to_numpy((state.params, metrics))
        return out


@pytest.fixture(scope="module")
def single():
    return Policy(single_mesh())


@pytest.fixture(scope="module")
def single_results(single):
    return single.run_all()


@pytest.fixture(scope="module")
def cube():
    return Policy(mesh_of(MESHES["cube2"]))  # data x fsdp x tensor: every axis of the rules in use


def _sizes(tree) -> list:
    return sorted((np.shape(x), np.asarray(x).dtype.name) for x in jax.tree.leaves(tree))


def test_only_the_adapters_train_and_hold_optimizer_state(single, single_results):
    base_before = to_numpy(single.base)
    adapters = single.fresh_state().params
    names = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(adapters)]
    assert len(names) == 2 * 7 and all("_lora']['" in name for name in names)  # A, B per target, stacked
    for kind, (params, metrics) in single_results.items():
        # Gradients and updates exist for the adapters only; every adapter matrix moved.
        assert jax.tree.structure(metrics["grads"]) == jax.tree.structure(adapters), kind
        assert jax.tree.structure(params) == jax.tree.structure(adapters), kind
        if kind is not StepKind.SFT:  # B starts at 0, so A's first gradient is 0: both move by step 2
            moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), params, single._adapters)
            assert min(jax.tree.leaves(moved)) > 0, kind
    # The base took part in every step (it is an argument, never donated) and is bit for bit unchanged.
    jax.tree.map(np.testing.assert_array_equal, to_numpy(single.base), base_before)
    # AdamW moments exist for the adapters alone: two per adapter matrix, plus scalar counts.
    state = single.fresh_state()
    moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
    assert _sizes(moments) == sorted(_sizes(adapters) * 2)
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(adapters))
    base_bytes = sum(x.nbytes for x in jax.tree.leaves(single.base))
    assert sum(x.nbytes for x in moments) == 2 * adapter_bytes
    assert adapter_bytes < 0.1 * base_bytes  # rank 4 on width 64: the adapters are 7.7% of the base


def test_a_lora_step_needs_its_base(single):
    state = single.fresh_state()
    with pytest.raises(ValueError, match="must be the LoRA base"):
        single.steps.sft(state, single.batch(sft_batch(0, rows=16)), SCALARS)


@pytest.mark.slow  # 10-20 s, as test_train_steps.py's sharded cases: the quick loop stays under 5 min
def test_sharded_lora_steps_match_the_single_device_steps(cube, single_results):
    for kind, (params, metrics) in cube.run_all().items():
        expected_params, expected_metrics = single_results[kind]
        np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-5, err_msg=kind.value)
        jax.tree.map(
            lambda a, e: np.testing.assert_allclose(a, e, **GRAD_TOL),
            metrics["grads"],
            expected_metrics["grads"],
        )
        jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, **PARAM_TOL), params, expected_params)


def test_micro_batches_accumulate_to_the_full_batch_update(single, single_results):
    for kind, (params, metrics) in single.run_all(num_microbatches=2).items():
        expected_params, expected_metrics = single_results[kind]
        np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-5, err_msg=kind.value)
        jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, **PARAM_TOL), params, expected_params)


def test_dropout_changes_training_steps_only_and_replays_by_step(single, single_results):
    dropout = Policy(single_mesh(), LORA_TINY.replace(lora_dropout=0.3))
    sft_b = dropout.batch(sft_batch(0, rows=16, real=13))
    rng = np.random.RandomState(0)  # adapters that matter (fresh ones have B = 0: nothing to drop)
    random = jax.tree.map(lambda x: (0.1 * rng.standard_normal(x.shape)).astype(x.dtype), dropout._adapters)
    state = train_state_from_params(
        jax.device_put(random, dropout.shardings.params), dropout.tx, dropout.shardings
    )
    again = jax.tree.map(jnp.copy, state)
    # The reference pass (and so sampling and evaluation, which never pass a key) ignores the rate.
    dpo_b = dropout.batch(dpo_batch(1, real=7))
    with_rate = dropout.steps.reference(combine_trainable(state.params, dropout.base), dpo_b)
    without = single.steps.reference(combine_trainable(state.params, single.base), dpo_b)
    jax.tree.map(np.testing.assert_array_equal, to_numpy(with_rate), to_numpy(without))
    # A train step draws masks: its loss differs from the deterministic one ...
    _, metrics = dropout.steps.sft(state, sft_b, SCALARS, dropout.base)
    _, plain = single.steps.sft(jax.tree.map(jnp.copy, again), sft_b, SCALARS, single.base)
    assert abs(float(metrics["loss"]) - float(plain["loss"])) > 1e-3
    # ... and the masks depend on the update count only, so a resumed step replays them exactly.
    _, replayed = dropout.steps.sft(again, sft_b, SCALARS, dropout.base)
    assert float(replayed["loss"]) == float(metrics["loss"])


def test_base_fingerprint_names_the_values_not_the_mesh(single, cube):
    fingerprint = checkpoints.base_fingerprint(LORA_TINY, single.base)
    assert checkpoints.base_fingerprint(LORA_TINY, cube.base) == fingerprint
    assert (
        checkpoints.base_fingerprint(LORA_TINY.replace(lora_rank=8, lora_dropout=0.1), single.base)
        == fingerprint
    )
    changed = jax.tree.map(np.array, to_numpy(single.base))  # writable copies
    changed["final_norm"]["scale"][0] += 1.0  # the first element is among the sampled ones
    assert checkpoints.base_fingerprint(LORA_TINY, changed) != fingerprint
    assert checkpoints.base_fingerprint(LORA_TINY.replace(rms_norm_eps=1e-5), single.base) != fingerprint


@pytest.mark.slow  # 10-20 s, as test_checkpoints.py's resume on another mesh
def test_adapter_checkpoint_resumes_on_another_mesh_and_refuses_another_base(single, cube, tmp_path):
    batches = [sft_batch(seed, rows=16) for seed in range(3)]
    fingerprint = checkpoints.base_fingerprint(LORA_TINY, single.base)

    state = single.fresh_state()
    for batch in batches[:2]:
        state, _ = single.steps.sft(state, single.batch(batch), SCALARS, single.base)
    manager = checkpoints.make_manager(tmp_path / "ckpt")
    position = checkpoints.LoopPosition(epoch=0, phase="train/sft_target", step=2)
    checkpoints.save(manager, 2, state, position, base=fingerprint)
    manager.wait_until_finished()
    saved = to_numpy(state)
    uninterrupted, metrics_a = single.steps.sft(state, single.batch(batches[2]), SCALARS, single.base)

    manager = checkpoints.make_manager(tmp_path / "ckpt")
    target = abstract_state(LORA_TINY, cube.tx, cube.shardings)
    assert jax.tree.structure(target.params) == jax.tree.structure(saved.params)  # adapters only
    with pytest.raises(checkpoints.BaseMismatchError, match="saved for LoRA base"):
        checkpoints.restore(manager, target, base="0123456789abcdef")
    with pytest.raises(checkpoints.BaseMismatchError, match="onto base None"):
        checkpoints.restore(manager, target)
    restored, restored_position = checkpoints.restore(
        manager, target, base=checkpoints.base_fingerprint(LORA_TINY, cube.base)
    )
    assert restored_position == position
    jax.tree.map(np.testing.assert_array_equal, to_numpy(restored), saved)
    resumed, metrics_b = cube.steps.sft(restored, cube.batch(batches[2]), SCALARS, cube.base)
    np.testing.assert_allclose(metrics_b["loss"], metrics_a["loss"], rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
        to_numpy(resumed.params),
        to_numpy(uninterrupted.params),
    )
    assert int(resumed.step) == 3
