"""`bench/gpu_mfu.py`: its weightless model shapes, its FLOP accounting and one tiny step on the CPU."""

import argparse
import dataclasses

import common
import flops
import gpu_mfu
import jax.numpy as jnp
import op_profile
import pytest

from coevo_jax.train import ObjectiveConfig


def test_the_smollm2_shape_is_the_bundled_ggufs():
    pytest.importorskip("gguf")
    try:
        from_gguf = common.smollm2_config(jnp.bfloat16, remat=True)
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


def test_cases_name_remat_pairs_attention_and_options():
    args = lambda *case, **grid: argparse.Namespace(case=list(case), **grid)
    specs = ("llama_1b,off,8,cudnn", "smollm2_135m,on,16,blocked,right_padded,unroll")
    assert gpu_mfu.cases_from_args(args(*specs), ("cudnn", "blocked")) == [
        ("llama_1b", False, 8, "cudnn", ()),
        ("smollm2_135m", True, 16, "blocked", ("unroll", "right_padded")),
    ]
    grid = dict(models=["llama_1b"], remat=["on", "off"], pairs=[4], attention=["auto"], options="unroll")
    assert gpu_mfu.cases_from_args(args(**grid), ("auto",)) == [
        ("llama_1b", True, 4, "auto", ("unroll",)),
        ("llama_1b", False, 4, "auto", ("unroll",)),
    ]
    with pytest.raises(SystemExit, match="unknown option"):
        gpu_mfu.cases_from_args(args("llama_1b,off,8,cudnn,fast"), ("cudnn",))
    label = gpu_mfu.case_label("llama_1b", False, 8, "cudnn", ("unroll", "right_padded"))
    assert label == "llama_1b_remat-off_8_cudnn_unroll_right_padded"
    cfg = gpu_mfu.model_config("llama_1b", False, "cudnn", ("unroll", "right_padded"))
    assert cfg.unroll_layers and cfg.right_padded and not gpu_mfu.model_config("llama_1b", False).right_padded
    both = ("right_padded", "keep_logits")
    assert gpu_mfu.model_config("llama_1b", False, "cudnn", both).right_padded
    assert gpu_mfu.objective_config(both, 64) == ObjectiveConfig(logprob_chunk_size=64, keep_logits=True)
    assert gpu_mfu.objective_config(("unroll",)) == ObjectiveConfig()


def test_peak_lookup():
    assert gpu_mfu.peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert gpu_mfu.peak_tflops("NVIDIA H200") == 989.4
    assert gpu_mfu.peak_tflops("cpu") is None


@pytest.fixture
def tiny(monkeypatch):
    """A 2-layer SmolLM2-like shape registered as model 'tiny' for the test's duration."""
    shape = dict(
        gpu_mfu.MODELS["smollm2_135m"],
        num_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=256,
    )
    monkeypatch.setitem(gpu_mfu.MODELS, "tiny", shape)
    return "tiny"


def test_one_tiny_case_runs(tiny):
    case = gpu_mfu.bench_case(tiny, remat=True, pairs=2, length=32, warmup=1, timed=1, reference_pass=True)
    cfg = gpu_mfu.model_config(tiny, remat=True)
    assert case["setup_s"] > 0 and case["reference_s"] > 0
    assert case["useful_tflop_per_step"] * 1e12 == pytest.approx(
        flops.dpo_step_flops(flops.model_fields(cfg), 2, 32, reference_forward=False)
    )
    assert case["tokens_per_s"] > 0 and jnp.isfinite(case["final_loss"])


def test_one_tiny_case_profiles_its_ops_by_jax_primitive(tiny, tmp_path):
    case = gpu_mfu.bench_case(
        tiny, remat=False, pairs=1, length=16, warmup=1, timed=1, profile_calls=1, hlo_dir=str(tmp_path)
    )
    assert case["reference_s"] == 0.0  # a uniform policy's log-probs, no scoring pass
    assert 0.0 < case["final_loss"] < 10.0
    profile = case["profile"]
    assert profile["ms_per_call"] > 0 and profile["top_ops"], profile.get("threads")
    assert "dot_general" in dict(profile["primitives"])
    assert list(tmp_path.glob("hlo_tiny_remat-off_1_auto.txt.gz"))


def _gpu_trace(events):
    """Trace events on one GPU stream, behind the process and thread names the profiler writes."""
    names = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #14(Compute)"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 3, "args": {"name": "python3"}},
    ]
    return names + [{"ph": "X", "pid": 1, "tid": 7, **event} for event in events]


def test_gpu_kernels_are_attributed_to_hlo_ops_and_families():
    names = {
        "loop_add_fusion.4": "bf16[8]{0}  jit(step)/add",
        "custom-call.3": "bf16[8,8]{1,0}  jit(step)/dot_general",
    }
    events = _gpu_trace(
        [
            {"name": "loop_add_fusion_4", "ts": 0, "dur": 1000},  # XLA's kernel name for fusion .4
            {"name": "nvjet_sm90_tst_128x160", "ts": 1000, "dur": 3000, "args": {"hlo_op": "custom-call.3"}},
            {"name": "memcpy128", "ts": 4000, "dur": 500},
            {"name": "cudnn_generated_sdpa_fprop", "ts": 6000, "dur": 2000},
        ]
    )
    # A host event named like an op is not device time on a GPU.
    events.append({"ph": "X", "pid": 2, "tid": 3, "name": "custom-call.3", "ts": 0, "dur": 99_000})
    summary = op_profile.summarize_events(events, names, calls=2)
    assert [(op, ms) for op, ms, _ in summary["ops"]] == [("custom-call.3", 1.5), ("loop_add_fusion.4", 0.5)]
    assert dict(summary["primitives"]) == {"dot_general": 1.5, "add": 0.5}
    assert dict(summary["kernel_families"]) == {
        "matmul": 1.5,
        "cuDNN": 1.0,
        "other XLA fusions and kernels": 0.5,
        "copy": 0.25,
    }
    assert summary["stream_kernel_ms_per_call"] == 3.25 and summary["traced_span_ms_per_call"] == 4.0
    assert dict(summary["unattributed"]) == {"cudnn_generated_sdpa_fprop": 1.0, "memcpy128": 0.25}
