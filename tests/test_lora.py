"""LoRA in the decoder and the sampler: fresh adapters change nothing, adapters are their own parameters
sharded like their base weights, merging equals applying them, dropout only with a key, config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from model_fixtures import KITCHEN_SINK, padded_batch, random_decoder, with_random_adapters
from train_fixtures import MESHES, TINY, mesh_of

from coevo_jax import sharding
from coevo_jax.models import Decoder, abstract_model, combine_trainable, partition_trainable
from coevo_jax.models.lora import merged_params
from coevo_jax.sampling import Sampler, SamplingConfig

LORA = dict(lora_rank=4, lora_alpha=8.0)
ALL_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _flat(params: dict) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)}


def test_fresh_adapters_leave_the_base_weights_and_logits_exactly_unchanged():
    base = Decoder(KITCHEN_SINK, rngs=nnx.Rngs(3))
    lora_cfg = KITCHEN_SINK.replace(**LORA)
    lora = Decoder(lora_cfg, rngs=nnx.Rngs(3))
    adapters, frozen = partition_trainable(nnx.to_pure_dict(nnx.state(lora, nnx.Param)), lora_cfg)
    # Adapters are drawn after every base weight: the same key gives the same base, bit for bit.
    expected = _flat(nnx.to_pure_dict(nnx.state(base, nnx.Param)))
    assert _flat(frozen).keys() == expected.keys()
    for name, value in _flat(frozen).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)
    for name, value in _flat(adapters).items():
        assert np.all(value == 0) if name.endswith("['b']") else np.std(value) > 0, name
    ids, mask = padded_batch([(10, "right"), (6, "left")], total_len=10)
    np.testing.assert_array_equal(
        np.asarray(lora(jnp.asarray(ids), jnp.asarray(mask))),
        np.asarray(base(jnp.asarray(ids), jnp.asarray(mask))),
    )


def test_adapters_are_lora_params_with_the_logical_axes_and_shardings_of_their_base_weight():
    cfg = TINY.replace(**LORA)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    adapters = nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    assert len(adapters) == 2 * len(ALL_TARGETS)  # A and B per target, each stacked over the layers
    assert all(type(variable) is nnx.LoRAParam for _, variable in adapters)
    q, layers = model.layers.attn.q_lora, cfg.num_layers  # stacked: a leading 'layers' axis
    assert q.a.get_value().shape == (layers, 64, 4) and q.b.get_value().shape == (layers, 4, 4, 16)
    assert q.a.get_metadata()["out_sharding"] == ("layers", "embed", "lora_rank")
    assert q.b.get_metadata()["out_sharding"] == ("layers", "lora_rank", "q_heads", "head_dim")
    o = model.layers.attn.o_lora
    assert o.a.get_metadata()["out_sharding"] == ("layers", "q_heads", "head_dim", "lora_rank")
    _, abstract = abstract_model(cfg)
    specs = jax.tree.map(
        lambda s: s.spec,
        sharding.param_shardings(abstract, mesh_of(MESHES["cube2"]), sharding.ShardingRules()),
    )
    layer = specs["layers"]
    assert layer["attn"]["q_kernel"] == P(None, "fsdp", "tensor", None)
    assert layer["attn"]["q_lora"] == {"a": P(None, "fsdp", None), "b": P(None, None, "tensor", None)}
    assert layer["attn"]["o_lora"] == {"a": P(None, "tensor", None, None), "b": P(None, None, "fsdp")}
    assert layer["mlp"]["down_lora"] == {"a": P(None, "tensor", None), "b": P(None, None, "fsdp")}


def test_partition_and_combine_are_inverse_and_full_fine_tuning_trains_everything():
    cfg = TINY.replace(lora_rank=2, lora_targets=("v", "up"))
    params = nnx.to_pure_dict(nnx.state(Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param))
    trainable, frozen = partition_trainable(params, cfg)
    assert set(trainable["layers"]) == {"attn", "mlp"}
    assert set(trainable["layers"]["attn"]) == {"v_lora"} and set(trainable["layers"]["mlp"]) == {"up_lora"}
    assert "v_lora" not in frozen["layers"]["attn"] and "embed" in frozen
    assert _flat(combine_trainable(trainable, frozen)).keys() == _flat(params).keys()
    base_params = nnx.to_pure_dict(nnx.state(Decoder(TINY, rngs=nnx.Rngs(0)), nnx.Param))
    trainable, frozen = partition_trainable(base_params, TINY)
    assert trainable is base_params and frozen == {}


def test_merged_weights_compute_what_the_adapters_compute():
    model = with_random_adapters(random_decoder(KITCHEN_SINK, seed=1), seed=2, **LORA)
    cfg = model.config
    merged = nnx.merge(
        abstract_model(cfg.without_lora())[0],
        merged_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)), cfg),
    )
    ids, mask = padded_batch([(12, "right"), (7, "left"), (3, "left")], total_len=12, seed=4)
    lora_logits = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    merged_logits = np.asarray(merged(jnp.asarray(ids), jnp.asarray(mask)))
    base_logits = np.asarray(random_decoder(KITCHEN_SINK, seed=1)(jnp.asarray(ids), jnp.asarray(mask)))
    valid = mask.astype(bool)
    assert np.abs(lora_logits - base_logits)[valid].max() > 0.1  # the adapters matter
    np.testing.assert_allclose(merged_logits[valid], lora_logits[valid], atol=2e-5, rtol=1e-5)


def test_dropout_acts_only_with_a_key_and_a_rate():
    model = with_random_adapters(random_decoder(TINY), lora_rank=4, lora_dropout=0.5)
    ids, mask = padded_batch([(16, "right"), (11, "right")], total_len=16)
    ids, mask = jnp.asarray(ids % TINY.vocab_size), jnp.asarray(mask)
    hidden = lambda key=None: np.asarray(model.hidden_states(ids, mask, key))
    np.testing.assert_array_equal(hidden(), hidden())  # no key: deterministic (sampling, reference, eval)
    key = jax.random.key(0)
    np.testing.assert_array_equal(hidden(key), hidden(key))  # the masks are a function of the key
    assert np.abs(hidden(key) - hidden()).max() > 1e-3
    assert np.abs(hidden(key) - hidden(jax.random.key(1))).max() > 1e-3
    no_rate = with_random_adapters(random_decoder(TINY), lora_rank=4)
    np.testing.assert_array_equal(
        np.asarray(no_rate.hidden_states(ids, mask, key)), np.asarray(no_rate.hidden_states(ids, mask))
    )


def test_lora_config_is_checked_and_canonical():
    cfg = TINY.replace(lora_rank=8, lora_targets=["down", "q"])
    assert cfg.lora_targets == ("q", "down") and cfg.lora_scale == 2.0
    same = TINY.replace(lora_rank=8, lora_targets=("q", "down"))
    assert cfg == same and hash(cfg) == hash(same)
    assert cfg.without_lora() == TINY
    assert TINY.to_hf() == cfg.to_hf()  # the HF config describes the base (or the merged model)
    for bad, message in [
        (dict(lora_rank=-1), "lora_rank"),
        (dict(lora_rank=4, lora_targets=("q", "lm_head")), "lora_targets"),
        (dict(lora_rank=4, lora_targets=()), "lora_targets"),
        (dict(lora_rank=4, lora_dropout=1.0), "lora_dropout"),
        (dict(lora_rank=4, lora_alpha=0.0), "lora_alpha"),
    ]:
        with pytest.raises(ValueError, match=message):
            TINY.replace(**bad)


@pytest.mark.parametrize("greedy", [True, False])
def test_merged_sampling_equals_unmerged_sampling(greedy):
    model = with_random_adapters(random_decoder(TINY, seed=5), seed=6, lora_rank=4, lora_alpha=8.0)
    sampling = SamplingConfig(temperature=0.0 if greedy else 1.0, max_new_tokens=12)
    merged, params = Sampler.for_model(model, batch_size=3, cache_len=64, sampling=sampling)
    unmerged = Sampler(model.config, batch_size=3, cache_len=64, sampling=sampling, merge_lora=False)
    assert merged.merge_lora and not unmerged.merge_lora
    merged_weights = merged.weights(params)
    assert "q_lora" not in merged_weights["layers"]["attn"]  # the base architecture's programs
    assert unmerged.weights(params) is params
    prompts = [[5, 17, 33, 2], [9] * 7, [101, 3]]
    key = jax.random.split(jax.random.key(0), 3)
    assert merged.generate(params, prompts, key) == unmerged.generate(params, prompts, key)
    cache_a, cache_b = merged.init_cache(), unmerged.init_cache()
    chunks, starts = prompts, np.zeros(3, np.int32)
    logits_a, _ = merged.prefill(merged_weights, cache_a, chunks, starts)
    logits_b, _ = unmerged.prefill(params, cache_b, chunks, starts)
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), atol=2e-5, rtol=1e-5)
    base_logits, _ = Sampler.for_model(random_decoder(TINY, seed=5), batch_size=3, cache_len=64)[0].prefill(
        nnx.to_pure_dict(nnx.state(random_decoder(TINY, seed=5))), merged.init_cache(), chunks, starts
    )
    assert np.abs(np.asarray(base_logits) - np.asarray(logits_a)).max() > 0.1  # the adapters matter
