"""`bench/gpu_aot.py` on the CPU: its cases compile from abstract arguments, its target descriptions."""

import gpu_aot
import gpu_mfu
import hlo_traffic
import jax
import pytest


@pytest.fixture
def tiny(monkeypatch):
    """A 3-layer SmolLM2-like shape registered as model 'tiny' for the test's duration."""
    shape = dict(gpu_mfu.MODELS["smollm2_135m"], num_layers=3, hidden_size=64, intermediate_size=128)
    shape |= dict(num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=256)
    monkeypatch.setitem(gpu_mfu.MODELS, "tiny", shape)
    return "tiny"


def test_a_case_compiles_from_abstract_arguments_and_unrolling_removes_the_stacked_residuals(tiny):
    stacked = {}
    for unroll in (False, True):
        options = ("unroll",) if unroll else ()
        compiled, seconds = gpu_aot.compile_case(jax.devices()[0], tiny, False, 2, 64, "blocked", options)
        kernels = hlo_traffic.Program(compiled.as_text()).kernels()
        assert seconds > 0 and compiled.memory_analysis().argument_size_in_bytes > 0
        # at least the forward MLP products (3 of 64 x 128) of 4 sequences of 64 tokens in 3 layers
        assert hlo_traffic.summary(kernels)["matmul"]["tflop"] * 1e12 >= 3 * (3 * 2 * 4 * 64 * 64 * 128)
        stacked[unroll] = sum(k.bytes_written for k in kernels if k.family == "stack" and k.launches == 3)
    assert stacked[False] > 0 and stacked[True] == 0  # no loop over the 3 layers is left to stack across


def test_the_target_descriptions_carry_each_chips_datasheet_figures():
    h100, h200 = gpu_aot.target_config("h100"), gpu_aot.target_config("h200")
    assert (
        "memory_bandwidth: 3350000000000" in h100
        and 'device_description_str: "NVIDIA H100 80GB HBM3"' in h100
    )
    assert "memory_bandwidth: 4800000000000" in h200 and 'device_description_str: "NVIDIA H200"' in h200
    assert "major: 9" in h100  # Hopper: compute capability 9.0, where cuDNN's fused attention runs
