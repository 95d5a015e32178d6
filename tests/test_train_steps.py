"""Train steps: sharded == single device, exact gradient accumulation, one compile per bucket, learning.

All on the tiny model and 8 fake CPU devices, float32 throughout.
"""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from seeds import fresh_seed
from train_fixtures import (
    MESHES,
    OBJ,
    OPT,
    SCALARS,
    TINY,
    dpo_batch,
    fresh_state,
    mesh_of,
    placed,
    setup,
    sft_batch,
    single_mesh,
    to_numpy,
    with_reference,
)

from coevo_jax.models import abstract_model
from coevo_jax.train import OptimizerConfig, StepKind, phase_scalars
from coevo_jax.train.objectives import coevo_objective, dpo_objective
from coevo_jax.train.state import TrainState
from coevo_jax.train.steps import accumulate_gradients, pair_normaliser

GRAD_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_SCALE_TOL = 2e-5  # of the step's largest gradient
# Adam's first update is lr * g / (|g| + eps): for |g| near eps = 1e-8, float32 round-off in the gradient
# (which GRAD_TOL checks directly) moves a parameter by up to ~lr * 1e-2 = 1e-5 (1.1e-5 seen with the
# block-wise attention on fsdp4_tensor2), hence an absolute tolerance of 2e-5 on updated parameters.
PARAM_TOL = dict(rtol=1e-5, atol=2e-5)
# The fast set checks the mesh that uses all three axes; the others run with the slow marker.
MESH_CASES = [pytest.param(name, marks=pytest.mark.slow) for name in MESHES]  # 10-20 s each


def _assert_trees_close(actual, expected, **tol):
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, **tol), actual, expected)


def _assert_same_update(results, expected_results):
    for kind, (params, metrics) in results.items():
        expected_params, expected_metrics = expected_results[kind]
        np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-5, err_msg=kind.value)
        # float32 sums of differently sharded partial products: the error scales with the largest gradient
        # (eq. 9's sequence-sum SFT term makes the coevo step's ~100x the others')
        scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(expected_metrics["grads"]))
        tol = {**GRAD_TOL, "atol": max(GRAD_TOL["atol"], GRAD_SCALE_TOL * scale)}
        _assert_trees_close(metrics["grads"], expected_metrics["grads"], **tol, err_msg=kind.value)
        _assert_trees_close(params, expected_params, **PARAM_TOL, err_msg=kind.value)


def _run_all(mesh, steps, shardings, rules, num_microbatches=1, kinds=(StepKind.COEVO, StepKind.DPO)):
    """Params and metrics after one SFT step (eq. 3/5), then one coevo (eq. 9) and one DPO (eq. 7) step."""
    out = {}
    sft_b = placed(sft_batch(0, rows=16, real=13), mesh, rules, num_microbatches)
    state, metrics = steps.sft(fresh_state(shardings), sft_b, SCALARS)
    out[StepKind.SFT] = to_numpy((state.params, metrics))
    for kind in kinds:
        state = fresh_state(shardings)
        dpo_b = with_reference(steps, state, placed(dpo_batch(1, real=7), mesh, rules, num_microbatches))
        # Move the policy away from its reference first, so DPO gradients are not at their symmetric point.
        state, _ = steps.sft(state, sft_b, SCALARS)
        state, metrics = steps.step(kind)(state, dpo_b, SCALARS)
        out[kind] = to_numpy((state.params, metrics))
    return out


@pytest.fixture(scope="module")
def single():
    """Single-device steps shared by the tests of this module (so compiled programs are reused)."""
    mesh = single_mesh()
    _, shardings, steps, _, rules = setup(mesh, return_grads=True)
    return mesh, shardings, steps, rules


@pytest.fixture(scope="module")
def single_device_results(single):
    mesh, shardings, steps, rules = single
    return _run_all(mesh, steps, shardings, rules)


@pytest.mark.parametrize("mesh_name", MESH_CASES)
def test_sharded_steps_match_single_device(mesh_name, single_device_results):
    mesh = mesh_of(MESHES[mesh_name])
    _, shardings, steps, _, rules = setup(mesh, return_grads=True)
    _assert_same_update(_run_all(mesh, steps, shardings, rules), single_device_results)


def test_micro_batches_accumulate_to_the_full_batch_update(single, single_device_results):
    mesh, shardings, steps, rules = single
    accumulated = _run_all(mesh, steps, shardings, rules, num_microbatches=2, kinds=(StepKind.COEVO,))
    _assert_same_update(accumulated, single_device_results)


