"""coevo_jax.losses against float64 NumPy references on fresh random inputs."""

from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from seeds import fresh_seed

from coevo_jax import chunked_logprobs, losses

RTOL = 1e-5


def fresh_rng():
    """A new random generator per test; its seed is printed and goes into failure messages (see `seeds`)."""
    seed = fresh_seed()
    return np.random.default_rng(seed), seed


# --- float64 NumPy references, written from the paper's equations ---


def ref_token_logprobs(logits, targets):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(-1)) + logits.max(-1)
    return np.take_along_axis(logits, targets[..., None], -1)[..., 0] - log_z


def ref_sequence_logprobs(logits, targets, mask):
    return (ref_token_logprobs(logits, targets) * mask).sum(-1)


def ref_sft_loss(logits, targets, mask):
    count = mask.sum()
    return -(ref_token_logprobs(logits, targets) * mask).sum() / max(count, 1.0)


def ref_log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def ref_dpo(pc, pr, rc, rr, beta):
    z = beta * ((pc - rc) - (pr - rr))
    return -ref_log_sigmoid(z), beta * (pc - rc), beta * (pr - rr)


def random_batch(rng, batch=3, length=7, vocab=11, scale=3.0, dtype=np.float32):
    logits = (rng.standard_normal((batch, length, vocab)) * scale).astype(dtype)
    targets = rng.integers(0, vocab, (batch, length))
    mask = (rng.random((batch, length)) < 0.6).astype(np.float32)
    mask[0] = 0.0  # a row with no action token at all
    return logits, targets, mask


def assert_close(actual, expected, seed, rtol=RTOL, atol=0.0):
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol, err_msg=f"seed={seed}"
    )


def test_token_and_sequence_logprobs_match_float64_reference():
    rng, seed = fresh_rng()
    logits, targets, mask = random_batch(rng)
    assert_close(losses.token_logprobs(logits, targets), ref_token_logprobs(logits, targets), seed, atol=1e-6)
    got = losses.sequence_logprobs(logits, targets, mask)
    assert_close(got, ref_sequence_logprobs(logits, targets, mask), seed, atol=1e-6)
    assert float(got[0]) == 0.0  # all-zero mask row


def test_sequence_logprobs_ignore_masked_positions_even_if_non_finite():
    rng, seed = fresh_rng()
    logits, targets, mask = random_batch(rng)
    logits[1, 2, :] = np.nan  # garbage at a masked-out position must not leak
    mask[1, 2] = 0.0
    got = np.asarray(losses.sequence_logprobs(logits, targets, mask))
    assert np.isfinite(got).all(), f"seed={seed}"


def test_sft_loss_and_terms_match_reference_and_accumulate_exactly():
    rng, seed = fresh_rng()
    logits, targets, mask = random_batch(rng, batch=4)
    assert_close(losses.sft_loss(logits, targets, mask), ref_sft_loss(logits, targets, mask), seed)
    # Two micro-batches with different token counts: summing terms gives the global per-token mean.
    first = losses.sft_terms(logits[:1], targets[:1], mask[:1])
    second = losses.sft_terms(logits[1:], targets[1:], mask[1:])
    combined = losses.SFTTerms(first.nll_sum + second.nll_sum, first.token_count + second.token_count)
    assert_close(combined.mean(), ref_sft_loss(logits, targets, mask), seed)
    assert float(losses.sft_loss(logits, targets, np.zeros_like(mask))) == 0.0


def test_dpo_loss_matches_reference_with_metrics():
    rng, seed = fresh_rng()
    pc, pr, rc, rr = ((rng.standard_normal(16) * 20 - 50).astype(np.float32) for _ in range(4))
    beta = 0.1
    out = losses.dpo_loss(pc, pr, rc, rr, beta)
    p64 = [x.astype(np.float64) for x in (pc, pr, rc, rr)]
    ref_loss, ref_chosen, ref_rejected = ref_dpo(*p64, beta)
    assert_close(out.losses, ref_loss, seed, atol=1e-6)
    assert_close(out.chosen_rewards, ref_chosen, seed, atol=1e-5)
    assert_close(out.rejected_rewards, ref_rejected, seed, atol=1e-5)
    assert_close(out.reward_margins, ref_chosen - ref_rejected, seed, atol=1e-5)
    np.testing.assert_array_equal(
        np.asarray(out.reward_accuracies), (ref_chosen > ref_rejected).astype(np.float32)
    )


def test_dpo_loss_is_stable_for_large_margins():
    pc = jnp.array([1e4, -1e4])
    zeros = jnp.zeros(2)
    out = losses.dpo_loss(pc, zeros, zeros, zeros, 0.5)
    assert np.isfinite(np.asarray(out.losses)).all()
    np.testing.assert_allclose(np.asarray(out.losses), [0.0, 5e3], rtol=1e-6)


