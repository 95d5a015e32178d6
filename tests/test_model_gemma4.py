"""Gemma 4's text decoder against transformers' `Gemma4ForCausalLM`, and its cache, in float32.

Tiny random checkpoints of three shapes (`gemma4_fixtures.SHAPES`) load with transformers' logits within
1e-4 and save back to a directory transformers reloads to the same logits; the multimodal checkpoint's text
stack loads too. Cached decoding, a fresh prefill and incremental chunks equal the full pass token by token,
across windows shorter than the history and with KV sharing.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gemma4_fixtures import SHAPES, gemma4_logits, gemma4_reference
from model_fixtures import max_abs_on_valid, padded_batch
from seeds import fresh_seed

from coevo_jax.checkpoint_formats import load_pretrained, save_pretrained
from coevo_jax.checkpoint_formats.safetensors_io import SINGLE_FILE
from coevo_jax.models import ModelConfig, init_cache

# Full row, right-padded, left-padded, short left-padded.
BATCH = padded_batch([(12, "right"), (7, "right"), (9, "left"), (3, "left")], total_len=12, seed=3)


# The shape with every option runs by default; the other two are slow (about 40 s each).
@pytest.fixture(
    scope="module",
    params=[pytest.param(s, marks=[] if s == "kv_shared" else pytest.mark.slow) for s in SHAPES],
)
def checkpoint(request, tmp_path_factory):
    """(shape name, torch reference, its checkpoint directory, our model loaded from it)."""
    reference = gemma4_reference(request.param)
    path = tmp_path_factory.mktemp(request.param) / "hf"
    reference.save_pretrained(path)
    model, _ = load_pretrained(path)
    return request.param, reference, path, model


def test_load_matches_transformers_and_save_roundtrips(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM, Gemma4ForCausalLM

    shape, reference, _, model = checkpoint
    cfg = model.config
    assert cfg.model_type == "gemma4_text" and len(cfg.layer_kinds) >= 2
    assert cfg.num_kv_shared_layers == SHAPES[shape].get("num_kv_shared_layers", 0)
    ids, mask = BATCH
    expected = gemma4_logits(reference, ids, mask)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    load_error = max_abs_on_valid(ours, expected, mask)
    assert load_error < 1e-4, f"{shape}: max abs logit error {load_error}"

    save_pretrained(model, tmp_path / "ours")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager")
    assert type(reloaded) is Gemma4ForCausalLM
    save_error = max_abs_on_valid(gemma4_logits(reloaded, ids, mask), expected, mask)
    assert save_error <= 1e-6, f"{shape}: save/reload error {save_error}"
    read = ModelConfig.from_hf(reference.config.to_dict())
    assert ModelConfig.from_hf(read.to_hf()) == read
    print(f"\n[gemma4 parity] {shape}: load max|dlogit|={load_error:.3e}  save->torch {save_error:.3e}")


def test_the_multimodal_checkpoint_loads_its_text_stack(checkpoint, tmp_path):
    """A `gemma4` directory (text_config, `model.language_model.*` tensors beside a tower's) loads as the
    text model it holds."""
    from safetensors.numpy import load_file, save_file

    shape, _, path, model = checkpoint
    text = json.loads((path / "config.json").read_text())
    tensors = {
        name.replace("model.", "model.language_model.", 1): t
        for name, t in load_file(path / SINGLE_FILE).items()
    }
    tensors["model.vision_tower.patch_embedder.weight"] = np.zeros((4, 4), np.float32)
    (tmp_path / "mm").mkdir()
    save_file(tensors, tmp_path / "mm" / SINGLE_FILE)
    config = {"model_type": "gemma4", "text_config": text, "tie_word_embeddings": text["tie_word_embeddings"]}
    (tmp_path / "mm" / "config.json").write_text(json.dumps(config))
    multimodal, _ = load_pretrained(tmp_path / "mm")
    assert multimodal.config == model.config
    ids, mask = BATCH
    np.testing.assert_array_equal(
        np.asarray(multimodal(jnp.asarray(ids), jnp.asarray(mask))),
        np.asarray(model(jnp.asarray(ids), jnp.asarray(mask))),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"enable_moe_block": True}, "mixture-of-experts"),
        ({"hidden_size_per_layer_input": 256}, "per-layer input embeddings"),
        ({"use_bidirectional_attention": "all"}, "bidirectional"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 8.0}}},
            "full_attention rope",
        ),
    ],
)
def test_what_the_decoder_does_not_compute_is_refused(change, message):
    text = {
        "model_type": "gemma4_text",
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf({**text, **change})
    with pytest.raises(ValueError, match="text_config of model_type 'gemma4_text'"):
        ModelConfig.from_hf({"model_type": "gemma4", "text_config": {"model_type": "gemma4_vision"}})


def test_cached_decoding_matches_the_full_pass_token_by_token(checkpoint):
    """A fresh prefill of 5 tokens, an incremental chunk of 3, then one token at a time to 16: every step's
    logits are the full pass's at those positions (windows of 3-5 slide past the prefill)."""
    shape, _, _, model = checkpoint
    seed = fresh_seed()
    rng = np.random.RandomState(seed)
    lengths = [16, 13, 10]
    ids = rng.randint(1, 300, size=(3, 16)).astype(np.int32)
    mask = (np.arange(16)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    full = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    step = nnx.jit(lambda m, i, c, k: m.forward_cached(i, c, k))
    prefill = nnx.jit(lambda m, i, c, k: m.forward_cached(i, c, k, fresh=True))
    cache = init_cache(model.config, batch=3, max_len=16)
    logits, cache = prefill(model, jnp.asarray(ids[:, :5]), cache, jnp.asarray(mask[:, :5]))
    got = [np.asarray(logits)]
    logits, cache = step(model, jnp.asarray(ids[:, 5:8]), cache, jnp.asarray(mask[:, 5:8]))
    got.append(np.asarray(logits))
    for t in range(8, 16):
        logits, cache = step(model, jnp.asarray(ids[:, t : t + 1]), cache, jnp.asarray(mask[:, t : t + 1]))
        got.append(np.asarray(logits))
    cached = np.concatenate(got, axis=1)
    error = max_abs_on_valid(cached, full, mask)
    print(f"[gemma4 cache] {shape}: max|dlogit| cached vs full = {error:.3e} (seed {seed})")
    assert error < 5e-5  # float32 rounding of other summation orders: 1.6e-5 seen on some seeds
    np.testing.assert_array_equal(np.asarray(cache.lengths_B), lengths)


def test_softcapped_log_probs_and_their_gradient_match_the_logits(checkpoint):
    """The train steps' memory-lean log-probs (hidden states and unembedding, chunk by chunk) cap the
    logits as the model does, forward and backward."""
    from coevo_jax import losses

    shape, _, _, model = checkpoint
    cap = model.config.final_logit_softcap
    ids, mask = BATCH
    targets = np.roll(ids, -1, axis=1)
    hidden = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask))
    unembed = model.unembedding

    def lean(h, u, keep):
        logps = losses.token_logprobs_from_hidden(
            h, u, jnp.asarray(targets), 8, keep_logits=keep, softcap=cap
        )
        return jnp.sum(jnp.where(mask > 0, logps, 0.0))

    def direct(h, u):
        logits = jnp.einsum("btd,dv->btv", h, u)
        logits = logits if cap is None else cap * jnp.tanh(logits / cap)
        return jnp.sum(jnp.where(mask > 0, losses.token_logprobs(logits, jnp.asarray(targets)), 0.0))

    want, want_grads = jax.value_and_grad(direct, argnums=(0, 1))(hidden, unembed)
    for keep in (True, False):
        got, grads = jax.value_and_grad(lean, argnums=(0, 1))(hidden, unembed, keep)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        for g, w in zip(grads, want_grads, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
