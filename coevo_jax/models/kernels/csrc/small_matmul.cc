// out [M, N] = x [M, K] . w [K, N] for a few rows (a decode step's), float32, for XLA:CPU (an XLA FFI handler).
//
// A decode step multiplies 8-16 rows by every weight matrix once: the product is bound by how fast the
// weights stream from memory, and at 16 rows by the arithmetic too. XLA:CPU runs it on one thread at a third
// to a half of the machine's streaming bandwidth (bench/small_matmul.py). This kernel splits each weight
// between XLA's intra-op threads in contiguous pieces (whole row ranges when rows are short, column ranges
// when they are long), walks blocks of weight rows side by side so the prefetchers see sequential streams,
// prefetches the next block, and keeps every row's accumulators in registers. More than 8 rows of x are
// first packed column by column ([K][rows], each group of up to 16 rows apart), so the inner loop reads every
// row's x value at a fixed offset from one pointer: read in place, 16 row pointers did not fit the general
// registers and the compiler reloaded them from vector registers at every step, which held the loop to about
// one multiply-add a cycle (a one-thread probe: 131 GFLOP/s in place, 225 packed, of ~270 the core can do).
// Written with GCC vector extensions (-O3 -march=native); nothing here is specific to one instruction set.
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

constexpr int64_t kMaxRows = 16;  // rows held in registers at once (more: groups of 16, one after another)
constexpr int64_t kMaxInPlaceRows = 8;  // more rows of x than this are packed first (see the top)
constexpr int64_t kWideN = 1024;  // from here on, threads split the columns instead of the rows of w
// Weight rows streamed side by side. Short rows: 16 when x is packed, so each column's accumulators are
// loaded and stored once per 16 weight rows (SmolLM2's 16-row products ran faster than with 8; 32 and 64 no
// better, and slower for the anchor's 8-row ones, whose first block no prefetch covers); else 8. Long rows: 8,
// their blocks split in column ranges that stay in L1.
constexpr int64_t kBlockShortManyRows = 16;
constexpr int64_t kBlockShort = 8;
constexpr int64_t kBlockLong = 8;
constexpr int64_t kSplitK = 8;  // a thread's range of short weight rows starts at a multiple of this

struct Product {
  const float* x;  // [M, K], or packed: the group of rows m0.. at x + m0 * K, as [K][rows of the group]
  const float* w;  // [K, N]
  int64_t M, K, N;
  bool packed;
  int64_t block_k;   // weight rows streamed side by side
  int64_t prefetch;  // floats ahead of each weight read to prefetch
};

// x[r, k] of a group of R rows: read in place ([R, K]) or packed ([K][R])
template <int R, bool kPacked>
inline float x_at(const float* x, int64_t K, int64_t k, int r) {
  return kPacked ? x[k * R + r] : x[r * K + k];
}

// out[0:R, n0:n1] (+)= x[0:R, k0:k0+kb] . w[k0:k0+kb, n0:n1]; `accumulate` false: out is overwritten.
template <int R, bool kPacked>
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
      for (int r = 0; r < R; ++r) acc[r] += x_at<R, kPacked>(x, p.K, k0 + kk, r) * wv;
    }
    for (int r = 0; r < R; ++r) store(out + r * p.N + j, acc[r]);
  }
  for (; j < n1; ++j) {  // columns past the last full vector
    for (int r = 0; r < R; ++r) {
      float sum = accumulate ? out[r * p.N + j] : 0.0f;
      for (int64_t kk = 0; kk < kb; ++kk) sum += x_at<R, kPacked>(x, p.K, k0 + kk, r) * p.w[(k0 + kk) * p.N + j];
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
  if (p.packed) {
    block<R, true>(p, x, out, n0, n1, k0, kb, accumulate);
  } else {
    block<R, false>(p, x, out, n0, n1, k0, kb, accumulate);
  }
}

// out[:, n0:n1] = x[:, k0:k1] . w[k0:k1, n0:n1] for all M rows: each block of weight rows is read from
// memory once, by the first group of up to kMaxRows rows, and from the cache by the others
void part(const Product& p, float* out, int64_t n0, int64_t n1, int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; k += p.block_k) {
    const int64_t kb = std::min(p.block_k, k1 - k);
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
  // More than kMaxInPlaceRows rows: x packed for `block`, each group of up to kMaxRows rows as [K][rows of the
  // group] (up to 8 row pointers fit the registers, and the anchor's 8-row products, a few microseconds each,
  // ran no faster packed)
  const bool pack = M > kMaxInPlaceRows;
  std::vector<float> packed(pack ? M * K : 0);
  for (int64_t m0 = 0; pack && m0 < M; m0 += kMaxRows) {
    const int64_t rows = std::min(kMaxRows, M - m0);
    const float* source = x.typed_data() + m0 * K;
    float* target = packed.data() + m0 * K;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < K; ++k) target[k * rows + r] = source[r * K + k];
    }
  }
  const float* x_data = pack ? packed.data() : x.typed_data();
  if (N < kWideN) {  // short weight rows: each part streams a contiguous range of them
    const int64_t block_k = pack ? kBlockShortManyRows : kBlockShort;
    const Product p{x_data, w_data, M, K, N, pack, block_k, block_k * N};
    const int64_t step = ((K + threads - 1) / threads + kSplitK - 1) / kSplitK * kSplitK;
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
    const bool block_fits = kBlockLong * step * sizeof(float) <= 16384;
    const Product p{x_data, w_data, M, K, N, pack, kBlockLong, block_fits ? kBlockLong * N : 16 * kLanes};
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