def test_metrics_are_device_scalars(single_device_results):
    _, metrics = single_device_results[StepKind.COEVO]
    for name in ("loss", "reward_accuracy", "reward_margin", "chosen_logps", "rejected_logps", "grad_norm"):
        assert np.shape(metrics[name]) == ()
    assert metrics["learning_rate"] == pytest.approx(OPT.learning_rate)
    assert metrics["pairs"] == 7 and metrics["tokens"] > 0


def test_sft_lowers_the_loss_with_one_compile_per_bucket():
    mesh = single_mesh()
    opt = OptimizerConfig(learning_rate=3e-3)
    _, shardings, steps, _, rules = setup(mesh, opt=opt)
    batches = [placed(sft_batch(seed, length=length), mesh, rules) for seed, length in ((0, 16), (1, 32))]
    state = fresh_state(shardings)
    losses = []
    for _ in range(6):
        for batch in batches:
            state, metrics = steps.sft(state, batch, phase_scalars(opt, beta=0.0))
            losses.append(float(metrics["loss"]))
    assert steps.sft.compilations == 2
    assert losses[-1] < losses[1] - 0.5 and losses[-2] < losses[0] - 0.5


def test_dpo_raises_reward_accuracy_and_leaves_the_reference_alone(single):
    mesh, shardings, steps, rules = single
    state = fresh_state(shardings)
    initial_params = to_numpy(state.params)
    batch = with_reference(steps, state, placed(dpo_batch(3, real=7), mesh, rules))
    cached = to_numpy((batch["ref_chosen_logps"], batch["ref_rejected_logps"]))
    accuracies = []
    for _ in range(8):
        state, metrics = steps.dpo(state, batch, SCALARS)
        accuracies.append(float(metrics["reward_accuracy"]))
    assert accuracies[0] == 0.0 and accuracies[-1] == 1.0 and float(metrics["reward_margin"]) > 0
    # The policy moved; the cached reference log-probs did not, and they still are the initial policy's.
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).max(), state.params, initial_params)
    assert min(jax.tree.leaves(moved)) > 0
    _assert_trees_close(
        to_numpy((batch["ref_chosen_logps"], batch["ref_rejected_logps"])), cached, rtol=0, atol=0
    )
    recomputed = steps.reference(jax.device_put(initial_params, shardings.params), batch)
    _assert_trees_close(to_numpy(recomputed), cached)


def test_coevo_step_with_failure_weights_is_plain_dpo(single):
    """Eq. 9 with (lambda_dpo, lambda_sft) = (1, 0) on every pair is eq. 7."""
    mesh, shardings, steps, rules = single
    raw = dpo_batch(1, real=7)
    raw["lambda_dpo"], raw["lambda_sft"] = raw["pair_mask"].copy(), 0.0 * raw["pair_mask"]
    batch = with_reference(steps, fresh_state(shardings), placed(raw, mesh, rules))
    coevo_state, coevo_metrics = steps.coevo(fresh_state(shardings), batch, SCALARS)
    dpo_state, dpo_metrics = steps.dpo(fresh_state(shardings), batch, SCALARS)
    np.testing.assert_allclose(coevo_metrics["loss"], dpo_metrics["loss"], rtol=1e-6)
    _assert_trees_close(to_numpy(coevo_state.params), to_numpy(dpo_state.params), **PARAM_TOL)


def test_remat_gives_the_same_update(single_device_results):
    mesh = single_mesh()
    remat_cfg = TINY.replace(dtype="float32", remat=True)
    _, shardings, steps, _, rules = setup(mesh, model_cfg=remat_cfg, return_grads=True)
    _assert_same_update(_run_all(mesh, steps, shardings, rules, kinds=()), single_device_results)


def test_logits_recomputed_chunk_by_chunk_give_the_same_update_on_a_sharded_mesh(single_device_results):
    """`keep_logits=False`, the path of batches above `chunked_logprobs.KEEP_LOGITS_MAX_BYTES`: the log-probs
    run in chunks of 16 positions and the backward recomputes each chunk's logits, here under cube2's sharding;
    the update is the single-device one with the (small) logits kept in one chunk."""
    mesh = mesh_of(MESHES["cube2"])
    _, shardings, steps, _, rules = setup(
        mesh, obj=dataclasses.replace(OBJ, keep_logits=False), return_grads=True
    )
    _assert_same_update(_run_all(mesh, steps, shardings, rules), single_device_results)