def test_coevo_loss_matches_eq9_reference():
    rng, seed = fresh_rng()
    b = 8
    pc, pr, rc, rr = ((rng.standard_normal(b) * 10 - 30).astype(np.float32) for _ in range(4))
    counts = rng.integers(0, 40, b).astype(np.float32)
    lam_dpo = np.where(rng.random(b) < 0.5, 0.5, 1.0).astype(np.float32)
    lam_sft = np.where(lam_dpo == 0.5, 0.5, 0.0).astype(np.float32)
    pair_mask = np.ones(b, np.float32)
    pair_mask[-2:] = 0.0
    beta = 0.5
    ref_dpo_loss, _, _ = ref_dpo(*(x.astype(np.float64) for x in (pc, pr, rc, rr)), beta)
    for per_token in (True, False):
        nll = -pc.astype(np.float64) / (np.maximum(counts, 1.0) if per_token else 1.0)
        ref_per_pair = (lam_dpo * ref_dpo_loss + lam_sft * nll) * pair_mask
        out = losses.coevo_loss(
            pc, pr, rc, rr, counts, lam_dpo, lam_sft, beta, pair_mask, sft_per_token=per_token
        )
        assert_close(out.per_pair, ref_per_pair, seed, atol=1e-6)
        assert_close(out.loss, ref_per_pair.sum() / pair_mask.sum(), seed, atol=1e-6)
        assert float(out.pair_count) == pair_mask.sum()


def test_coevo_loss_default_is_eq9_sequence_sum():
    """Eq. 9's SFT term by default is -lambda_sft * log pi(e+|u) summed over the action tokens, not per token."""
    rng, seed = fresh_rng()
    b = 6
    pc, pr, rc, rr = ((rng.standard_normal(b) * 10 - 60).astype(np.float32) for _ in range(4))
    counts = rng.integers(20, 200, b).astype(np.float32)
    lam = np.full(b, 0.5, np.float32)
    ref_dpo_loss, _, _ = ref_dpo(*(x.astype(np.float64) for x in (pc, pr, rc, rr)), 0.1)
    out = losses.coevo_loss(pc, pr, rc, rr, counts, lam, lam, 0.1)
    assert_close(out.per_pair, 0.5 * ref_dpo_loss - 0.5 * pc.astype(np.float64), seed, atol=1e-5)
    assert_close(out.sft_nll, -pc.astype(np.float64), seed, atol=1e-5)


def test_coevo_loss_failure_pairs_reduce_to_dpo():
    rng, seed = fresh_rng()
    pc, pr, rc, rr = ((rng.standard_normal(5) * 10).astype(np.float32) for _ in range(4))
    out = losses.coevo_loss(pc, pr, rc, rr, np.full(5, 7.0), np.ones(5), np.zeros(5), 0.1)
    assert_close(out.loss, np.mean(np.asarray(losses.dpo_loss(pc, pr, rc, rr, 0.1).losses)), seed, atol=1e-7)


def test_losses_accept_bfloat16_logits_and_compute_in_float32():
    rng, seed = fresh_rng()
    logits, targets, mask = random_batch(rng)
    logits_bf16 = jnp.asarray(logits, jnp.bfloat16)
    got = losses.sequence_logprobs(logits_bf16, targets, mask)
    assert got.dtype == jnp.float32
    # Reference on the bf16-rounded values: the only error left is float32 accumulation.
    rounded = np.asarray(logits_bf16.astype(jnp.float32))
    assert_close(got, ref_sequence_logprobs(rounded, targets, mask), seed, atol=1e-5)
    assert losses.sft_loss(logits_bf16, targets, mask).dtype == jnp.float32


def test_losses_are_jit_and_vmap_safe():
    rng, seed = fresh_rng()
    logits, targets, mask = random_batch(rng)
    jitted = jax.jit(losses.sequence_logprobs)
    assert_close(jitted(logits, targets, mask), ref_sequence_logprobs(logits, targets, mask), seed, atol=1e-6)
    per_row = jax.vmap(lambda lg, t, m: losses.sequence_logprobs(lg[None], t[None], m[None])[0])
    assert_close(
        per_row(logits, targets, mask), ref_sequence_logprobs(logits, targets, mask), seed, atol=1e-6
    )


