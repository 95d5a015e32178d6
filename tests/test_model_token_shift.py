"""Token shift against a float64 NumPy reference that walks each row's real tokens in order.

The decoder-level agreement (full pass == prefill + decode, causality, padding) is covered by
test_model_decoder.py, whose shared model has a token shift.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax.models.token_shift import index_of_position, shift_cached, shift_full, write_ids


def reference(x, mask, weights):
    """x'_p = x_p + sum_j w_j x_{p-j} over the row's real tokens (padding anywhere is skipped)."""
    out = np.array(x, np.float64)
    for row in range(x.shape[0]):
        real = np.flatnonzero(mask[row])
        for k, column in enumerate(real):
            for j in range(1, weights.shape[0] + 1):
                if k - j >= 0:
                    out[row, column] += weights[j - 1] * x[row, real[k - j]]
    return out


def random_mask(rng, batch, length):
    """Rows padded on the left, on the right, in the middle, not at all, and one empty row."""
    mask = (rng.random((batch, length)) < 0.75).astype(np.int32)
    mask[0] = 0
    mask[0, length // 2 :] = 1
    mask[1] = 1
    mask[1, -3:] = 0
    mask[2] = 0
    return mask


@pytest.mark.parametrize("width", [1, 4])
def test_shift_full_matches_the_reference(width):
    rng = np.random.default_rng(fresh_seed())
    batch, length, hidden = 5, 13, 6
    x = rng.standard_normal((batch, length, hidden))
    weights = rng.standard_normal((width, hidden))
    mask = random_mask(rng, batch, length)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    got = shift_full(jnp.asarray(x), jnp.asarray(positions), jnp.asarray(mask), jnp.asarray(weights))
    expected = reference(x, mask, weights)
    valid = mask > 0
    np.testing.assert_allclose(np.asarray(got)[valid], expected[valid], rtol=1e-5, atol=1e-5)


def test_index_of_position_inverts_the_positions():
    mask = np.array([[0, 1, 1, 0, 1], [1, 1, 1, 1, 1]], np.int32)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    index = np.asarray(index_of_position(jnp.asarray(positions), jnp.asarray(mask)))
    np.testing.assert_array_equal(index, [[1, 2, 4, 5, 5], [0, 1, 2, 3, 4]])


def test_shift_cached_reads_previous_tokens_from_the_cache():
    rng = np.random.default_rng(fresh_seed())
    vocab, hidden, width, capacity = 11, 4, 3, 8
    table = rng.standard_normal((vocab, hidden))
    weights = rng.standard_normal((width, hidden))
    history = rng.integers(0, vocab, size=6)
    embed = lambda ids: jnp.asarray(table)[ids]
    # Five tokens already cached, then a left-padded chunk holding the sixth.
    ids_cache = write_ids(
        jnp.zeros((1, capacity), jnp.int32), jnp.arange(5)[None], jnp.asarray(history[None, :5])
    )
    chunk_ids, chunk_mask = np.array([[0, history[5]]]), np.array([[0, 1]])
    slots, positions = np.array([[capacity, 5]]), np.array([[0, 5]])
    ids_cache = write_ids(ids_cache, jnp.asarray(slots), jnp.asarray(chunk_ids))
    got = shift_cached(
        embed(jnp.asarray(chunk_ids)),
        ids_cache,
        jnp.asarray(positions),
        jnp.asarray(chunk_mask),
        jnp.asarray(weights),
        embed,
    )
    expected = reference(table[history][None], np.ones((1, 6), np.int32), weights)[0, 5]
    np.testing.assert_allclose(np.asarray(got)[0, 1], expected, rtol=1e-5, atol=1e-5)
