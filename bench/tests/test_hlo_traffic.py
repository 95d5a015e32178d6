"""`bench/hlo_traffic.py`: kernels, launches, bytes and FLOPs of a hand-written program and a compiled scan."""

import hlo_traffic
import jax
import jax.numpy as jnp
import pytest

# A loop of 4 iterations that reads one [8, 16] slice of xs and writes one into ys in place, a cuBLAS
# product, and a conditional whose first branch calls cuDNN (the one counted) and whose second is larger.
PROGRAM = """HloModule test, entry_computation_layout={(f32[4,8,16]{2,1,0})->f32[8]{0}}

%fused_slice (param_0: f32[4,8,16], param_1: s32[]) -> f32[8,16] {
  %param_0 = f32[4,8,16]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %constant_0 = s32[] constant(0)
  %dynamic-slice.1 = f32[1,8,16]{2,1,0} dynamic-slice(%param_0, %param_1, %constant_0, %constant_0), dynamic_slice_sizes={1,8,16}
  %bitcast.1 = f32[8,16]{1,0} bitcast(%dynamic-slice.1)
  ROOT %exponential.1 = f32[8,16]{1,0} exponential(%bitcast.1)
}

%fused_stack (param_0: f32[4,8,16], param_1: f32[8,16], param_2: s32[]) -> f32[4,8,16] {
  %param_0 = f32[4,8,16]{2,1,0} parameter(0)
  %param_1 = f32[8,16]{1,0} parameter(1)
  %bitcast.2 = f32[1,8,16]{2,1,0} bitcast(%param_1)
  %param_2 = s32[] parameter(2)
  %constant_1 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[4,8,16]{2,1,0} dynamic-update-slice(%param_0, %bitcast.2, %param_2, %constant_1, %constant_1)
}

%body (loop: (s32[], f32[4,8,16], f32[4,8,16])) -> (s32[], f32[4,8,16], f32[4,8,16]) {
  %loop = (s32[], f32[4,8,16]{2,1,0}, f32[4,8,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%loop), index=0
  %xs = f32[4,8,16]{2,1,0} get-tuple-element(%loop), index=1
  %ys = f32[4,8,16]{2,1,0} get-tuple-element(%loop), index=2
  %fusion.1 = f32[8,16]{1,0} fusion(%xs, %i), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(f)/exp"}
  %fusion.2 = f32[4,8,16]{2,1,0} fusion(%ys, %fusion.1, %i), kind=kLoop, calls=%fused_stack
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %tuple.1 = (s32[], f32[4,8,16]{2,1,0}, f32[4,8,16]{2,1,0}) tuple(%next, %xs, %fusion.2)
}

%condition (loop: (s32[], f32[4,8,16], f32[4,8,16])) -> pred[] {
  %loop = (s32[], f32[4,8,16]{2,1,0}, f32[4,8,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%loop), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%with_cudnn (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %attention.1 = f32[8]{0} custom-call(%x), custom_call_target="__cudnn$fmhaSoftmax"
}

%plain (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %big = f32[1024]{0} broadcast(%x), dimensions={}
  ROOT %slice.9 = f32[8]{0} slice(%big), slice={[0:8]}
}

ENTRY %main (xs: f32[4,8,16], ys: f32[4,8,16], a: bf16[64,32], b: bf16[32,128], p: pred[], small: f32[8]) -> f32[8] {
  %xs = f32[4,8,16]{2,1,0} parameter(0)
  %ys0 = f32[4,8,16]{2,1,0} parameter(1)
  %zero = s32[] constant(0)
  %start = (s32[], f32[4,8,16]{2,1,0}, f32[4,8,16]{2,1,0}) tuple(%zero, %xs, %ys0)
  %loop = (s32[], f32[4,8,16]{2,1,0}, f32[4,8,16]{2,1,0}) while(%start), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %a = bf16[64,32]{1,0} parameter(2)
  %b = bf16[32,128]{1,0} parameter(3)
  %gemm = (bf16[64,128]{1,0}, s8[1024]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %p = pred[] parameter(4)
  %small = f32[8]{0} parameter(5)
  ROOT %chosen = f32[8]{0} conditional(%p, %small, %small), true_computation=%with_cudnn, false_computation=%plain
}
"""


def test_shape_bytes_sums_a_tuples_arrays():
    assert hlo_traffic.shape_bytes("(bf16[64,128]{1,0}, s8[1024]{0}, pred[3])") == 64 * 128 * 2 + 1024 + 3
    assert hlo_traffic.shape_bytes("f32[]") == 4