def test_gradients_match_finite_differences():
    rng, _ = fresh_rng()
    logits, targets, mask = random_batch(rng, batch=2, length=4, vocab=5)
    pc, pr, rc, rr = (rng.standard_normal(3) for _ in range(4))
    with jax.enable_x64(True):
        lg = jnp.asarray(logits, jnp.float64)
        check_grads(lambda x: losses.sequence_logprobs(x, targets, mask), (lg,), order=2, modes=["rev"])
        check_grads(lambda x: losses.sft_loss(x, targets, mask), (lg,), order=2, modes=["rev"])
        check_grads(lambda a, b: losses.dpo_loss(a, b, rc, rr, 0.3).losses, (pc, pr), order=2, modes=["rev"])
        check_grads(
            lambda a, b: (
                losses.coevo_loss(a, b, rc, rr, np.full(3, 4.0), np.full(3, 0.5), np.full(3, 0.5), 0.3).loss
            ),
            (pc, pr),
            order=2,
            modes=["rev"],
        )


def test_gradient_of_logprobs_is_zero_off_the_mask():
    rng, seed = fresh_rng()
    logits, targets, mask = random_batch(rng)
    grad = jax.grad(lambda x: jnp.sum(losses.sequence_logprobs(x, targets, mask)))(logits)
    off_mask = np.asarray(grad)[mask == 0]
    assert np.all(off_mask == 0.0), f"seed={seed}"


