"""Qwen3.5's text decoder against transformers' `Qwen3_5ForCausalLM`, and its cache, in float32.

Tiny random checkpoints of two shapes (`qwen3_5_fixtures.SHAPES`: linear and full layers mixed) load with
the logits of transformers run in float64 within 1e-4, on a padded batch and past the delta rule's
64-token chunk, and save back to a directory transformers reloads to the same logits; the multimodal
checkpoint's text stack loads too. Cached decoding (a fresh prefill, an incremental chunk with padding
inside it, then one token at a time) equals the full pass token by token; no gradient reaches back from a
later position (slow); a LoRA adapter saves as a PEFT adapter peft loads with the same logits.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_fixtures import max_abs_on_valid, padded_batch
from qwen3_5_fixtures import SHAPES, qwen3_5_logits, qwen3_5_reference
from seeds import fresh_seed

from coevo_jax.checkpoint_formats import load_pretrained, save_pretrained
from coevo_jax.checkpoint_formats.safetensors_io import SINGLE_FILE
from coevo_jax.models import ModelConfig, init_cache

# Full row, right-padded, left-padded, short left-padded; and rows past one chunk of the delta rule.
BATCH = padded_batch([(12, "right"), (7, "right"), (9, "left"), (3, "left")], total_len=12, seed=3)
LONG = padded_batch([(80, "right"), (70, "left")], total_len=80, seed=4)


@pytest.fixture(scope="module", params=list(SHAPES))
def checkpoint(request, tmp_path_factory):
    """(shape name, torch reference, its checkpoint directory, our model loaded from it)."""
    reference = qwen3_5_reference(request.param)
    path = tmp_path_factory.mktemp(request.param) / "hf"
    reference.save_pretrained(path)
    model, _ = load_pretrained(path)
    return request.param, reference, path, model


def _float64_logits(reference, ids, mask) -> list[np.ndarray]:
    """transformers' logits in float64 for each row's valid tokens alone (no padding: transformers' float64
    attention turns fully masked padding rows into NaN)."""
    import copy

    import torch

    exact = copy.deepcopy(reference).double()
    rows = []
    with torch.no_grad():
        for row_ids, row_mask in zip(ids, mask, strict=True):
            row = torch.tensor(row_ids[row_mask > 0][None], dtype=torch.long)
            rows.append(exact(input_ids=row).logits[0].numpy())
    return rows


def test_load_matches_transformers_and_save_roundtrips(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3_5ForCausalLM

    shape, reference, _, model = checkpoint
    cfg = model.config
    assert cfg.model_type == "qwen3_5_text" and set(cfg.layer_kinds) == {"linear_attention", "full_attention"}
    errors = {}
    for name, (ids, mask) in [("batch", BATCH), ("long", LONG)]:
        ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
        exact = _float64_logits(reference, ids, mask)
        errors[name] = max(
            float(np.abs(o[m > 0] - e).max()) for o, m, e in zip(ours, mask, exact, strict=True)
        )
        float32 = max_abs_on_valid(ours, qwen3_5_logits(reference, ids, mask), mask)
        print(f"\n[qwen3.5 parity] {shape} {name}: vs float64 {errors[name]:.3e}, vs float32 {float32:.3e}")
    assert max(errors.values()) < 1e-4, f"{shape}: max abs logit error {errors}"

    ids, mask = BATCH
    expected = qwen3_5_logits(reference, ids, mask)
    save_pretrained(model, tmp_path / "ours")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager")
    assert type(reloaded) is Qwen3_5ForCausalLM
    save_error = max_abs_on_valid(qwen3_5_logits(reloaded, ids, mask), expected, mask)
    assert save_error <= 1e-6, f"{shape}: save/reload error {save_error}"
    read = ModelConfig.from_hf(reference.config.to_dict())
    assert read.replace(platform=cfg.platform, kernels=cfg.kernels, attention=cfg.attention) == cfg
    assert ModelConfig.from_hf(read.to_hf()) == read
    print(f"[qwen3.5 parity] {shape}: save->torch {save_error:.3e}")


def test_the_multimodal_checkpoint_loads_its_text_stack(checkpoint, tmp_path):
    """A `qwen3_5` directory (text_config, `model.language_model.*` tensors beside a vision tower's and the
    multi-token-prediction head's) loads as the text model it holds."""
    from safetensors.numpy import load_file, save_file

    _, _, path, model = checkpoint
    text = json.loads((path / "config.json").read_text())
    tensors = {
        name.replace("model.", "model.language_model.", 1): t
        for name, t in load_file(path / SINGLE_FILE).items()
    }
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((4, 4), np.float32)
    tensors["mtp.fc.weight"] = np.zeros((4, 4), np.float32)
    (tmp_path / "mm").mkdir()
    save_file(tensors, tmp_path / "mm" / SINGLE_FILE)
    config = {
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_vision"},
        "tie_word_embeddings": text["tie_word_embeddings"],
    }
    (tmp_path / "mm" / "config.json").write_text(json.dumps(config))
    multimodal, _ = load_pretrained(tmp_path / "mm")
    assert multimodal.config == model.config
    ids, mask = BATCH
    np.testing.assert_array_equal(
        np.asarray(multimodal(jnp.asarray(ids), jnp.asarray(mask))),
        np.asarray(model(jnp.asarray(ids), jnp.asarray(mask))),
    )


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model_type": "qwen3_5_moe_text"}, "mixture-of-experts"),
        ({"model_type": "qwen3_5_text", "num_experts": 8}, "mixture-of-experts"),
        ({"model_type": "qwen3_5_text", "attention_bias": True}, "attention_bias"),
        ({"model_type": "qwen3_5_text", "hidden_act": "gelu"}, "hidden_act"),
        ({"model_type": "qwen3_5_text", "rope_parameters": {"rope_type": "yarn"}}, "rope_type"),
        ({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_vision"}}, "text_config"),
    ],
)
def test_what_the_decoder_does_not_compute_is_refused(config, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(config)


def test_default_layer_types_are_transformers():
    """Without `layer_types`, every fourth layer is full attention, as `Qwen3_5TextConfig` fills them."""
    from transformers import Qwen3_5TextConfig

    read = ModelConfig.from_hf({"model_type": "qwen3_5_text", "num_hidden_layers": 8})
    assert list(read.layer_types) == Qwen3_5TextConfig(num_hidden_layers=8).layer_types
    assert read.rotary_dim == 64  # a quarter of the 256-wide heads turns


def test_cached_decoding_matches_the_full_pass_token_by_token(checkpoint):
    """A fresh prefill of 5 tokens, an incremental chunk of 3 (one row with a hole in it), then one token at a
    time to 16: every step's logits are the full pass's at those positions, and a padding token inside a
    chunk changes nothing (the full pass of the row without it gives the same logits). Within 1e-4, as
    against transformers: the gated norm scales up float32 rounding in these random models (errors of
    1e-6 to 5e-5 at random positions, float64 compute alike, as the float32 RoPE and norm statistics stay)."""
    shape, _, _, model = checkpoint
    seed = fresh_seed()
    rng = np.random.RandomState(seed)
    lengths = [16, 13, 10]
    ids = rng.randint(1, 300, size=(3, 16)).astype(np.int32)
    mask = (np.arange(16)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    mask[1, 6] = 0  # a hole in the middle of row 1's incremental chunk
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
    without_hole = np.asarray(model(jnp.asarray(ids[1:2, mask[1] > 0])))[0]
    hole_error = float(np.abs(full[1, mask[1] > 0] - without_hole).max())
    print(f"[qwen3.5 cache] {shape}: cached vs full {error:.3e}, hole vs none {hole_error:.3e}")
    assert error < 1e-4 and hole_error < 1e-4
    np.testing.assert_array_equal(np.asarray(cache.lengths_B), np.sum(mask, axis=1))


@pytest.mark.slow  # compiles the backward pass of each shape
def test_gradients_to_future_positions_are_zero(checkpoint):
    """The delta rule's chunks, the convolution and the padding moves are causal: position 5's logits
    depend on no later input (exactly zero gradient), and on every earlier one (left padding included)."""
    _, _, _, model = checkpoint
    ids, mask = LONG
    embeddings = model.embed_tokens(jnp.asarray(ids))

    picks = [(0, 70), (1, 40)]  # past a chunk boundary; row 1 has 10 padding tokens first

    def logit_sum(x):  # rows are independent: row r's gradient is that of its own pick alone
        logits = model.logits_from_hidden(model.hidden_states_from_embeddings(x, jnp.asarray(mask)))
        return sum(jnp.sum(logits[row, position]) for row, position in picks)

    grads = np.asarray(jax.jit(jax.grad(logit_sum))(embeddings))
    for row, position in picks:
        assert np.all(grads[row, position + 1 :] == 0)
        live = np.flatnonzero(mask[row][: position + 1])
        assert np.all(np.abs(grads[row, live]).max(axis=-1) > 0)


def test_a_lora_adapter_saves_as_a_peft_adapter_peft_loads(checkpoint, tmp_path):
    """Adapters on every target (the gated query, keys, values and output of the full layers, every layer's
    MLP) save as a PEFT adapter that peft puts on transformers' model with our logits; linear-attention
    layers carry none (PEFT's q/k/v/o names are not theirs)."""
    from peft import PeftModel

    from coevo_jax.checkpoint_formats import save_adapter
    from coevo_jax.models import Decoder

    shape, _, path, model = checkpoint
    lora = Decoder(model.config.replace(lora_rank=4), rngs=nnx.Rngs(1))
    base = dict(nnx.to_flat_state(nnx.state(model)))
    rng = np.random.RandomState(fresh_seed())
    state = nnx.state(lora)
    for key, variable in nnx.to_flat_state(state):
        if key in base:
            variable.set_value(base[key].get_value())
        elif key[-1] == "b":  # B starts at zero: give the adapters something to add
            variable.set_value(
                jnp.asarray(0.1 * rng.standard_normal(variable.get_value().shape), jnp.float32)
            )
    lora = nnx.merge(nnx.graphdef(lora), state)
    save_adapter(lora, tmp_path / "adapter")
    peft_model = PeftModel.from_pretrained(qwen3_5_reference(shape), tmp_path / "adapter").eval()
    ids, mask = BATCH
    ours = np.asarray(lora(jnp.asarray(ids), jnp.asarray(mask)))
    error = max_abs_on_valid(ours, qwen3_5_logits(peft_model, ids, mask), mask)
    moved = max_abs_on_valid(ours, np.asarray(model(jnp.asarray(ids), jnp.asarray(mask))), mask)
    print(f"[qwen3.5 lora] {shape}: peft vs ours {error:.3e}, adapters move the logits by {moved:.3e}")
    assert error < 1e-4 and moved > 1e-2
