"""The decoder's scan over its stacked layers equals a plain Python loop over the same per-layer weights.

The reference below builds one `Block` per layer from the layer's slice of the stacked parameters and
calls them in order, with the per-layer dropout keys `fold_in(dropout_key, i)`: the scan (with and without
remat, rolled or unrolled) must give the same logits and the same gradients, LoRA adapters and their dropout
included.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_fixtures import KITCHEN_SINK, padded_batch, random_decoder, with_random_adapters
from seeds import fresh_seed

from coevo_jax.models.decoder import Decoder
from coevo_jax.models.token_shift import shift_full

# Adapters with dropout on every target, so that the per-layer dropout keys matter.
LORA = dict(lora_rank=4, lora_alpha=8.0, lora_dropout=0.25)
TOL = dict(rtol=2e-5, atol=2e-6)  # float32: the scan and the loop round the same products alike


def loop_logits(model: Decoder, params: dict, ids, mask, dropout_key) -> jax.Array:
    """Logits of `model`'s architecture with `params`, its layers run one by one in a Python loop."""
    cfg = model.config
    model = nnx.merge(nnx.graphdef(model), params)
    block_graphdef = nnx.graphdef(model.layers)  # a Block's, adapters included (shapes are in the state)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    x = model.embed_tokens(ids)
    x = shift_full(x, positions, mask, model.token_shift[...].astype(cfg.dtype))
    for i in range(cfg.num_layers):
        layer = jax.tree.map(lambda p, i=i: p[i], params["layers"])
        block = nnx.merge(block_graphdef, layer)
        x, _ = block(x, positions, mask, None, None, jax.random.fold_in(dropout_key, i))
    return model.logits_from_hidden(model.final_norm(x))


def scan_logits(model: Decoder, params: dict, ids, mask, dropout_key) -> jax.Array:
    model = nnx.merge(nnx.graphdef(model), params)
    hidden = model.hidden_states(ids, mask, dropout_key)
    return model.logits_from_hidden(hidden)


@pytest.mark.parametrize("remat,unroll", [(False, False), (True, False), (False, True), (True, True)])
def test_scanned_layers_equal_a_loop_over_the_same_weights_forward_and_gradients(remat, unroll):
    seed = fresh_seed()
    cfg = KITCHEN_SINK.replace(num_layers=3, remat=remat, unroll_layers=unroll)
    base = random_decoder(cfg, seed=seed % 1000)
    model = with_random_adapters(base, seed=seed % 997, **LORA)
    assert (
        model.config.remat == remat and model.config.unroll_layers == unroll and model.config.lora_dropout > 0
    )
    params = nnx.to_pure_dict(nnx.state(model))
    ids, mask = padded_batch([(9, "left"), (6, "right"), (11, "left")], 11, seed=seed % 991)
    ids, mask, key = jnp.asarray(ids), jnp.asarray(mask), jax.random.key(seed)

    def loss(params, logits_fn):
        logits = logits_fn(model, params, ids, mask, key)
        return jnp.sum(jnp.where(mask[..., None] > 0, jnp.tanh(logits), 0.0)), logits

    grad = lambda fn: jax.jit(jax.value_and_grad(lambda p: loss(p, fn), has_aux=True))(params)
    (scan_loss, scan_out), scan_grads = grad(scan_logits)
    (loop_loss, loop_out), loop_grads = grad(loop_logits)
    valid = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(scan_out)[valid], np.asarray(loop_out)[valid], **TOL)
    # the logits agree (above), and each loss is the float64 sum of its own logits' tanh up to float32
    # rounding: the two losses may differ by more than 1e-5 relative where the sum cancels (seed
    # 1561810933: 5e-5 apart on a loss of 1.38)
    for got_loss, logits in ((scan_loss, scan_out), (loop_loss, loop_out)):
        terms = np.tanh(np.asarray(logits, np.float64)[valid])
        np.testing.assert_allclose(got_loss, terms.sum(), rtol=0, atol=1e-6 * np.abs(terms).sum())
    flat_scan, flat_loop = jax.tree.leaves_with_path(scan_grads), jax.tree.leaves(loop_grads)
    for (path, got), want in zip(flat_scan, flat_loop, strict=True):
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path)
        )
    # the dropout really acts per layer: another key changes the output
    other = scan_logits(model, params, ids, mask, jax.random.fold_in(key, 1))
    assert not np.allclose(np.asarray(other)[valid], np.asarray(scan_out)[valid], atol=1e-4)


def _layer_loops(cfg) -> int:
    """How many while loops of `cfg.num_layers` iterations the compiled gradient of a decoder holds."""
    model = random_decoder(cfg, seed=0)
    params = nnx.to_pure_dict(nnx.state(model))
    ids, mask = padded_batch([(7, "right"), (5, "left")], 7, seed=0)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    loss = lambda p: jnp.sum(scan_logits(model, p, ids, mask, jax.random.key(0)))
    text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    return text.count(f'"known_trip_count":{{"n":"{cfg.num_layers}"}}')


def test_unroll_layers_removes_the_loop_over_layers_from_the_compiled_gradient():
    """The point of `unroll_layers`: no loop over layers is left for XLA to stack residuals across."""
    cfg = KITCHEN_SINK.replace(num_layers=3)
    assert _layer_loops(cfg) >= 2  # the forward scan and its transpose
    assert _layer_loops(cfg.replace(unroll_layers=True)) == 0
