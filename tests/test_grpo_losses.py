"""GRPO's pure functions (`group_advantages`, `grpo_loss`) against float64 NumPy references on fresh
random inputs: every aggregation, all-masked rows, bf16 inputs, finite-difference gradients, and the
micro-batch normaliser that makes gradient accumulation exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax import losses

AGGREGATIONS = losses.GRPO_AGGREGATIONS


def fresh_rng():
    seed = fresh_seed()
    return np.random.default_rng(seed), seed


def assert_close(actual, expected, seed, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol, err_msg=f"seed={seed}"
    )


# --- float64 NumPy references, written from the definitions ---


def ref_group_advantages(rewards, scale="group", eps=1e-6):
    rewards = np.asarray(rewards, np.float64)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if scale == "none":
        return centred
    if rewards.shape[1] == 1:
        return np.zeros_like(rewards)
    return centred / (rewards.std(axis=1, ddof=1, keepdims=True) + eps)


def ref_per_token(logps, old, ref, adv, clip_low, clip_high, beta):
    logps, old, ref = (np.asarray(x, np.float64) for x in (logps, old, ref))
    ratio = np.exp(logps - old)
    a = np.asarray(adv, np.float64)[:, None]
    pg = -np.minimum(ratio * a, np.clip(ratio, 1 - clip_low, 1 + clip_high) * a)
    kl = np.exp(ref - logps) - (ref - logps) - 1
    clipped = ((ratio < 1 - clip_low) & (a < 0)) | ((ratio > 1 + clip_high) & (a > 0))
    return pg + beta * kl, ratio, kl, clipped


def ref_grpo_loss(logps, old, ref, adv, mask, *, clip_low=0.2, clip_high=0.28, beta=1e-3, aggregation):
    loss_t, ratio, kl, clipped = ref_per_token(logps, old, ref, adv, clip_low, clip_high, beta)
    mask = np.asarray(mask, np.float64)
    if aggregation == "token_mean":
        loss = (loss_t * mask).sum() / mask.sum()
    elif aggregation == "sequence_mean":
        rows = mask.sum(axis=1) > 0
        loss = np.mean((loss_t * mask).sum(axis=1)[rows] / mask.sum(axis=1)[rows])
    else:
        loss = (loss_t * mask).sum() / mask.size
    keep = mask > 0
    metrics = {
        "ratio": ratio[keep].mean(),
        "abs_log_ratio": np.abs(np.log(ratio[keep])).mean(),
        "kl": kl[keep].mean(),
        "clip_fraction": clipped[keep].mean(),
    }
    return loss, metrics


def random_inputs(rng, batch=5, length=9, spread=0.4, dtype=np.float32):
    """Log-probs around -2 with policy/old/ref differences of ~`spread` (some ratios clip), a fully masked
    row, and NaN / inf at masked positions (which must not leak)."""
    old = -np.abs(rng.normal(2.0, 1.0, (batch, length)))
    logps = old + rng.normal(0.0, spread, (batch, length))
    ref = logps + rng.normal(0.0, spread, (batch, length))
    adv = rng.normal(0.0, 1.0, batch)
    mask = (rng.random((batch, length)) < 0.7).astype(np.float32)
    mask[1] = 0.0
    mask[0, 0] = 1.0
    mask[2, 0] = 1.0
    arrays = [x.astype(dtype) for x in (logps, old, ref, adv)]
    return (*arrays, mask)


def with_garbage_off_mask(logps, old, ref, mask):
    off = mask == 0
    logps, old, ref = logps.copy(), old.copy(), ref.copy()
    logps[off], old[off], ref[off] = np.inf, -np.inf, np.nan
    return logps, old, ref


def test_group_advantages_match_reference():
    rng, seed = fresh_rng()
    rewards = rng.choice([0.0, 0.25, 0.5, 1.0], size=(6, 8)).astype(np.float32)
    rewards[0] = 1.0  # all equal: zero advantage, not NaN
    for scale in losses.ADVANTAGE_SCALES:
        got = losses.group_advantages(rewards, scale=scale)
        assert got.dtype == jnp.float32 and got.shape == (6, 8)
        assert_close(got, ref_group_advantages(rewards, scale), seed)
        assert np.all(np.asarray(got)[0] == 0.0)
    # std with ddof=1: a group (0, 1) has std sqrt(1/2), so advantages -+ 0.5 / sqrt(0.5) = -+0.7071
    assert_close(losses.group_advantages(np.array([[0.0, 1.0]])), [[-np.sqrt(0.5), np.sqrt(0.5)]], seed)
    bf16 = jnp.asarray(rewards, jnp.bfloat16)
    assert_close(losses.group_advantages(bf16), ref_group_advantages(rewards), seed)


def test_a_group_of_one_has_zero_advantage():
    single = np.array([[0.3], [1.0]], np.float32)
    for scale in losses.ADVANTAGE_SCALES:
        np.testing.assert_array_equal(np.asarray(losses.group_advantages(single, scale=scale)), 0.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_grpo_loss_and_metrics_match_reference(aggregation):
    rng, seed = fresh_rng()
    logps, old, ref, adv, mask = random_inputs(rng)
    kwargs = dict(clip_low=0.2, clip_high=0.28, beta=0.05, aggregation=aggregation)
    expected, expected_metrics = ref_grpo_loss(logps, old, ref, adv, mask, **kwargs)
    garbage = with_garbage_off_mask(logps, old, ref, mask)
    loss, metrics = losses.grpo_loss(*garbage[:2], garbage[2], adv, mask, **kwargs)
    assert loss.dtype == jnp.float32
    assert_close(loss, expected, seed)
    for name, value in expected_metrics.items():
        assert_close(metrics[name], value, seed)
    assert metrics["token_count"] == mask.sum()
    assert 0 < float(metrics["clip_fraction"]) < 1, f"seed={seed}: inputs should clip some tokens"
    grads = jax.grad(lambda x: losses.grpo_loss(x, *garbage[1:3], adv, mask, **kwargs)[0])(garbage[0])
    assert np.all(np.isfinite(np.asarray(grads))) and np.all(np.asarray(grads)[mask == 0] == 0.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_grpo_gradients_match_finite_differences_of_the_reference(aggregation):
    rng, seed = fresh_rng()
    logps, old, ref, adv, mask = random_inputs(rng, batch=3, length=5, dtype=np.float64)
    kwargs = dict(clip_low=0.2, clip_high=0.28, beta=0.1, aggregation=aggregation)
    with jax.enable_x64(True):
        got = np.asarray(jax.grad(lambda x: losses.grpo_loss(x, old, ref, adv, mask, **kwargs)[0])(logps))
    step, expected = 1e-6, np.zeros_like(logps)
    for index in np.ndindex(logps.shape):
        up, down = logps.copy(), logps.copy()
        up[index] += step
        down[index] -= step
        expected[index] = (
            ref_grpo_loss(up, old, ref, adv, mask, **kwargs)[0]
            - ref_grpo_loss(down, old, ref, adv, mask, **kwargs)[0]
        ) / (2 * step)
    assert_close(got, expected, seed, rtol=1e-5, atol=1e-8)


def test_all_masked_batch_gives_zero_loss_not_nan():
    rng, seed = fresh_rng()
    logps, old, ref, adv, mask = random_inputs(rng)
    for aggregation in AGGREGATIONS:
        loss, metrics = losses.grpo_loss(logps, old, ref, adv, np.zeros_like(mask), aggregation=aggregation)
        assert float(loss) == 0.0 and float(metrics["ratio"]) == 0.0, f"seed={seed}"


def test_grpo_loss_accepts_bfloat16_and_computes_in_float32():
    rng, seed = fresh_rng()
    logps, old, ref, adv, mask = random_inputs(rng)
    bf16 = [jnp.asarray(x, jnp.bfloat16) for x in (logps, old, ref, adv)]
    loss, metrics = losses.grpo_loss(*bf16, mask, beta=0.05)
    assert loss.dtype == jnp.float32 and metrics["kl"].dtype == jnp.float32
    rounded = [np.asarray(x.astype(jnp.float32)) for x in bf16]
    expected, _ = ref_grpo_loss(*rounded, mask, beta=0.05, aggregation="token_mean")
    assert_close(loss, expected, seed)


def test_beta_zero_needs_no_reference():
    rng, seed = fresh_rng()
    logps, old, ref, adv, mask = random_inputs(rng)
    without, metrics = losses.grpo_loss(logps, old, None, adv, mask, beta=0.0)
    with_ref, _ = losses.grpo_loss(logps, old, ref, adv, mask, beta=0.0)
    assert_close(without, float(with_ref), seed)
    assert float(metrics["kl"]) == 0.0
    with pytest.raises(ValueError, match="beta == 0"):
        losses.grpo_loss(logps, old, None, adv, mask, beta=1e-3)


def test_unchanged_policy_has_ratio_one_and_nothing_clipped():
    """The first update of a GRPO step: the policy is the sampler's, so ratio = 1 and the loss is -A per
    token (plus the KL term)."""
    rng, seed = fresh_rng()
    logps, _, ref, adv, mask = random_inputs(rng)
    loss, metrics = losses.grpo_loss(logps, logps, ref, adv, mask, beta=0.0)
    assert float(metrics["ratio"]) == 1.0 and float(metrics["clip_fraction"]) == 0.0
    assert_close(loss, -(adv[:, None] * mask).sum() / mask.sum(), seed)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_with_the_whole_batch_normaliser_add_up_to_the_whole_batch(aggregation):
    """Gradient accumulation: each micro-batch divides by the whole batch's count (tokens for token_mean,
    as the SFT loss does; rows with a token for sequence_mean; B * T for sum_norm)."""
    rng, seed = fresh_rng()
    logps, old, ref, adv, mask = random_inputs(rng, batch=6)
    kwargs = dict(beta=0.05, aggregation=aggregation)
    whole = lambda x: losses.grpo_loss(x, old, ref, adv, mask, **kwargs)[0]
    if aggregation == "token_mean":
        normaliser = mask.sum()
    elif aggregation == "sequence_mean":
        normaliser = float((mask.sum(axis=1) > 0).sum())
    else:
        normaliser = float(mask.size)

    def accumulated(x):
        parts = [slice(0, 2), slice(2, 6)]  # unequal token counts per micro-batch
        return sum(
            losses.grpo_loss(x[s], old[s], ref[s], adv[s], mask[s], normaliser=normaliser, **kwargs)[0]
            for s in parts
        )

    assert_close(accumulated(logps), float(whole(logps)), seed)
    assert_close(jax.grad(accumulated)(logps), np.asarray(jax.grad(whole)(logps)), seed)
    if aggregation == "token_mean":  # averaging the micro-batch means would be wrong here
        naive = np.mean(
            [
                float(losses.grpo_loss(logps[s], old[s], ref[s], adv[s], mask[s], **kwargs)[0])
                for s in (slice(0, 2), slice(2, 6))
            ]
        )
        assert abs(naive - float(whole(logps))) > 1e-6, f"seed={seed}"


def test_unknown_options_are_errors():
    with pytest.raises(ValueError, match="scale"):
        losses.group_advantages(np.zeros((2, 2)), scale="batch")
    with pytest.raises(ValueError, match="aggregation"):
        z = np.zeros((1, 2))
        losses.grpo_loss(z, z, z, np.zeros(1), z, aggregation="mean")


@pytest.mark.parametrize("keep_logits", [True, False])
def test_tempered_logprobs_from_hidden_and_their_gradients_match_float64_reference(keep_logits):
    """log softmax(h @ w / T)[target], the trainer's side of GRPO's ratio, and its hand-written backward."""
    rng, seed = fresh_rng()
    batch, length, hidden, vocab, chunk, temperature = 2, 7, 6, 17, 4, 0.7
    h = rng.standard_normal((batch, length, hidden))
    w = rng.standard_normal((hidden, vocab))
    targets = rng.integers(0, vocab, (batch, length))
    weights = rng.standard_normal((batch, length))

    def total(hh, ww):
        logps = losses.token_logprobs_from_hidden(
            hh, ww, targets, chunk, keep_logits=keep_logits, temperature=temperature
        )
        return jnp.sum(logps * weights), logps

    (_, got), (got_h, got_w) = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(
        h.astype(np.float32), w.astype(np.float32)
    )
    logits = h @ w / temperature
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    assert_close(got, np.take_along_axis(log_probs, targets[..., None], -1)[..., 0], seed, atol=1e-5)
    d_logits = weights[..., None] * (np.eye(vocab)[targets] - np.exp(log_probs)) / temperature
    assert_close(got_h, d_logits @ w.T, seed, atol=1e-5)
    assert_close(got_w, np.einsum("btd,btv->dv", h, d_logits), seed, atol=1e-5)


def test_mis_shaped_inputs_are_named_not_broadcast():
    with pytest.raises(AssertionError, match="group_advantages"):
        losses.group_advantages(np.zeros(4))  # one group without its axis
    logps, adv = np.zeros((3, 5), np.float32), np.zeros(3, np.float32)
    mask = np.ones((3, 5), np.float32)
    for bad in (
        (logps, logps, logps, adv[:, None], mask),  # advantages [B, 1]
        (logps, logps, logps, adv[:2], mask),  # advantages of another batch
        (logps, logps[:, :1], logps, adv, mask),  # old log-probs that would broadcast
        (logps, logps, logps[0], adv, mask),  # reference log-probs without the batch axis
        (logps, logps, logps, adv, mask[:, :4]),  # a mask of another length
    ):
        with pytest.raises(AssertionError, match="grpo_loss"):
            losses.grpo_loss(*bad)
        with pytest.raises(AssertionError, match="grpo_loss"):
            jax.jit(losses.grpo_loss)(*bad)


def test_equal_rewards_that_float32_cannot_average_exactly_get_zero_advantage():
    """8 x 0.3 has a float32 mean one ulp off 0.3: without care every member gets the same +0.03 advantage,
    a bias with no signal. Equal groups are exactly 0, at group and at step level."""
    for value in (0.3, 0.1, 0.7, 1 / 3, 2 / 3):
        for scale in losses.ADVANTAGE_SCALES:
            rewards = np.full((3, 8), value, np.float32)
            assert not np.any(np.asarray(losses.group_advantages(rewards, scale=scale)))
            values = np.full(8, value, np.float32)
            ids = np.array([0, 0, 0, 1, 1, 2, 2, 2])
            assert not np.any(np.asarray(losses.step_group_advantages(values, ids, scale=scale)))