def test_fused_attention_dispatch_gives_the_same_update_on_a_sharded_mesh(monkeypatch, single_device_results):
    """`attention='cudnn'` (XLA's implementation standing in for cuDNN on the CPU) under cube2's sharding:
    the right-padded batches take the fused branch of its `lax.cond`, and the update is the block-wise one."""
    from coevo_jax.models import blocks
    from coevo_jax.models.fused_attention import prefix_lengths

    for batch in (sft_batch(0, rows=16, real=13), dpo_batch(1, real=7)):  # `_run_all`'s: all right-padded
        assert bool(
            prefix_lengths(
                np.asarray(batch["attention_mask"]).reshape(-1, batch["attention_mask"].shape[-1])
            )[1]
        )
    monkeypatch.setattr(blocks, "_FUSED_IMPLEMENTATION", "xla")
    mesh = mesh_of(MESHES["cube2"])
    fused_cfg = TINY.replace(dtype="float32", attention="cudnn")
    _, shardings, steps, _, rules = setup(mesh, model_cfg=fused_cfg, return_grads=True)
    _assert_same_update(_run_all(mesh, steps, shardings, rules), single_device_results)


def test_reference_log_probs_with_remat_equal_those_without(single):
    """The reference pass of a remat policy (the SmolLM2 and paper configs) runs and changes nothing."""
    mesh, shardings, steps, rules = single
    _, remat_shardings, remat_steps, _, _ = setup(mesh, model_cfg=TINY.replace(remat=True))
    batch = placed(dpo_batch(1, real=7), mesh, rules)
    expected = to_numpy(steps.reference(fresh_state(shardings).params, batch))
    _assert_trees_close(to_numpy(remat_steps.reference(fresh_state(remat_shardings).params, batch)), expected)


def test_bfloat16_compute_keeps_float32_master_weights(single_device_results):
    mesh = single_mesh()
    mixed = TINY.replace(dtype="bfloat16", param_dtype="float32")
    _, shardings, steps, _, rules = setup(mesh, model_cfg=mixed)
    state, metrics = steps.sft(
        fresh_state(shardings, model_cfg=mixed),
        placed(sft_batch(0, rows=16, real=13), mesh, rules),
        SCALARS,
    )
    dtypes = {leaf.dtype for leaf in jax.tree.leaves((state.params, state.opt_state))}
    assert dtypes <= {np.dtype("float32"), np.dtype("int32")}
    np.testing.assert_allclose(metrics["loss"], single_device_results[StepKind.SFT][1]["loss"], rtol=2e-2)


def _baked_step(opt: OptimizerConfig, beta: float, objective):
    """A DPO-type step with `beta` and `opt`'s optax schedule as constants of the program, built as the steps
    were before one compiled step served every phase (one program per phase's lr, schedule and beta)."""
    peak, warmup = opt.learning_rate, opt.warmup_steps
    schedule = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, opt.total_steps, end_value=0.0)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    tx = optax.chain(
        optax.clip_by_global_norm(opt.grad_clip_norm),
        optax.adamw(schedule, weight_decay=opt.weight_decay, mask=decay_mask),
    )
    graphdef = abstract_model(TINY)[0]

    def step(state, batch):
        loss, grads, _ = accumulate_gradients(
            objective, pair_normaliser, graphdef, state.params, batch, OBJ, beta
        )
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss

    return jax.jit(step)


@pytest.mark.parametrize("kind", [StepKind.DPO, StepKind.COEVO])
def test_traced_beta_and_schedule_give_the_update_of_a_step_with_them_baked_in(single, kind):
    """Five updates of the shared compiled step (beta and a warmup + cosine schedule as traced arguments)
    equal those of a step compiled with them as constants, on random pairs with a random beta and lr."""
    mesh, shardings, steps, rules = single
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    beta, peak = float(rng.uniform(0.05, 1.0)), float(rng.uniform(1e-4, 3e-3))
    opt = OptimizerConfig(
        learning_rate=peak, schedule="cosine", warmup_steps=2, total_steps=5, weight_decay=OPT.weight_decay
    )
    objective = {StepKind.DPO: dpo_objective, StepKind.COEVO: coevo_objective}[kind]
    baked = _baked_step(opt, beta, objective)
    state = fresh_state(shardings)
    expected = jax.device_put(to_numpy(state), shardings)  # the shared step donates `state`
    batches = [
        with_reference(steps, state, placed(dpo_batch(int(rng.integers(2**31)), real=7), mesh, rules))
        for _ in range(2)
    ]
    for update in range(5):
        batch = batches[update % 2]
        state, metrics = steps.step(kind)(state, batch, phase_scalars(opt, beta))
        expected, expected_loss = baked(expected, batch)
        np.testing.assert_allclose(metrics["loss"], expected_loss, rtol=1e-6)
        _assert_trees_close(to_numpy(state.params), to_numpy(expected.params), rtol=1e-6, atol=1e-9)
    assert float(metrics["learning_rate"]) == pytest.approx(
        peak * 0.5 * (1 + np.cos(np.pi * 2 / 3)), rel=1e-6
    )
