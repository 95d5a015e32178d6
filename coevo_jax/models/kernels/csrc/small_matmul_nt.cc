// out [M, N] = x [M, K] . w [N, K]^T for a few rows (a decode step's), float32, for XLA:CPU (an XLA FFI
// handler): the product by a weight stored transposed, as a tied embedding table serves as the unembedding.
//
// `small_matmul` streams w [K, N] row by row, every row times all of x's rows broadcast; here each output
// is a dot product of two contiguous rows. The threads split w's rows in contiguous ranges (one sequential
// stream each, prefetched ahead); a block of 2 w rows is multiplied by up to 8 x rows at once (16 vector
// accumulators along K), the x rows staying in L1 for the whole call. The 16 accumulators' lanes are then
// summed by a 4-step shuffle tree into one vector, lane i holding accumulator i. Written with GCC/Clang
// vector extensions (-O3 -march=native); nothing here is specific to one instruction set.
//
//   x   [M, K] f32  (any leading axes flattened by the caller)
//   w   [N, K] f32  row-major (an embedding table [V, D])
//   out [M, N] f32
#include <algorithm>
#include <cstdint>
#include <utility>

#include "parallel_parts.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using coevo_jax::kLanes, coevo_jax::load, coevo_jax::store, coevo_jax::Vec;

constexpr int kRowsX = 8;          // x rows per block
constexpr int kRowsW = 2;          // w rows per block: kRowsX * kRowsW = 16 accumulators, one per lane
constexpr int64_t kAhead = 1024;   // floats ahead along w's stream to prefetch

static_assert(kRowsX * kRowsW == kLanes, "one accumulator per lane of the reduced vector");

// Source lane of output lane i when folding a and b, whose lanes hold segments of 2h lanes (each segment
// one accumulator's partial sums), into segments of h: output blocks of 2h lanes are [a's segment p
// (h lanes), b's segment p (h lanes)]; `upper` picks each segment's second half.
constexpr int fold_source(int i, int h, bool upper) {
  const int p = i / (2 * h), q = i % (2 * h), offset = upper ? h : 0;
  return q < h ? p * 2 * h + q + offset : static_cast<int>(kLanes) + p * 2 * h + (q - h) + offset;
}

template <int H, std::size_t... I>
Vec fold(Vec a, Vec b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, fold_source(I, H, false)...) +
         __builtin_shufflevector(a, b, fold_source(I, H, true)...);
}

constexpr int bit_reverse4(int i) { return ((i & 1) << 3) | ((i & 2) << 1) | ((i & 4) >> 1) | ((i & 8) >> 3); }

// One vector whose lane i is the sum of acc[i]'s lanes. Each fold halves the segments and interleaves the
// pairs, so after four the lanes hold the inputs in bit-reversed order: feeding acc[bit_reverse4(j)] as
// input j puts acc[i] in lane i.
inline Vec lane_sums(const Vec (&acc)[kLanes]) {
  constexpr auto lanes = std::make_index_sequence<kLanes>{};
  Vec v8[8], v4[4], v2[2];
  for (int j = 0; j < 8; ++j) v8[j] = fold<8>(acc[bit_reverse4(2 * j)], acc[bit_reverse4(2 * j + 1)], lanes);
  for (int j = 0; j < 4; ++j) v4[j] = fold<4>(v8[2 * j], v8[2 * j + 1], lanes);
  for (int j = 0; j < 2; ++j) v2[j] = fold<2>(v4[2 * j], v4[2 * j + 1], lanes);
  return fold<1>(v2[0], v2[1], lanes);
}

struct Product {
  const float* x;  // [M, K]
  const float* w;  // [N, K]
  float* out;      // [M, N]
  int64_t M, K, N;
};

// out[m0:m0+R, n:n+C] = x[m0:m0+R] . w[n:n+C]^T; `prefetch`: the first x block of these w rows, which
// reads them from memory (later blocks find them in L1)
template <int R, int C>
void dot_block(const Product& p, int64_t m0, int64_t n, bool prefetch) {
  const float* x = p.x + m0 * p.K;
  const float* w = p.w + n * p.K;
  const int64_t K = p.K, full = K / kLanes * kLanes;
  Vec acc[kLanes] = {};  // acc[r * kRowsW + c]; unused ones stay 0
  for (int64_t k = 0; k < full; k += kLanes) {
    Vec wv[C];
    for (int c = 0; c < C; ++c) {
      if (prefetch) __builtin_prefetch(w + c * K + k + kAhead, 0, 0);
      wv[c] = load(w + c * K + k);
    }
    for (int r = 0; r < R; ++r) {
      const Vec xv = load(x + r * K + k);
      for (int c = 0; c < C; ++c) acc[r * kRowsW + c] += xv * wv[c];
    }
  }
  float sums[kLanes];
  store(sums, lane_sums(acc));
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float total = sums[r * kRowsW + c];
      for (int64_t k = full; k < K; ++k) total += x[r * K + k] * w[c * K + k];  // past the last full vector
      p.out[(m0 + r) * p.N + n + c] = total;
    }
  }
}

template <int R, int C>
void dot_block_dispatch(int r, const Product& p, int64_t m0, int64_t n, bool prefetch) {
  if constexpr (R > 1) {
    if (r < R) return dot_block_dispatch<R - 1, C>(r, p, m0, n, prefetch);
  }
  dot_block<R, C>(p, m0, n, prefetch);
}

// out[:, n0:n1] for all M rows
void part(const Product& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += kRowsW) {
    const bool pair = n + kRowsW <= n1;
    for (int64_t m = 0; m < p.M; m += kRowsX) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowsX, p.M - m));
      if (pair) {
        dot_block_dispatch<kRowsX, kRowsW>(rows, p, m, n, m == 0);
      } else {
        dot_block_dispatch<kRowsX, 1>(rows, p, m, n, m == 0);
      }
    }
  }
}

ffi::Error SmallMatmulNtImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                             ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), wd = w.dimensions(), od = out->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || od.size() != 2) {
    return ffi::Error::InvalidArgument("small_matmul_nt: expected 2-d x, w and out");
  }
  const int64_t M = xd[0], K = xd[1], N = wd[0];
  if (wd[1] != K || od[0] != M || od[1] != N) {
    return ffi::Error::InvalidArgument("small_matmul_nt: inconsistent shapes");
  }
  if (M == 0 || N == 0) return ffi::Error::Success();
  const Product p{x.typed_data(), w.typed_data(), out->typed_data(), M, K, N};
  // contiguous ranges of w's rows, an even count each, four parts a thread (a late thread still gets work)
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t step = std::max<int64_t>(kRowsW, ((N + 4 * threads - 1) / (4 * threads) + 1) / 2 * 2);
  coevo_jax::run_parts(pool, (N + step - 1) / step, [=](int64_t c) {
    part(p, c * step, std::min(c * step + step, N));
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMatmulNtF32, SmallMatmulNtImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
