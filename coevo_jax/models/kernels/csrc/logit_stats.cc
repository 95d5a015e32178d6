// Each row's first argmax and log-sum-exp, for XLA:CPU (an XLA FFI handler): what a decode step needs of its
// logits to pick a greedy token and score it.
//
// XLA:CPU spends ~60 us on an anchor decode step's 8 x 8,192 logits for these (a blocked argmax with its NaN
// checks, a maximum, the exponentials, their sum: a dozen small ops); here each row is read three times from
// the cache in one call (maximum and NaN check, first index of the maximum, sum of exponentials), rows
// split over XLA's intra-op threads.
//
//   logits [R, V] f32
//   argmax [R]    s32  the first maximum's index; a NaN counts as the largest (the first NaN's index), as
//                      in jnp.argmax
//   lse    [R]    f32  log sum exp: NaN if the row holds a NaN, -inf for a row of -inf, +inf if it holds +inf
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "parallel_parts.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using coevo_jax::kLanes, coevo_jax::load, coevo_jax::Vec;
typedef int32_t Mask __attribute__((vector_size(sizeof(Vec))));  // a comparison of two Vecs
constexpr int64_t kSumBlock = 1024;  // terms summed in float32 lanes before a float64 total

// The first i with x[i] == value (V if none), a vector at a time.
int64_t first_equal(const float* __restrict x, int64_t V, float value) {
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes) {
    const Mask hit = load(x + i) == value;
    bool any = false;
    for (int64_t lane = 0; lane < kLanes; ++lane) any = any || hit[lane] != 0;
    if (any) break;
  }
  return std::find(x + i, x + V, value) - x;
}

void row_stats(const float* __restrict x, int64_t V, int32_t* argmax, float* lse) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  Vec top_lanes = {};
  top_lanes += kNegInf;
  Mask nan_lanes = {};
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes) {
    const Vec v = load(x + i);
    nan_lanes |= v != v;
    top_lanes = v > top_lanes ? v : top_lanes;  // a NaN never wins: rows holding one are handled apart
  }
  float top = kNegInf;
  bool nan = false;
  for (int64_t lane = 0; lane < kLanes; ++lane) {
    top = std::max(top, top_lanes[lane]);
    nan = nan || nan_lanes[lane] != 0;
  }
  for (; i < V; ++i) {
    nan = nan || x[i] != x[i];
    if (x[i] > top) top = x[i];
  }
  if (nan) {
    *argmax = static_cast<int32_t>(std::find_if(x, x + V, [](float v) { return v != v; }) - x);
    *lse = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  *argmax = static_cast<int32_t>(first_equal(x, V, top));
  if (std::isinf(top)) {  // every logit -inf, or one +inf: the sum is 0 or +inf
    *lse = top;
    return;
  }
  // 8,192-49,152 terms of at most 1 each, one of them exactly 1: float32 lanes per block, float64 across
  double total = 0.0;
  for (int64_t start = 0; start < V; start += kSumBlock) {
    const int64_t end = std::min(V, start + kSumBlock);
    float block = 0.0f;
#pragma omp simd reduction(+ : block)
    for (int64_t j = start; j < end; ++j) {
      const float shifted = x[j] - top;
      block += shifted < -87.0f ? 0.0f : coevo_jax::exp_nonpositive(shifted);
    }
    total += block;
  }
  *lse = top + static_cast<float>(std::log(total));
}

ffi::Error LogitStatsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                          ffi::ResultBuffer<ffi::S32> argmax, ffi::ResultBuffer<ffi::F32> lse) {
  const auto dims = logits.dimensions();
  if (dims.size() != 2 || static_cast<int64_t>(argmax->element_count()) != dims[0] ||
      static_cast<int64_t>(lse->element_count()) != dims[0]) {
    return ffi::Error::InvalidArgument("logit_stats: expected [R, V] logits and [R] outputs");
  }
  const int64_t rows = dims[0], vocab = dims[1];
  if (vocab == 0) {
    return ffi::Error::InvalidArgument("logit_stats: an empty vocabulary has no argmax");
  }
  const float* x = logits.typed_data();
  int32_t* index = argmax->typed_data();
  float* normaliser = lse->typed_data();
  const int64_t parts = std::min<int64_t>(rows, std::max<int64_t>(1, pool.num_threads()));
  if (parts == 0) return ffi::Error::Success();
  const int64_t chunk = (rows + parts - 1) / parts;
  coevo_jax::run_parts(pool, (rows + chunk - 1) / chunk, [=](int64_t c) {
    for (int64_t r = c * chunk; r < std::min(rows, c * chunk + chunk); ++r) {
      row_stats(x + r * vocab, vocab, index + r, normaliser + r);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LogitStatsF32, LogitStatsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
