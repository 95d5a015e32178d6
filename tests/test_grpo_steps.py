"""The GRPO train step: ratio 1 on the first update of unchanged parameters, sharded == single device on 8
fake CPU devices, exact accumulation, beta = 0 without reference log-probs, one compile per bucket, and
learning in the advantages' direction. Tiny model, float32."""

import jax
import numpy as np
import pytest
from seeds import fresh_seed
from train_fixtures import (
    MESHES,
    OBJ,
    PAD,
    SCALARS,
    TINY,
    fresh_state,
    mesh_of,
    placed,
    setup,
    single_mesh,
    to_numpy,
)

from coevo_jax.data.chat_format import TokenizedTrajectory
from coevo_jax.data.grpo_rows import SampledSequence, collate_grpo
from coevo_jax.train import GRPOObjective, StepKind
from coevo_jax.train.compiled_steps import grpo_keys

GRPO_OBJ = OBJ.__class__(logprob_chunk_size=OBJ.logprob_chunk_size, grpo=GRPOObjective(beta=0.05))
PARAM_TOL = dict(rtol=1e-5, atol=2e-5)  # as tests/test_train_steps.py (Adam's first update near |g| ~ eps)


def sampled(rng: np.random.RandomState, length: int, advantage: float) -> SampledSequence:
    """Random ids whose second half is sampled reply tokens (log-probs filled in later)."""
    ids = rng.randint(1, TINY.vocab_size, size=length).astype(np.int32)
    mask = np.zeros(length, bool)
    mask[length // 2 :] = True
    return SampledSequence(TokenizedTrajectory(ids, mask), np.zeros(length, np.float32), advantage)


def grpo_batch(
    seed: int, *, rows: int = 8, length: int = 32, real: int | None = None, centered: bool = False
) -> dict:
    """`centered`: advantages of mean zero (as a group's normalised ones are), so both signs occur."""
    rng = np.random.RandomState(seed)
    real = rows if real is None else real
    advantages = rng.standard_normal(real)
    if centered:
        advantages = advantages - advantages.mean()
    examples = [sampled(rng, int(rng.randint(length // 2, length + 1)), a) for a in advantages]
    return collate_grpo(examples, length=length, batch_size=rows, pad_id=PAD)


def with_logps(steps, params, batch: dict, reference_params=None) -> dict:
    """The placed batch with `old_logps` = the policy's own log-probs at GRPO's temperature (what the
    sampler recorded, had it sampled these tokens), and `ref_logps` from `reference_params`."""
    old = steps.grpo_reference(params, batch) * batch["loss_mask"]
    ref = steps.grpo_reference(params if reference_params is None else reference_params, batch)
    return {**batch, "old_logps": old, "ref_logps": ref}


@pytest.fixture(scope="module")
def single():
    mesh = single_mesh()
    _, shardings, steps, _, rules = setup(mesh, obj=GRPO_OBJ, return_grads=True)
    return mesh, shardings, steps, rules


def _two_updates(mesh, shardings, steps, rules, num_microbatches=1):
    """Params and metrics after one SFT step (so the reference differs), then two GRPO updates on one batch."""
    from train_fixtures import sft_batch

    state = fresh_state(shardings)
    reference = to_numpy(state.params)
    state, _ = steps.sft(
        state, placed(sft_batch(0, rows=16, real=13), mesh, rules, num_microbatches), SCALARS
    )
    batch = placed(grpo_batch(1, rows=16, real=13), mesh, rules, num_microbatches)
    batch = with_logps(steps, state.params, batch, jax.device_put(reference, shardings.params))
    out = []
    for _ in range(2):
        state, metrics = steps.grpo(state, batch, SCALARS)
        out.append(to_numpy((state.params, metrics)))
    return out


@pytest.fixture(scope="module")
def single_device_results(single):
    return _two_updates(*single)


def test_first_update_has_ratio_one_and_nothing_clipped(single_device_results):
    (_, first), (_, second) = single_device_results
    assert first["ratio"] == pytest.approx(1.0, abs=1e-6) and first["clip_fraction"] == 0.0
    assert first["kl"] > 0 and first["episodes"] == 13 and first["loss_tokens"] > 0
    assert abs(second["ratio"] - 1.0) > 1e-5  # the second update of the batch is off-policy
    assert np.shape(first["loss"]) == () and first["learning_rate"] == pytest.approx(1e-3)


def _assert_same(results, expected):
    for (params, metrics), (expected_params, expected_metrics) in zip(results, expected, strict=True):
        for name in ("loss", "ratio", "kl", "clip_fraction"):
            np.testing.assert_allclose(
                metrics[name], expected_metrics[name], rtol=1e-5, atol=1e-6, err_msg=name
            )
        jax.tree.map(
            lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6),
            metrics["grads"],
            expected_metrics["grads"],
        )
        jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, **PARAM_TOL), params, expected_params)


@pytest.mark.parametrize(
    "mesh_name", [name if name == "cube2" else pytest.param(name, marks=pytest.mark.slow) for name in MESHES]
)
def test_sharded_grpo_step_matches_single_device(mesh_name, single_device_results):
    mesh = mesh_of(MESHES[mesh_name])
    _, shardings, steps, _, rules = setup(mesh, obj=GRPO_OBJ, return_grads=True)
    _assert_same(_two_updates(mesh, shardings, steps, rules), single_device_results)


def test_micro_batches_accumulate_to_the_whole_batch_update(single, single_device_results):
    mesh, shardings, steps, rules = single
    _assert_same(_two_updates(mesh, shardings, steps, rules, num_microbatches=2), single_device_results)


def test_beta_zero_steps_take_no_reference_log_probs():
    assert "ref_logps" in grpo_keys(1e-3) and "ref_logps" not in grpo_keys(0.0)
    mesh = single_mesh()
    no_kl = OBJ.__class__(logprob_chunk_size=OBJ.logprob_chunk_size, grpo=GRPOObjective(beta=0.0))
    _, shardings, steps, _, rules = setup(mesh, obj=no_kl)
    state = fresh_state(shardings)
    batch = placed(grpo_batch(2), mesh, rules)
    batch["old_logps"] = steps.grpo_reference(state.params, batch) * batch["loss_mask"]
    assert steps.grpo.keys == grpo_keys(0.0)
    state, metrics = steps.grpo(state, batch, SCALARS)  # no ref_logps in the batch
    assert float(metrics["kl"]) == 0.0 and float(metrics["ratio"]) == pytest.approx(1.0, abs=1e-6)
    _, _, kl_steps, _, _ = setup(mesh, obj=GRPO_OBJ)
    with pytest.raises(KeyError, match="ref_logps"):
        kl_steps.grpo(fresh_state(shardings), batch, SCALARS)


def test_grpo_compiles_once_per_bucket_and_follows_the_advantages(single):
    """Repeated updates on two buckets: two programs; the log-probs of rows with a positive advantage go
    up on average and those of rows with a negative one go down."""
    mesh, shardings, _, rules = single
    _, shardings, steps, _, rules = setup(mesh, obj=GRPO_OBJ)
    state = fresh_state(shardings)
    seed = fresh_seed()
    batches = [
        placed(grpo_batch(seed + k, length=n, centered=True), mesh, rules) for k, n in enumerate((16, 32))
    ]
    batches = [with_logps(steps, state.params, b) for b in batches]
    before = [np.asarray(b["old_logps"]) for b in batches]
    for _ in range(4):
        for batch in batches:
            state, _ = steps.grpo(state, batch, SCALARS)
    assert steps.grpo.compilations == 2 and steps.step(StepKind.GRPO) is steps.grpo
    for batch, old in zip(batches, before, strict=True):
        mask = np.asarray(batch["loss_mask"])
        moved = ((np.asarray(steps.grpo_reference(state.params, batch)) - old) * mask).sum(-1)
        advantages = np.asarray(batch["advantages"]).sum(-1)  # each row's, on its action tokens
        real = np.asarray(batch["example_mask"]) > 0
        up, down = moved[real & (advantages > 0)], moved[real & (advantages < 0)]
        assert up.mean() > 0 > down.mean(), f"seed={seed}: {up}, {down}"