def test_a_hand_written_program_s_kernels_launches_and_bytes():
    kernels = {k.name: k for k in hlo_traffic.Program(PROGRAM).kernels()}
    assert set(kernels) == {"fusion.1", "fusion.2", "next", "gemm", "attention.1"}
    # the loop's kernels run 4 times; each reads its [8, 16] slice (512 B) and the index, not all of xs
    sliced = kernels["fusion.1"]
    assert (sliced.family, sliced.launches, sliced.op_name) == ("fusion", 4, "jit(f)/exp")
    assert (sliced.bytes_read, sliced.bytes_written) == (4 * (512 + 4), 4 * 512)
    # the stacked output is written in place: the update counts, the [4, 8, 16] buffer does not
    stacked = kernels["fusion.2"]
    assert (stacked.family, stacked.bytes_read, stacked.bytes_written) == ("stack", 4 * (512 + 4), 4 * 512)
    assert (kernels["next"].family, kernels["next"].launches) == ("other", 4)
    gemm = kernels["gemm"]
    assert (gemm.family, gemm.launches, gemm.flops) == ("matmul", 1, 2 * 64 * 128 * 32)
    assert (gemm.bytes_read, gemm.bytes_written) == (64 * 32 * 2 + 32 * 128 * 2, 64 * 128 * 2 + 1024)
    # the conditional counts its cuDNN branch, though the other moves more bytes
    assert kernels["attention.1"].family == "attention"
    table = hlo_traffic.summary(list(kernels.values()))
    assert table["stack"]["launches"] == 4 and table["attention"]["launches"] == 1
    memory_bound = sum(k.bytes_read + k.bytes_written for k in kernels.values() if k.family != "matmul")
    memory_bound -= kernels["attention.1"].bytes_read + kernels["attention.1"].bytes_written
    assert hlo_traffic.memory_bound_gb(list(kernels.values())) == pytest.approx(memory_bound / 1e9)


def test_without_cudnn_a_conditional_counts_its_branch_that_moves_the_most_bytes():
    program = PROGRAM.replace('custom_call_target="__cudnn$fmhaSoftmax"', 'custom_call_target="other"')
    names = {k.name for k in hlo_traffic.Program(program).kernels()}
    assert "slice.9" in names and "attention.1" not in names


def test_a_program_without_an_entry_is_refused():
    with pytest.raises(ValueError, match="no ENTRY"):
        hlo_traffic.parse(PROGRAM.replace("ENTRY %main", "%main"))


def test_a_compiled_scan_counts_each_step_s_slice():
    """XLA's own program (here the CPU's): a scan over 6 slices reads and stacks one slice per iteration."""
    xs = jnp.ones((6, 64, 64), jnp.float32)

    def scan(xs):
        return jax.lax.scan(lambda c, x: (c + 1.0, jnp.tanh(x) * c), 1.0, xs)

    kernels = hlo_traffic.Program(jax.jit(scan).lower(xs).compile().as_text()).kernels()
    stacked = [k for k in kernels if k.family == "stack"]
    assert stacked and all(k.launches == 6 for k in stacked)
    assert sum(k.bytes_written for k in stacked) == xs.nbytes
    assert xs.nbytes <= sum(k.bytes_read for k in stacked) <= xs.nbytes + 6 * 64


# One target logit per token picked from a [1024, 256] block inside a fusion, and one unfused gather.
GATHERS = """HloModule gathers, entry_computation_layout={(f32[1024,256]{1,0}, s32[1024,2]{1,0})->f32[1024]{0}}

%fused_pick (param_0: f32[1024,256], param_1: s32[1024,2]) -> f32[1024] {
  %param_0 = f32[1024,256]{1,0} parameter(0)
  %bitcast.1 = f32[1024,256,1]{2,1,0} bitcast(%param_0)
  %param_1 = s32[1024,2]{1,0} parameter(1)
  %gather.1 = f32[1024,1,1]{2,1,0} gather(%bitcast.1, %param_1), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1,1}
  %bitcast.2 = f32[1024]{0} bitcast(%gather.1)
  ROOT %negate.1 = f32[1024]{0} negate(%bitcast.2)
}

ENTRY %main (logits: f32[1024,256], indices: s32[1024,2]) -> f32[1024] {
  %logits = f32[1024,256]{1,0} parameter(0)
  %indices = s32[1024,2]{1,0} parameter(1)
  %fusion.1 = f32[1024]{0} fusion(%logits, %indices), kind=kLoop, calls=%fused_pick
  %gather.2 = f32[1024,1]{1,0} gather(%logits, %indices), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
  ROOT %bitcast.3 = f32[1024]{0} bitcast(%gather.2)
}
"""


def test_a_gather_reads_the_elements_it_picks_not_its_whole_operand():
    kernels = {k.name: k for k in hlo_traffic.Program(GATHERS).kernels()}
    picked, indices = 1024 * 4, 1024 * 2 * 4
    assert (kernels["fusion.1"].bytes_read, kernels["fusion.1"].bytes_written) == (picked + indices, picked)
    assert (kernels["gather.2"].bytes_read, kernels["gather.2"].bytes_written) == (picked + indices, picked)
