"""The gated delta rule against a float64 NumPy loop over tokens: the chunked form (chunks of 1 to 64, a
length no chunk divides, from a non-zero state), the one-token step, and padding tokens (decay 0, write
strength 0) leaving the state as it was. Inputs are drawn fresh on every run (seed printed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax.models.gated_delta_rule import chunked, gated_delta_rule, l2_normalise


def _reference(q, k, v, g, beta, state):
    """Outputs [B, T, H, V] and the final state, token by token in float64."""
    outs = []
    for t in range(q.shape[1]):
        state = state * np.exp(g[:, t])[..., None, None]
        read = np.einsum("bhk,bhkv->bhv", k[:, t], state)
        state = state + k[:, t][..., :, None] * ((v[:, t] - read) * beta[:, t][..., None])[..., None, :]
        outs.append(np.einsum("bhk,bhkv->bhv", q[:, t], state))
    return np.stack(outs, axis=1), state


def _inputs(rng, length):
    batch, heads, key_dim, value_dim = 2, 3, 8, 5
    q = rng.normal(size=(batch, length, heads, key_dim))
    k = rng.normal(size=(batch, length, heads, key_dim))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(batch, length, heads, value_dim))
    g = -rng.uniform(0.0, 2.0, size=(batch, length, heads))
    beta = rng.uniform(0.0, 1.0, size=(batch, length, heads))
    state = rng.normal(size=(batch, heads, key_dim, value_dim))
    return q, k, v, g, beta, state


@pytest.mark.parametrize("chunk", [1, 4, 16, 64])
def test_chunked_equals_the_token_loop(chunk):
    rng = np.random.default_rng(fresh_seed())
    args = _inputs(rng, 37)
    want_out, want_state = _reference(*args)
    f32 = [jnp.asarray(a, jnp.float32) for a in args]
    out, state = jax.jit(lambda *a: chunked(*a, chunk=chunk))(*f32)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_allclose(state, want_state, atol=2e-5)


def test_one_token_and_padding_tokens():
    """`gated_delta_rule` normalises q and k and scales q; one token takes the step; tokens with decay 0 and
    write strength 0 (padding) change neither the state nor, after them, anything."""
    rng = np.random.default_rng(fresh_seed())
    q, k, v, g, beta, state = _inputs(rng, 6)
    g[:, 2:4], beta[:, 2:4] = 0.0, 0.0
    normed_q = np.asarray(l2_normalise(jnp.asarray(q))) * q.shape[-1] ** -0.5
    normed_k = np.asarray(l2_normalise(jnp.asarray(k)))
    want_out, want_state = _reference(normed_q, normed_k, v, g, beta, state)
    _, skipped_state = _reference(
        normed_q[:, [0, 1, 4, 5]],
        normed_k[:, [0, 1, 4, 5]],
        v[:, [0, 1, 4, 5]],
        g[:, [0, 1, 4, 5]],
        beta[:, [0, 1, 4, 5]],
        state,
    )
    np.testing.assert_allclose(want_state, skipped_state, atol=1e-12)
    f32 = [jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta, state)]
    out, final = gated_delta_rule(*f32)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_allclose(final, want_state, atol=2e-5)
    one_out, one_state = gated_delta_rule(*(a[:, :1] for a in f32[:5]), f32[5])
    want_one, want_one_state = _reference(
        normed_q[:, :1], normed_k[:, :1], v[:, :1], g[:, :1], beta[:, :1], state
    )
    np.testing.assert_allclose(one_out, want_one, atol=2e-5)
    np.testing.assert_allclose(one_state, want_one_state, atol=2e-5)
