"""The benchmarks' analytic counts (`bench/flops.py`) against the real model's parameters and KV cache."""

import common
import flops
import jax
import numpy as np
import pytest
from flax import nnx

from coevo_jax.models import Decoder, ModelConfig, init_cache

ANCHOR = common.MODEL

SMALL = dict(
    vocab_size=96,
    hidden_size=24,
    intermediate_size=40,
    num_layers=3,
    num_heads=6,
    num_kv_heads=2,
    head_dim=4,
    rope_theta=1e4,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def _config(model: dict) -> ModelConfig:
    return ModelConfig(**model, dtype="float32", param_dtype="float32")


def _matmul_shapes(model: dict) -> list[tuple[int, ...]]:
    """Shapes of the weights that take part in matmuls: every >=2-d weight except the embedding, each layer's
    slice of a stacked layer weight once per layer."""
    state = nnx.state(nnx.eval_shape(lambda: Decoder(_config(model), rngs=nnx.Rngs(0))), nnx.Param)
    shapes = []
    for path, v in nnx.to_flat_state(state):
        shape, copies = (tuple(v.shape[1:]), v.shape[0]) if path[0] == "layers" else (tuple(v.shape), 1)
        if len(shape) >= 2 and path != ("embed",):
            shapes += [shape] * copies
    return shapes


@pytest.mark.parametrize("model", [SMALL, ANCHOR], ids=["small", "anchor"])
def test_matmul_params_match_the_decoder(model):
    assert flops.matmul_params(model) == sum(int(np.prod(s)) for s in _matmul_shapes(model))


@pytest.mark.parametrize("length", [1, 7, 64])
def test_forward_flops_against_a_per_query_count(length):
    # Independent count: each weight [in..., out...] is 2 FLOPs per entry per token; query t (1-based)
    # scores t keys and mixes t values, 2 * head_dim FLOPs each, per query head and layer.
    weights = sum(2.0 * length * np.prod(s, dtype=np.float64) for s in _matmul_shapes(SMALL))
    per_query = [
        SMALL["num_layers"] * SMALL["num_heads"] * 2 * (2.0 * SMALL["head_dim"] * t)
        for t in range(1, length + 1)
    ]
    expected = weights + np.sum(np.asarray(per_query, np.float64))
    assert flops.forward_flops(SMALL, length) == pytest.approx(expected, rel=1e-12)
    step = flops.dpo_step_flops(SMALL, pairs=3, length=length, reference_forward=True)
    assert step == pytest.approx(2 * 3 * 4 * expected, rel=1e-12)


@pytest.mark.parametrize("length", [1, 7, 64])
def test_prefill_flops_unembed_only_the_last_token(length):
    # A generation prefill needs the next-token logits of the prompt's last token only.
    unembedding = 2.0 * SMALL["hidden_size"] * SMALL["vocab_size"]
    layers_only = flops.forward_flops(SMALL, length) - length * unembedding
    assert flops.prefill_flops(SMALL, length) == pytest.approx(layers_only + unembedding, rel=1e-12)


@pytest.mark.parametrize("batch, cache_len", [(1, 16), (5, 40)])
def test_decode_step_bytes_match_weights_and_cache(batch, cache_len):
    cache = jax.eval_shape(lambda: init_cache(_config(SMALL), batch, cache_len))
    cache_bytes = sum(a.size * a.dtype.itemsize for a in (cache.keys, cache.values))
    weight_bytes = 4 * sum(int(np.prod(s)) for s in _matmul_shapes(SMALL))
    assert flops.decode_step_bytes(SMALL, batch, cache_len) == weight_bytes + cache_bytes
    assert (
        flops.decode_step_bytes(SMALL, batch, cache_len, bytes_per_value=2)
        == (weight_bytes + cache_bytes) / 2
    )
