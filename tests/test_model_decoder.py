"""Decoder behaviour without a reference implementation: causality, padding, KV cache, dtypes, sharding.

All tests share one randomised "kitchen sink" model (every optional feature on) built once per module.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_fixtures import KITCHEN_SINK, max_abs_on_valid, padded_batch, random_decoder, with_config

from coevo_jax.models import init_cache
from coevo_jax.models.kv_cache import by_layer, stacked

LOGICAL_AXES = {"layers", "vocab", "embed", "mlp", "q_heads", "kv_heads", "head_dim", "norm"}


@pytest.fixture(scope="module")
def model():
    return random_decoder(KITCHEN_SINK)


@pytest.fixture(scope="module")
def full_logits(model):
    """Jitted full forward: (ids, mask) -> float32 logits."""
    return nnx.jit(lambda m, ids, mask: m(ids, mask))


@pytest.fixture(scope="module")
def cached_step(model):
    """Jitted cache append: (ids, cache, mask) -> (logits, cache), compiled once per shape."""
    return nnx.jit(lambda m, ids, cache, mask: m.forward_cached(ids, cache, mask))


def test_every_parameter_has_logical_axes(model):
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = variable.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == variable.get_value().ndim, path
        assert set(axes) <= LOGICAL_AXES, (path, axes)


def test_hidden_states_and_unembedding_give_logits(model, full_logits):
    ids, mask = padded_batch([(6, "left"), (4, "right")], 6)
    hidden, unembedding = nnx.jit(lambda m, i, k: (m.hidden_states(i, k), m.unembedding))(
        model, jnp.asarray(ids), jnp.asarray(mask)
    )
    assert hidden.shape == (2, 6, KITCHEN_SINK.hidden_size)
    assert unembedding.shape == (KITCHEN_SINK.hidden_size, KITCHEN_SINK.vocab_size)
    expected = full_logits(model, jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(hidden @ unembedding, expected, atol=1e-5)


def test_tied_unembedding_is_transposed_embedding():
    tied = random_decoder(KITCHEN_SINK.replace(tie_word_embeddings=True, num_layers=1))
    assert tied.lm_head is None
    np.testing.assert_array_equal(tied.unembedding, tied.embed[...].T)


def test_causality_gradients_are_exactly_zero(model):
    length = 7
    ids, mask = padded_batch([(length, "left"), (5, "right")], length, seed=1)

    @nnx.jit
    def jacobian(m, ids, mask):
        summed_logits = lambda x: m.logits_from_hidden(m.hidden_states_from_embeddings(x, mask)).sum(-1)
        return jax.jacrev(summed_logits)(m.embed_tokens(ids))  # [B, T(out), B, T(in), D]

    jac = np.asarray(jacobian(model, jnp.asarray(ids), jnp.asarray(mask)))
    for t in range(length):
        for row in range(2):
            assert np.all(jac[row, t, row, t + 1 :] == 0.0), f"row {row} position {t} sees the future"
            assert np.any(jac[row, t, row, : t + 1] != 0.0)
            assert np.all(jac[row, t, 1 - row] == 0.0), "rows leak into each other"


def test_padding_side_does_not_change_valid_logits(model, full_logits):
    ids, mask = padded_batch([(5, "right")], 8, seed=2)
    left_ids = np.roll(ids, 3, axis=1)
    left_mask = np.roll(mask, 3, axis=1)
    right = np.asarray(full_logits(model, jnp.asarray(ids), jnp.asarray(mask)))[0, :5]
    left = np.asarray(full_logits(model, jnp.asarray(left_ids), jnp.asarray(left_mask)))[0, 3:]
    np.testing.assert_allclose(left, right, atol=1e-5)


def test_prefill_then_decode_matches_full_forward(model, full_logits, cached_step):
    prompt_len, new_tokens = 6, 5
    ids, mask = padded_batch([(6, "left"), (3, "left"), (5, "left")], prompt_len + new_tokens, seed=4)
    mask[:, prompt_len:] = 1
    ids = np.where(mask > 0, ids, 0)
    expected = np.asarray(full_logits(model, jnp.asarray(ids), jnp.asarray(mask)))

    cache = init_cache(KITCHEN_SINK, batch=3, max_len=16)
    logits, cache = cached_step(
        model, jnp.asarray(ids[:, :prompt_len]), cache, jnp.asarray(mask[:, :prompt_len])
    )
    pieces = [np.asarray(logits)]
    for t in range(prompt_len, prompt_len + new_tokens):
        logits, cache = cached_step(
            model, jnp.asarray(ids[:, t : t + 1]), cache, jnp.asarray(mask[:, t : t + 1])
        )
        pieces.append(np.asarray(logits))
    got = np.concatenate(pieces, axis=1)
    assert max_abs_on_valid(got, expected, mask) < 1e-5
    np.testing.assert_array_equal(cache.lengths_B, mask.sum(axis=1))
    np.testing.assert_array_equal(cache.slot_valid_BxS.sum(axis=1), mask.sum(axis=1))


def test_incremental_chunks_match_whole_history(model, full_logits, cached_step):
    """Three chunks with row-specific padding (left, right, a fully padded row) == one pass over all."""
    chunk_a = padded_batch([(4, "left"), (2, "right"), (4, "left")], 4, seed=5)
    chunk_b = padded_batch([(3, "right"), (4, "left"), (0, "left")], 4, seed=6)
    chunk_c = padded_batch([(1, "left"), (2, "right"), (3, "left")], 4, seed=7)
    ids = np.concatenate([chunk_a[0], chunk_b[0], chunk_c[0]], axis=1)
    mask = np.concatenate([chunk_a[1], chunk_b[1], chunk_c[1]], axis=1)
    expected = np.asarray(full_logits(model, jnp.asarray(ids), jnp.asarray(mask)))

    cache = init_cache(KITCHEN_SINK, batch=3, max_len=16)
    pieces = []
    for chunk_ids, chunk_mask in (chunk_a, chunk_b, chunk_c):
        logits, cache = cached_step(model, jnp.asarray(chunk_ids), cache, jnp.asarray(chunk_mask))
        pieces.append(np.asarray(logits))
    assert max_abs_on_valid(np.concatenate(pieces, axis=1), expected, mask) < 1e-5
    np.testing.assert_array_equal(cache.lengths_B, mask.sum(axis=1))


def test_long_chunks_attending_row_by_row_match_whole_history(model, full_logits, cached_step):
    """Chunks of 32+ tokens take the row-by-row attention path on the CPU; it equals one pass over all."""
    chunk_a = padded_batch([(70, "left"), (64, "left"), (9, "left")], 72, seed=8)
    chunk_b = padded_batch([(66, "left"), (0, "left"), (70, "left")], 70, seed=9)
    chunk_c = padded_batch([(33, "left"), (40, "left"), (5, "left")], 40, seed=10)  # 32-63: newly row by row
    ids = np.concatenate([chunk_a[0], chunk_b[0], chunk_c[0]], axis=1)
    mask = np.concatenate([chunk_a[1], chunk_b[1], chunk_c[1]], axis=1)
    expected = np.asarray(full_logits(model, jnp.asarray(ids), jnp.asarray(mask)))

    cache = init_cache(KITCHEN_SINK, batch=3, max_len=200)
    pieces = []
    for chunk_ids, chunk_mask in (chunk_a, chunk_b, chunk_c):
        logits, cache = cached_step(model, jnp.asarray(chunk_ids), cache, jnp.asarray(chunk_mask))
        pieces.append(np.asarray(logits))
    assert max_abs_on_valid(np.concatenate(pieces, axis=1), expected, mask) < 1e-5
    np.testing.assert_array_equal(cache.lengths_B, mask.sum(axis=1))


@pytest.mark.parametrize("length", [9, 70])  # 70: causal blocks of 64 on the CPU, and a partial one
@pytest.mark.parametrize("cache_dtype", [jnp.float32, jnp.bfloat16])
def test_fresh_chunk_on_the_causal_block_path_matches_the_cached_path(
    model, cached_step, length, cache_dtype
):
    """A first chunk with `fresh=True` (self-attention only) == the same chunk attending the empty cache:
    the same logits, keys, values (to the summation order) and lengths, for left, right and no padding and
    an empty row."""
    rows = [(length, "left"), (length - 4, "left"), (length - 2, "right"), (0, "left")]
    ids, mask = padded_batch(rows, length, seed=10 + length)
    fresh_step = nnx.jit(lambda m, ids, cache, mask: m.forward_cached(ids, cache, mask, fresh=True))
    expected_logits, expected = cached_step(
        model, jnp.asarray(ids), init_cache(KITCHEN_SINK, 4, 96, cache_dtype), jnp.asarray(mask)
    )
    got_logits, got = fresh_step(
        model, jnp.asarray(ids), init_cache(KITCHEN_SINK, 4, 96, cache_dtype), jnp.asarray(mask)
    )
    # another program, another summation order: in a bf16 cache a deeper key may round the other way
    tolerance = 1e-5 if cache_dtype == jnp.float32 else 2e-2
    assert max_abs_on_valid(got_logits, expected_logits, mask) < (
        1e-5 if cache_dtype == jnp.float32 else 1e-3
    )
    for got_kv, expected_kv in ((got.keys, expected.keys), (got.values, expected.values)):
        np.testing.assert_allclose(
            np.asarray(got_kv, np.float32), np.asarray(expected_kv, np.float32), rtol=0, atol=tolerance
        )
    np.testing.assert_array_equal(got.lengths_B, mask.sum(axis=1))


def test_per_layer_cache_buffers_and_weights_match_the_scan_over_the_stacked_cache(model, cached_step):
    """The decode loop's path (`by_layer` cache, `layer_weights`, layers unrolled) appends a chunk and a
    token exactly as the scan over the stacked cache does; `stacked` restores the stacked layout."""
    ids, mask = padded_batch([(5, "left"), (3, "right"), (0, "left")], 5, seed=12)
    step_ids, step_mask = padded_batch([(1, "left"), (1, "left"), (1, "left")], 1, seed=13)
    _, prefilled = cached_step(model, jnp.asarray(ids), init_cache(KITCHEN_SINK, 3, 16), jnp.asarray(mask))
    by_layer_step = nnx.jit(
        lambda m, ids, cache, mask: m.forward_cached(ids, cache, mask, layer_weights=m.layer_weights())
    )
    split = by_layer(prefilled)
    assert len(split.keys) == KITCHEN_SINK.num_layers and split.capacity == prefilled.capacity == 16
    expected_logits, expected = cached_step(model, jnp.asarray(step_ids), prefilled, jnp.asarray(step_mask))
    got_logits, got = by_layer_step(model, jnp.asarray(step_ids), split, jnp.asarray(step_mask))
    assert max_abs_on_valid(got_logits, expected_logits, step_mask) < 1e-5
    got = stacked(got)
    np.testing.assert_allclose(np.asarray(got.keys), np.asarray(expected.keys), rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.values), np.asarray(expected.values), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got.lengths_B, expected.lengths_B)
    np.testing.assert_array_equal(got.token_ids_BxS, expected.token_ids_BxS)  # the kitchen sink's token shift


def test_rows_do_not_disturb_each_other(model, cached_step):
    ids, mask = padded_batch([(4, "left"), (2, "right"), (3, "left")], 4, seed=8)
    step_ids, step_mask = padded_batch([(2, "right"), (1, "left"), (2, "left")], 2, seed=9)
    batch_cache = init_cache(KITCHEN_SINK, batch=3, max_len=8)
    _, batch_cache = cached_step(model, jnp.asarray(ids), batch_cache, jnp.asarray(mask))
    batch_logits, _ = cached_step(model, jnp.asarray(step_ids), batch_cache, jnp.asarray(step_mask))
    for row in range(3):
        cache = init_cache(KITCHEN_SINK, batch=1, max_len=8)
        _, cache = cached_step(
            model, jnp.asarray(ids[row : row + 1]), cache, jnp.asarray(mask[row : row + 1])
        )
        logits, _ = cached_step(
            model, jnp.asarray(step_ids[row : row + 1]), cache, jnp.asarray(step_mask[row : row + 1])
        )
        assert max_abs_on_valid(logits[0], batch_logits[row], step_mask[row]) < 1e-5


def test_cached_step_compiles_once_per_shape(model):
    traces = []

    @nnx.jit
    def step(m, ids, cache, mask):
        traces.append(1)
        return m.forward_cached(ids, cache, mask)

    cache = init_cache(KITCHEN_SINK, batch=2, max_len=8)
    for t in range(4):
        ids = jnp.full((2, 1), t + 1, jnp.int32)
        _, cache = step(model, ids, cache, jnp.ones((2, 1), jnp.int32))
    assert len(traces) == 1


def test_bfloat16_compute_is_close_to_float32(model, full_logits):
    bf16_cfg = KITCHEN_SINK.replace(dtype=jnp.bfloat16)
    bf16_model = with_config(model, bf16_cfg)
    ids, mask = padded_batch([(8, "left"), (5, "right")], 8, seed=10)
    reference = np.asarray(full_logits(model, jnp.asarray(ids), jnp.asarray(mask)))
    cache = init_cache(bf16_cfg, batch=2, max_len=10)
    assert cache.keys.dtype == jnp.bfloat16

    @nnx.jit
    def both(m, ids, mask, cache):
        return m(ids, mask), m.forward_cached(ids, cache, mask)[0]

    full, cached = both(bf16_model, jnp.asarray(ids), jnp.asarray(mask), cache)
    full, cached = np.asarray(full), np.asarray(cached)
    assert full.dtype == np.float32 and np.isfinite(full).all()
    scale = np.abs(reference).max()
    assert max_abs_on_valid(full, reference, mask) < 0.05 * scale
    assert max_abs_on_valid(cached, reference, mask) < 0.05 * scale


def test_remat_gives_identical_loss_and_gradients(model):
    remat_model = with_config(model, KITCHEN_SINK.replace(remat=True))
    ids, mask = padded_batch([(6, "left")], 6, seed=11)

    @nnx.jit
    def value_and_grad(m):
        return nnx.value_and_grad(lambda m: m(jnp.asarray(ids), jnp.asarray(mask)).mean())(m)

    plain, remat = value_and_grad(model), value_and_grad(remat_model)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), plain, remat)


def test_logical_constraints_under_a_mesh_keep_results(model, full_logits):
    ids, mask = padded_batch([(5, "left"), (3, "right")], 5, seed=12)
    expected = np.asarray(full_logits(model, jnp.asarray(ids), jnp.asarray(mask)))
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    rules = (("batch", "data"), ("vocab", None), ("embed", None))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
        assert specs["embed"].get_value() == jax.sharding.PartitionSpec(None, None)
        got = nnx.jit(lambda m, i, k: m(i, k))(model, jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6)