@pytest.mark.parametrize(
    "keep_bound", [0, chunked_logprobs.KEEP_LOGITS_MAX_BYTES], ids=["recomputed", "kept"]
)
@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_chunked_logprobs_from_hidden_equal_unchunked(chunk_size, keep_bound, monkeypatch):
    """With no logits kept (bound 0) the chunks are real; with the default bound these small logits are kept
    and computed in one chunk whatever `chunk_size`."""
    monkeypatch.setattr(chunked_logprobs, "KEEP_LOGITS_MAX_BYTES", keep_bound)
    rng, seed = fresh_rng()
    batch, length, hidden, vocab = 3, 9, 8, 13
    hidden_states = rng.standard_normal((batch, length, hidden)).astype(np.float32)
    unembed = rng.standard_normal((hidden, vocab)).astype(np.float32)
    targets = rng.integers(0, vocab, (batch, length))
    mask = (rng.random((batch, length)) < 0.5).astype(np.float32)
    logits64 = hidden_states.astype(np.float64) @ unembed.astype(np.float64)
    got = losses.sequence_logprobs_from_hidden(hidden_states, unembed, targets, mask, chunk_size=chunk_size)
    assert_close(got, ref_sequence_logprobs(logits64, targets, mask), seed, atol=1e-5)
    full = losses.sequence_logprobs(jnp.einsum("btd,dv->btv", hidden_states, unembed), targets, mask)
    assert_close(got, np.asarray(full, np.float64), seed, atol=1e-5)
    terms = losses.sft_terms_from_hidden(hidden_states, unembed, targets, mask, chunk_size=chunk_size)
    assert_close(terms.mean(), ref_sft_loss(logits64, targets, mask), seed, atol=1e-6)

    def chunked_total(h, w):
        return jnp.sum(losses.sequence_logprobs_from_hidden(h, w, targets, mask, chunk_size=chunk_size))

    def full_total(h, w):
        return jnp.sum(losses.sequence_logprobs(jnp.einsum("btd,dv->btv", h, w), targets, mask))

    chunked_grads = jax.grad(chunked_total, argnums=(0, 1))(hidden_states, unembed)
    full_grads = jax.grad(full_total, argnums=(0, 1))(hidden_states, unembed)
    for a, b in zip(chunked_grads, full_grads, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")


@pytest.mark.parametrize("keep_logits", [True, False])
def test_logprob_gradients_from_hidden_match_float64_reference(keep_logits):
    """The hand-written backward (onehot - softmax), with the forward's logits kept or recomputed."""
    rng, seed = fresh_rng()
    batch, length, hidden, vocab, chunk = 2, 7, 6, 17, 4
    h = rng.standard_normal((batch, length, hidden))
    w = rng.standard_normal((hidden, vocab))
    targets = rng.integers(0, vocab, (batch, length))
    weights = rng.standard_normal((batch, length))  # d(loss)/d(logp_t)

    def total(hh, ww):
        logps = chunked_logprobs.token_logprobs_from_hidden(hh, ww, targets, chunk, keep_logits=keep_logits)
        return jnp.sum(logps * weights)

    got_h, got_w = jax.grad(total, argnums=(0, 1))(h.astype(np.float32), w.astype(np.float32))
    logits = h @ w
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    d_logits = weights[..., None] * (np.eye(vocab)[targets] - probs)
    assert_close(got_h, d_logits @ w.T, seed, atol=1e-5)
    assert_close(got_w, np.einsum("btd,btv->dv", h, d_logits), seed, atol=1e-5)


def test_logprob_backward_keeps_logits_by_default_only_while_small():
    assert chunked_logprobs.keeps_logits(8 * 512, 8192)  # the benchmark anchor: 128 MiB
    assert not chunked_logprobs.keeps_logits(2 * 4096, 32768)  # 1 GiB: recomputed chunk by chunk


@pytest.mark.parametrize("keep_logits, products", [(True, 3), (False, 4), (None, 4)])
def test_kept_logits_spare_the_backward_its_unembedding_product(keep_logits, products):
    """Forward: one [C, D] x [D, V] product per chunk; backward: d_hidden and d_unembed, plus the logits
    again unless kept. 4 x 256 x 8192 float32 logits (32 MiB) are under the default bound, so `None` would
    keep them: the bound is lowered to 1 MiB here to show that `True` keeps them past it."""
    h = jnp.ones((4, 256, 16), jnp.float32)
    w = jnp.ones((16, 8192), jnp.float32)
    targets = jnp.zeros((4, 256), jnp.int32)

    def total(hh, ww):
        return jnp.sum(
            chunked_logprobs.token_logprobs_from_hidden(hh, ww, targets, 512, keep_logits=keep_logits)
        )

    with mock.patch.object(chunked_logprobs, "KEEP_LOGITS_MAX_BYTES", 1 << 20):
        jaxpr = str(jax.make_jaxpr(jax.grad(total, argnums=(0, 1)))(h, w))
    assert jaxpr.count("dot_general[") == products


def test_chunked_logprobs_never_build_full_logits():
    """For T=4096, V=32k the lean path's compiled temporaries stay far below one float32 [B,T,V] array."""
    batch, length, hidden, vocab, chunk = 2, 4096, 64, 32768, 512
    h = jax.ShapeDtypeStruct((batch, length, hidden), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((hidden, vocab), jnp.bfloat16)
    t = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    m = jax.ShapeDtypeStruct((batch, length), jnp.float32)

    def total(hh, ww, tt, mm):
        return jnp.sum(losses.sequence_logprobs_from_hidden(hh, ww, tt, mm, chunk_size=chunk))

    compiled = jax.jit(jax.grad(total, argnums=(0, 1))).lower(h, w, t, m).compile()
    full_logits_bytes = batch * length * vocab * 4
    temp_bytes = compiled.memory_analysis().temp_size_in_bytes
    chunk_logits_bytes = chunk * vocab * 4
    # Forward and backward each hold about one [chunk, V] float32 block; nothing near [B, T, V].
    assert temp_bytes < 3 * chunk_logits_bytes, (temp_bytes, chunk_logits_bytes)
    assert temp_bytes < full_logits_bytes / 4, (temp_bytes, full_logits_bytes)


def test_dpo_loss_traces_once_for_fixed_shapes():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(pc, pr, rc, rr):
        return losses.dpo_loss(pc, pr, rc, rr, 0.1).losses.mean()

    for _ in range(3):
        step(*(jnp.asarray(np.random.default_rng(i).standard_normal(4), jnp.float32) for i in range(4)))


def _token_inputs(batch=2, length=5, vocab=7):
    logits = np.zeros((batch, length, vocab), np.float32)
    return logits, np.zeros((batch, length), np.int32), np.ones((batch, length), np.float32)


@pytest.mark.parametrize("function", [losses.sequence_logprobs, losses.sft_terms, losses.sft_loss])
def test_mis_shaped_token_inputs_are_named_not_broadcast(function):
    logits, targets, mask = _token_inputs()
    name = "sft_terms" if function is losses.sft_loss else function.__name__
    for bad in (
        (logits[0], targets, mask),  # logits without the batch axis
        (logits, targets, mask[:, :1]),  # a mask that would broadcast over T
        (logits, targets[:1], mask[:1]),  # targets of another batch
        (logits, targets[:, None], mask),  # targets with an extra axis
    ):
        with pytest.raises(AssertionError, match=name):
            function(*bad)
        with pytest.raises(AssertionError, match=name):  # at trace time, under jit too
            jax.jit(function)(*bad)


def test_mis_shaped_pair_inputs_are_named_not_broadcast():
    b = np.zeros(4, np.float32)
    for bad in ((b[:, None], b, b, b), (b, b[:1], b, b), (b, b, b, np.float32(0.0))):
        with pytest.raises(AssertionError, match="dpo_loss"):
            losses.dpo_loss(*bad, 0.1)
        with pytest.raises(AssertionError, match="coevo_loss"):
            losses.coevo_loss(*bad, b, b, b, 0.1)
    for weights in ((b[:1], b, b), (b, b[:, None], b), (b, b, np.ones(()))):
        with pytest.raises(AssertionError, match="coevo_loss"):
            losses.coevo_loss(b, b, b, b, *weights, 0.1)
    with pytest.raises(AssertionError, match="coevo_loss"):
        losses.coevo_loss(b, b, b, b, b, b, b, 0.1, pair_mask=np.ones(3))
