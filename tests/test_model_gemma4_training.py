"""Gemma 4 in training: FSDP on 8 CPU devices equals one device, and LoRA adapters round-trip through PEFT.

The sharded reference log-probs (action tokens, eq. 2) and one SFT then DPO step (eq. 7) of a tiny Gemma 4
with sliding / full layers, keys as values and KV sharing match the single-device ones; a LoRA adapter on
its projections saves as a PEFT adapter that peft puts on transformers' model with the same logits.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemma4_fixtures import gemma4_logits, gemma4_reference
from model_fixtures import max_abs_on_valid, padded_batch, with_random_adapters
from train_fixtures import (
    MESHES,
    SCALARS,
    dpo_batch,
    fresh_state,
    mesh_of,
    placed,
    setup,
    single_mesh,
    to_numpy,
    with_reference,
)

from coevo_jax.checkpoint_formats import load_pretrained, save_adapter, save_pretrained
from coevo_jax.models import ModelConfig
from coevo_jax.train import StepKind

# Vocabulary 256, as the train fixtures' batches draw their tokens.
GEMMA4_TINY = ModelConfig.from_hf(
    {
        "model_type": "gemma4_text",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 1,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 0,
    }
)


def _reference_and_dpo_step(mesh):
    """(reference log-probs of a DPO batch, the DPO step's loss, gradients and updated params) on `mesh`.
    One step from the reference itself: a step before it would let Adam's amplified round-off (|g| ~ eps)
    move the embedding first and every later gradient with it."""
    _, shardings, steps, _, rules = setup(mesh, model_cfg=GEMMA4_TINY, return_grads=True)
    state = fresh_state(shardings, model_cfg=GEMMA4_TINY)
    dpo_b = with_reference(steps, state, placed(dpo_batch(1, real=7), mesh, rules))
    reference = to_numpy((dpo_b["ref_chosen_logps"], dpo_b["ref_rejected_logps"]))
    state, metrics = steps.step(StepKind.DPO)(state, dpo_b, SCALARS)
    return reference, float(metrics["loss"]), to_numpy(metrics["grads"]), to_numpy(state.params)


@pytest.mark.slow
def test_fsdp_reference_and_dpo_step_match_one_device():
    single = _reference_and_dpo_step(single_mesh())
    sharded = _reference_and_dpo_step(mesh_of(MESHES["data2_fsdp4"]))
    for got, want in zip(sharded[0], single[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(single[0][0])) and np.ptp(single[0][0]) > 0
    np.testing.assert_allclose(sharded[1], single[1], rtol=1e-5)
    # float32 sums of differently sharded partial products: tolerance relative to the largest gradient
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(single[2]))
    close = lambda atol: lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol)
    jax.tree.map(close(max(1e-6, 2e-5 * scale)), sharded[2], single[2])
    # Adam's first update lr * g / (|g| + eps): where |g| is near eps the round-off above moves it by a few
    # per cent of lr = 1e-3 (3.8e-5 seen on one element of 8,192)
    jax.tree.map(close(1e-4), sharded[3], single[3])


def test_lora_adapter_loads_into_peft_and_back(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    reference = gemma4_reference("kv_shared")
    reference.save_pretrained(tmp_path / "base")
    base, _ = load_pretrained(tmp_path / "base")
    targets = ("q", "k", "v", "o", "gate", "down")
    model = with_random_adapters(base, lora_rank=3, lora_alpha=6.0, lora_targets=targets)
    save_adapter(model, tmp_path / "adapter")
    ids, mask = padded_batch([(12, "right"), (9, "left"), (5, "left")], total_len=12, seed=5)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    peft_model = PeftModel.from_pretrained(reference, tmp_path / "adapter").eval()
    error = max_abs_on_valid(gemma4_logits(peft_model, ids, mask), ours, mask)
    moved = max_abs_on_valid(np.asarray(base(jnp.asarray(ids), jnp.asarray(mask))), ours, mask)
    print(f"\n[gemma4 ours -> peft] max|dlogit|={error:.3e} (the adapters move logits by {moved:.2f})")
    assert error < 1e-4
    assert moved > 1e-2

    save_pretrained(model, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", attn_implementation="eager")
    assert max_abs_on_valid(gemma4_logits(merged, ids, mask), ours, mask) < 1e-4
    reloaded, _ = load_pretrained(tmp_path / "base", adapter=tmp_path / "adapter")
    np.testing.assert_array_equal(np.asarray(reloaded(jnp.asarray(ids), jnp.asarray(mask))), ours)
