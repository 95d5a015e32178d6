"""LoRA adapters against `peft` on transformers' PyTorch models, both directions, and PEFT format errors.

* peft -> ours: a PEFT adapter directory (random A and B) loaded onto our base with
  `load_pretrained(base, adapter=...)` gives PEFT's logits within 1e-4 (float32);
* ours -> peft: `save_adapter` of our random adapters, loaded by `PeftModel.from_pretrained` onto the
  transformers base, gives our logits within 1e-4; so does our merged `save_pretrained` export.

`peft` is a test-only dependency (the `test` extra); the package never imports it.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from model_fixtures import (
    max_abs_on_valid,
    padded_batch,
    torch_logits,
    torch_reference,
    with_random_adapters,
)

from coevo_jax.checkpoint_formats import CheckpointError, load_pretrained, save_adapter, save_pretrained

BATCH = padded_batch([(12, "right"), (7, "right"), (9, "left"), (3, "left")], total_len=12, seed=5)
FAMILIES = ["llama2", "qwen3"]  # plain attention, and q/k norm after the adapted projections
ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_model(base, **lora_config):
    """`base` wrapped by peft with random (not zero) B: the adapters change the output."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **lora_config)).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_" in name:
                tensor.normal_(0.0, 0.1)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_peft_adapter_loads_onto_our_base(family, tmp_path):
    reference = torch_reference(family)
    reference.save_pretrained(tmp_path / "base")  # before peft replaces its projections
    peft_model = _peft_model(reference, r=4, lora_alpha=8, lora_dropout=0.05, target_modules=ALL_MODULES)
    peft_model.save_pretrained(tmp_path / "adapter")

    ids, mask = BATCH
    expected = torch_logits(peft_model, ids, mask)
    model, _ = load_pretrained(tmp_path / "base", adapter=tmp_path / "adapter")
    cfg = model.config
    assert (cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout) == (4, 8.0, 0.05)
    assert cfg.lora_targets == ("q", "k", "v", "o", "gate", "up", "down")
    error = max_abs_on_valid(np.asarray(model(jnp.asarray(ids), jnp.asarray(mask))), expected, mask)
    with peft_model.disable_adapter():
        base_error = max_abs_on_valid(torch_logits(peft_model, ids, mask), expected, mask)
    print(
        f"\n[peft -> ours] {family}: max|dlogit|={error:.3e} (the adapters move logits by {base_error:.2f})"
    )
    assert error < 1e-4
    assert base_error > 1e-2  # the adapters matter, so the comparison above tests them


@pytest.mark.parametrize("family", FAMILIES)
def test_our_adapter_loads_into_peft_and_merged_export_matches(family, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    reference = torch_reference(family)
    reference.save_pretrained(tmp_path / "base")
    base, _ = load_pretrained(tmp_path / "base")
    model = with_random_adapters(base, lora_rank=3, lora_alpha=6.0, lora_targets=("q", "v", "o", "down"))
    save_adapter(model, tmp_path / "adapter")
    with (tmp_path / "adapter" / "adapter_config.json").open() as f:
        written = json.load(f)
    assert (written["r"], written["lora_alpha"]) == (3, 6.0)
    assert sorted(written["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"]

    ids, mask = BATCH
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    peft_model = PeftModel.from_pretrained(reference, tmp_path / "adapter").eval()
    error = max_abs_on_valid(torch_logits(peft_model, ids, mask), ours, mask)
    base_error = max_abs_on_valid(np.asarray(base(jnp.asarray(ids), jnp.asarray(mask))), ours, mask)
    print(
        f"\n[ours -> peft] {family}: max|dlogit|={error:.3e} (the adapters move logits by {base_error:.2f})"
    )
    assert error < 1e-4
    assert base_error > 1e-2

    save_pretrained(model, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", attn_implementation="eager")
    assert max_abs_on_valid(torch_logits(merged, ids, mask), ours, mask) < 1e-4

    reloaded, _ = load_pretrained(tmp_path / "base", adapter=tmp_path / "adapter")
    np.testing.assert_array_equal(np.asarray(reloaded(jnp.asarray(ids), jnp.asarray(mask))), ours)


def _write_adapter(tmp_path, model, **config_changes):
    save_adapter(model, tmp_path / "adapter")
    path = tmp_path / "adapter" / "adapter_config.json"
    config = {**json.loads(path.read_text()), **config_changes}
    path.write_text(json.dumps(config))
    return tmp_path / "adapter"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"use_rslora": True}, "use_rslora=True is not supported"),
        ({"use_dora": True}, "use_dora=True is not supported"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
        ({"bias": "all"}, "bias='all' is not supported"),
        ({"target_modules": ".*proj"}, "expected a list of projection names"),
        ({"target_modules": ["q_proj", "lm_head"]}, r"\['lm_head'\] are not among"),
        ({"peft_type": "IA3"}, "only 'LORA' adapters"),
    ],
)
def test_unsupported_adapters_are_errors_naming_the_file(changes, message, tmp_path):
    reference = torch_reference("llama2")
    reference.save_pretrained(tmp_path / "base")
    base, _ = load_pretrained(tmp_path / "base")
    adapter = _write_adapter(
        tmp_path, with_random_adapters(base, lora_rank=2, lora_targets=("q",)), **changes
    )
    with pytest.raises(ValueError, match=message) as error:
        load_pretrained(tmp_path / "base", adapter=adapter)
    assert "adapter_config.json" in str(error.value)


def test_adapter_tensors_must_match_the_config(tmp_path):
    reference = torch_reference("llama2")
    reference.save_pretrained(tmp_path / "base")
    base, _ = load_pretrained(tmp_path / "base")
    # The weights hold q and v adapters, the config claims q, v and o.
    model = with_random_adapters(base, lora_rank=2, lora_targets=("q", "v"))
    adapter = _write_adapter(tmp_path, model, target_modules=["q_proj", "v_proj", "o_proj"])
    with pytest.raises(CheckpointError, match=r"missing tensor .*o_proj\.lora_A"):
        load_pretrained(tmp_path / "base", adapter=adapter)
    adapter = _write_adapter(tmp_path, model, r=4)
    with pytest.raises(CheckpointError, match=r"has shape \(2, 64\), expected \(4, 64\)"):
        load_pretrained(tmp_path / "base", adapter=adapter)
    with pytest.raises(FileNotFoundError, match="adapter_config.json: missing"):
        load_pretrained(tmp_path / "base", adapter=tmp_path / "base")
