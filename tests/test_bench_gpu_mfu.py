"""`bench/gpu_mfu.py`: its weightless model shapes, its FLOP accounting and one tiny step on the CPU."""

import dataclasses
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import flops  # noqa: E402
import gpu_mfu  # noqa: E402
import shapes  # noqa: E402


def test_the_smollm2_shape_is_the_bundled_ggufs():
    pytest.importorskip("gguf")
    try:
        from_gguf = shapes.smollm2_config(jnp.bfloat16, remat=True)
    except FileNotFoundError as error:
        pytest.skip(str(error))
    # the special token ids play no part in a step's shapes or cost
    no_ids = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    assert gpu_mfu.model_config("smollm2_135m", remat=True) == dataclasses.replace(from_gguf, **no_ids)


def test_flops_model_fields_count_the_llama_1b_shape():
    cfg = gpu_mfu.model_config("llama_1b", remat=False)
    # Llama-3.2-1B: 1.236e9 parameters, of which the tied embedding is 262.7M; every other weight but the
    # norms takes part in a matmul, and the tied table is read once more as the unembedding.
    norms = cfg.hidden_size * (2 * cfg.num_layers + 1)
    embedding = cfg.vocab_size * cfg.hidden_size
    assert flops.matmul_params(flops.model_fields(cfg)) == 1_235_814_400 - norms
    assert embedding == 262_668_288


def test_peak_lookup():
    assert gpu_mfu.peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert gpu_mfu.peak_tflops("NVIDIA H200") == 989.4
    assert gpu_mfu.peak_tflops("cpu") is None


def test_one_tiny_case_runs(monkeypatch):
    tiny = dict(
        gpu_mfu.MODELS["smollm2_135m"],
        num_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=256,
    )
    monkeypatch.setitem(gpu_mfu.MODELS, "tiny", tiny)
    case = gpu_mfu.bench_case("tiny", remat=True, pairs=2, length=32, warmup=1, timed=1)
    cfg = gpu_mfu.model_config("tiny", remat=True)
    assert case["useful_tflop_per_step"] * 1e12 == pytest.approx(
        flops.dpo_step_flops(flops.model_fields(cfg), 2, 32, reference_forward=False)
    )
    assert case["tokens_per_s"] > 0 and jnp.isfinite(case["final_loss"])
