"""Parity with transformers' PyTorch models for each supported family, through our checkpoint I/O.

For each family: torch model -> `save_pretrained` (transformers) -> our `load_pretrained` -> logits on a
padded batch agree within 1e-4; then our `save_pretrained` -> transformers reload gives the original
torch logits (<= 1e-6). Measured errors are printed (run with `-s`) and kept in `PARITY_ERRORS`.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from model_fixtures import max_abs_on_valid, padded_batch, torch_logits, torch_reference

from coevo_jax.checkpoint_formats import load_pretrained, save_pretrained
from coevo_jax.models import ModelConfig

FAMILIES = ["llama2", "llama3", "qwen2", "qwen3", "smollm2"]
PARITY_ERRORS: dict[str, tuple[float, float]] = {}

# Full row, right-padded, left-padded, short left-padded.
BATCH = padded_batch([(12, "right"), (7, "right"), (9, "left"), (3, "left")], total_len=12, seed=3)


@pytest.mark.parametrize("family", FAMILIES)
def test_load_matches_torch_and_save_roundtrips(family, tmp_path):
    from transformers import AutoModelForCausalLM

    reference = torch_reference(family)
    reference.save_pretrained(tmp_path / "hf")
    model, tokenizer = load_pretrained(tmp_path / "hf")
    assert tokenizer is None
    cfg = model.config
    assert cfg.tie_word_embeddings == (family == "smollm2")
    assert cfg.qk_norm == (family == "qwen3")
    assert (cfg.rope_scaling is not None) == (family == "llama3")
    assert cfg.attention_bias == (family == "qwen2")

    ids, mask = BATCH
    expected = torch_logits(reference, ids, mask)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    load_error = max_abs_on_valid(ours, expected, mask)
    assert load_error < 1e-4, f"{family}: max abs logit error {load_error}"

    save_pretrained(model, tmp_path / "ours")
    if family == "smollm2":
        with (tmp_path / "ours" / "config.json").open() as f:
            assert json.load(f)["tie_word_embeddings"] is True
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager")
    assert type(reloaded) is type(reference)
    save_error = max_abs_on_valid(torch_logits(reloaded, ids, mask), expected, mask)
    assert save_error <= 1e-6, f"{family}: save/reload error {save_error}"

    PARITY_ERRORS[family] = (load_error, save_error)
    print(f"\n[parity] {family}: load max|dlogit|={load_error:.3e}  save->torch max|dlogit|={save_error:.3e}")


@pytest.mark.parametrize("family", FAMILIES)
def test_config_roundtrip(family):
    hf_config = torch_reference(family).config.to_dict()
    cfg = ModelConfig.from_hf(hf_config)
    assert ModelConfig.from_hf(cfg.to_hf()) == cfg


def test_config_reads_legacy_and_new_rope_layouts():
    base = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    legacy = ModelConfig.from_hf(
        {**base, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", **scaling}}
    )
    legacy_type = ModelConfig.from_hf(
        {**base, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **scaling}}
    )
    new = ModelConfig.from_hf(
        {**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **scaling}}
    )
    assert legacy == new == legacy_type
    assert new.rope_theta == 5e5 and new.rope_scaling.factor == 8.0
    assert new.head_dim == 4 and new.num_kv_heads == 2
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})
