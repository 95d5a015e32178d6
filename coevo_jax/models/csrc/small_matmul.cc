// out [M, N] = x [M, K] . w [K, N] for a few rows (a decode step's), float32, for XLA:CPU (an XLA FFI handler).
//
// A decode step multiplies 8-16 rows by every weight matrix once: the product is bound by how fast the
// weights stream from memory, not by arithmetic. XLA:CPU runs it on one thread at a third to a half of the
// machine's streaming bandwidth (bench/small_matmul.py). This kernel splits each weight between XLA's
// intra-op threads in contiguous pieces (whole row ranges when rows are short, column ranges when they are
// long), walks 8 weight rows side by side so the prefetchers see sequential streams, prefetches ahead (the
// next block, or along a long row), and keeps every row's accumulators in registers. Written with GCC
// vector extensions (-O3 -march=native); nothing here is specific to one instruction set.
//
//   x      [M, K]    f32  (any leading axes flattened by the caller)
//   w      [L, K, N] f32  row-major, as the model stores it: L stacked layers' weights (L = 1 for one)
//   layer  []        s32  which of the L to multiply by (read in place: no slice is copied out)
//   out    [M, N]    f32
#include <algorithm>
#include <cstdint>
#include <vector>

#include "parallel_parts.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using coevo_jax::kLanes, coevo_jax::load, coevo_jax::store, coevo_jax::Vec;

constexpr int64_t kMaxRows = 16;   // rows held in registers at once (more: groups of 16, one after another)
constexpr int64_t kBlockK = 8;     // weight rows streamed side by side
constexpr int64_t kWideN = 1024;   // from here on, threads split the columns instead of the rows of w

struct Product {
  const float* x;  // [M, K]
  const float* w;  // [K, N]
  int64_t M, K, N;
  int64_t prefetch;  // floats ahead of each weight read to prefetch
};

// out[0:R, n0:n1] (+)= x[0:R, k0:k0+kb] . w[k0:k0+kb, n0:n1]; `accumulate` false: out is overwritten.
template <int R>
void block(const Product& p, const float* x, float* out, int64_t n0, int64_t n1, int64_t k0, int64_t kb,
           bool accumulate) {
  int64_t j = n0;
  for (; j + kLanes <= n1; j += kLanes) {
    Vec acc[R];
    for (int r = 0; r < R; ++r) acc[r] = accumulate ? load(out + r * p.N + j) : Vec{};
    const float* wp = p.w + k0 * p.N + j;
    for (int64_t kk = 0; kk < kb; ++kk, wp += p.N) {
      __builtin_prefetch(wp + p.prefetch, 0, 0);
      const Vec wv = load(wp);
      for (int r = 0; r < R; ++r) acc[r] += x[r * p.K + k0 + kk] * wv;
    }
    for (int r = 0; r < R; ++r) store(out + r * p.N + j, acc[r]);
  }
  for (; j < n1; ++j) {  // columns past the last full vector
    for (int r = 0; r < R; ++r) {
      float sum = accumulate ? out[r * p.N + j] : 0.0f;
      for (int64_t kk = 0; kk < kb; ++kk) sum += x[r * p.K + k0 + kk] * p.w[(k0 + kk) * p.N + j];
      out[r * p.N + j] = sum;
    }
  }
}

template <int R>
void block_dispatch(int64_t r, const Product& p, const float* x, float* out, int64_t n0, int64_t n1,
                    int64_t k0, int64_t kb, bool accumulate) {
  if constexpr (R > 1) {
    if (r < R) return block_dispatch<R - 1>(r, p, x, out, n0, n1, k0, kb, accumulate);
  }
  block<R>(p, x, out, n0, n1, k0, kb, accumulate);
}

// out[:, n0:n1] = x[:, k0:k1] . w[k0:k1, n0:n1] for all M rows: each block of weight rows is read from
// memory once, by the first group of up to kMaxRows rows, and from the cache by the others
void part(const Product& p, float* out, int64_t n0, int64_t n1, int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; k += kBlockK) {
    const int64_t kb = std::min(kBlockK, k1 - k);
    for (int64_t m = 0; m < p.M; m += kMaxRows) {
      block_dispatch<kMaxRows>(std::min(kMaxRows, p.M - m), p, p.x + m * p.K, out + m * p.N, n0, n1, k, kb,
                               k != k0);
    }
  }
}

ffi::Error SmallMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                           ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), wd = w.dimensions(), od = out->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || od.size() != 2 || layer.element_count() != 1) {
    return ffi::Error::InvalidArgument("small_matmul: expected 2-d x and out, 3-d w, a scalar layer");
  }
  const int64_t M = xd[0], K = xd[1], N = wd[2];
  if (wd[1] != K || od[0] != M || od[1] != N) {
    return ffi::Error::InvalidArgument("small_matmul: inconsistent shapes");
  }
  const int64_t index = layer.typed_data()[0];
  if (index < 0 || index >= wd[0]) {
    return ffi::Error::InvalidArgument("small_matmul: layer index out of range");
  }
  const float* w_data = w.typed_data() + index * K * N;
  if (M == 0 || N == 0 || K == 0) {  // an empty sum: zeros
    std::fill(out->typed_data(), out->typed_data() + M * N, 0.0f);
    return ffi::Error::Success();
  }
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  float* out_data = out->typed_data();
  if (N < kWideN) {  // short weight rows: each part streams a contiguous range of them
    const Product p{x.typed_data(), w_data, M, K, N, kBlockK * N};
    const int64_t step = ((K + threads - 1) / threads + kBlockK - 1) / kBlockK * kBlockK;
    const int64_t parts = (K + step - 1) / step;
    // part c's partial sums: the output for part 0, partial[c - 1] for the others, added up at the end
    std::vector<float> partial((parts - 1) * M * N);
    float* partial_data = partial.data();
    coevo_jax::run_parts(pool, parts, [=](int64_t c) {
      float* target = c == 0 ? out_data : partial_data + (c - 1) * M * N;
      part(p, target, 0, N, c * step, std::min(c * step + step, K));
    });
    for (int64_t c = 1; c < parts; ++c) {
      const float* s = partial_data + (c - 1) * M * N;
      for (int64_t i = 0; i < M * N; ++i) out_data[i] += s[i];
    }
  } else {  // long weight rows: each part streams a range of columns, row by row
    const int64_t step = ((N + 2 * threads - 1) / (2 * threads) + kLanes - 1) / kLanes * kLanes;
    // a part's block of 8 weight rows of at most 16 KB (in L1): prefetch the next block, as for short rows;
    // a longer one (the anchor unembedding's 2,048 columns): 256 floats ahead along the row. Against 64
    // floats ahead for both, the median over 5 runs of that unembedding went from 1.15x to 1.41x XLA's
    // product, SmolLM2's 16-row gate/up from 0.77x to 1.20x (bench/small_matmul.py).
    const bool block_fits = kBlockK * step * sizeof(float) <= 16384;
    const Product p{x.typed_data(), w_data, M, K, N, block_fits ? kBlockK * N : 16 * kLanes};
    coevo_jax::run_parts(pool, (N + step - 1) / step, [=](int64_t c) {
      part(p, out_data, c * step, std::min(c * step + step, N), 0, K);
    });
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMatmulF32, SmallMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
