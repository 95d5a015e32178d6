"""GiGPO's pure functions (`discounted_returns`, `step_group_advantages`, per-token advantages in `grpo_loss`)
against float64 NumPy references written from the definitions, on fresh random inputs (the seed is printed on
failure)."""

import jax
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax import losses


def fresh_rng():
    seed = fresh_seed()
    return np.random.default_rng(seed), seed


def ref_discounted_returns(rewards, mask, gamma):
    returns = np.zeros(rewards.shape, np.float64)
    for b in range(rewards.shape[0]):
        after = 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                after = float(rewards[b, t]) + gamma * after
                returns[b, t] = after
    return returns


def ref_step_group_advantages(values, group_ids, scale="group", eps=1e-6):
    values = np.asarray(values, np.float64)
    out = np.zeros_like(values)
    for group in set(group_ids.tolist()):
        members = group_ids == group
        centred = values[members] - values[members].mean()
        if scale == "none":
            out[members] = centred
        elif members.sum() > 1:
            out[members] = centred / (values[members].std(ddof=1) + eps)
    return out


def test_discounted_returns_match_the_reference():
    rng, seed = fresh_rng()
    for gamma in (0.0, 0.5, 0.95, 1.0):
        rewards = rng.normal(size=(5, 9)).astype(np.float32)
        mask = rng.random((5, 9)) < 0.7  # gaps too: a masked step passes the later return through
        mask[0] = False  # a row without a valid step: all 0
        got = losses.discounted_returns(rewards, mask, gamma)
        np.testing.assert_allclose(
            got, ref_discounted_returns(rewards, mask, gamma), rtol=1e-5, atol=1e-6, err_msg=f"seed={seed}"
        )
        assert np.all(np.asarray(got)[~mask] == 0.0)


def test_a_final_reward_discounts_back_to_the_first_step():
    rewards = np.array([[0.0, 0.0, 1.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 1, 0]], bool)
    np.testing.assert_allclose(
        losses.discounted_returns(rewards, mask, 0.9), [[0.81, 0.9, 1.0, 0.0]], rtol=1e-6
    )


@pytest.mark.parametrize("scale", losses.ADVANTAGE_SCALES)
def test_step_group_advantages_match_the_reference(scale):
    rng, seed = fresh_rng()
    n = 40
    values = rng.normal(size=n).astype(np.float32)
    group_ids = rng.integers(0, 12, size=n)  # singletons and larger groups, ids with gaps
    values[group_ids == group_ids[0]] = 0.25  # an all-equal group: 0, not NaN
    got = np.asarray(jax.jit(lambda v, g: losses.step_group_advantages(v, g, scale=scale))(values, group_ids))
    np.testing.assert_allclose(
        got, ref_step_group_advantages(values, group_ids, scale), rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}"
    )
    singletons = [g for g in set(group_ids.tolist()) if (group_ids == g).sum() == 1]
    assert np.all(got[np.isin(group_ids, singletons)] == 0.0) and np.all(np.isfinite(got))


def test_step_group_advantages_refuse_an_unknown_scale_and_mismatched_shapes():
    with pytest.raises(ValueError, match="scale"):
        losses.step_group_advantages(np.zeros(3), np.zeros(3, int), scale="batch")
    with pytest.raises(AssertionError, match="step_group_advantages"):
        losses.step_group_advantages(np.zeros(3), np.zeros(4, int))


@pytest.mark.parametrize("aggregation", losses.GRPO_AGGREGATIONS)
def test_per_token_advantages_match_the_reference(aggregation):
    rng, seed = fresh_rng()
    b, t = 4, 11
    logps, old, ref = (rng.normal(-1.5, 0.4, size=(b, t)).astype(np.float32) for _ in range(3))
    advantages = rng.normal(size=(b, t)).astype(np.float32)
    mask = (rng.random((b, t)) < 0.6).astype(np.float32)
    loss, _ = losses.grpo_loss(logps, old, ref, advantages, mask, aggregation=aggregation)
    a = advantages.astype(np.float64)
    ratio = np.exp(logps.astype(np.float64) - old)
    pg = -np.minimum(ratio * a, np.clip(ratio, 0.8, 1.28) * a)
    kl = np.exp(ref.astype(np.float64) - logps) - (ref.astype(np.float64) - logps) - 1
    loss_t = (pg + 1e-3 * kl) * mask
    if aggregation == "token_mean":
        expected = loss_t.sum() / mask.sum()
    elif aggregation == "sequence_mean":
        rows = mask.sum(1) > 0
        expected = np.mean(loss_t.sum(1)[rows] / mask.sum(1)[rows])
    else:
        expected = loss_t.sum() / mask.size
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5, err_msg=f"seed={seed}")


def test_a_row_advantage_and_its_broadcast_per_token_give_the_same_loss_and_gradient():
    rng, seed = fresh_rng()
    logps, old, ref = (rng.normal(-1.0, 0.3, size=(3, 7)).astype(np.float32) for _ in range(3))
    row = rng.normal(size=3).astype(np.float32)
    mask = (rng.random((3, 7)) < 0.7).astype(np.float32)
    loss = lambda adv: lambda lp: losses.grpo_loss(lp, old, ref, adv, mask)[0]  # noqa: E731
    per_token = np.broadcast_to(row[:, None], (3, 7)).copy()
    per_token[mask == 0] = 1e6  # off the mask a per-token advantage is never read
    np.testing.assert_allclose(loss(row)(logps), loss(per_token)(logps), rtol=1e-6, err_msg=f"seed={seed}")
    np.testing.assert_allclose(
        jax.grad(loss(row))(logps), jax.grad(loss(per_token))(logps), rtol=1e-6, err_msg=f"seed={seed}"
    )
