// out [M, N] = x [M, K] . w [K, N] for a few rows (a decode step's), float32, for XLA:CPU (an XLA FFI handler).
//
// A decode step multiplies 8-16 rows by every weight matrix once: the product is bound by how fast the
// weights stream from memory, not by arithmetic. XLA:CPU runs it on one thread at a third to a half of the
// machine's streaming bandwidth (bench/small_matmul.py). This kernel splits each weight between XLA's
// intra-op threads in contiguous pieces (whole row ranges when rows are short, column ranges when they are
// long), walks 8 weight rows side by side so the prefetchers see sequential streams, prefetches one block
// ahead, and keeps every row's accumulators in registers. Written with GCC vector extensions (-O3
// -march=native); nothing here is specific to one instruction set.
//
//   x   [M, K] f32  (any leading axes flattened by the caller)
//   w   [K, N] f32  row-major, as the model stores it
//   out [M, N] f32
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float f32x16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;
constexpr int64_t kMaxRows = 16;   // rows held in registers at once (more: groups of 16, one after another)
constexpr int64_t kBlockK = 8;     // weight rows streamed side by side
constexpr int64_t kWideN = 1024;   // from here on, threads split the columns instead of the rows of w

inline f32x16 load(const float* p) {
  f32x16 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, f32x16 v) { __builtin_memcpy(p, &v, sizeof v); }

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
    f32x16 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = accumulate ? load(out + r * p.N + j) : f32x16{};
    const float* wp = p.w + k0 * p.N + j;
    for (int64_t kk = 0; kk < kb; ++kk, wp += p.N) {
      __builtin_prefetch(wp + p.prefetch, 0, 0);
      const f32x16 wv = load(wp);
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

// Parts taken from an atomic counter by the calling thread and the tasks it schedules, so a task that
// starts late finds nothing left and the caller never waits on a task that has not started. Owned jointly
// (shared_ptr): a late task may outlive the call. Part c of a row split writes its partial sums to
// `partial[c]` (part 0 straight to the output), added up by the caller.
struct Work {
  Product p;
  float* out;
  std::vector<float> partial;
  bool split_rows;
  int64_t step, parts;
  std::atomic<int64_t> next{0}, done{0};

  void run() {
    for (int64_t c; (c = next.fetch_add(1)) < parts;) {
      const int64_t begin = c * step;
      if (split_rows) {
        float* target = c == 0 ? out : partial.data() + (c - 1) * p.M * p.N;
        part(p, target, 0, p.N, begin, std::min(begin + step, p.K));
      } else {
        part(p, out, begin, std::min(begin + step, p.N), 0, p.K);
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error SmallMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                           ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), wd = w.dimensions(), od = out->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || od.size() != 2) {
    return ffi::Error::InvalidArgument("small_matmul: expected 2-d x, w and out");
  }
  const int64_t M = xd[0], K = xd[1], N = wd[1];
  if (wd[0] != K || od[0] != M || od[1] != N) {
    return ffi::Error::InvalidArgument("small_matmul: inconsistent shapes");
  }
  if (M == 0 || N == 0 || K == 0) {  // an empty sum: zeros
    std::fill(out->typed_data(), out->typed_data() + M * N, 0.0f);
    return ffi::Error::Success();
  }
  auto work = std::make_shared<Work>();
  work->out = out->typed_data();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  work->split_rows = N < kWideN;
  if (work->split_rows) {  // short weight rows: each thread streams a contiguous range of them
    work->p = {x.typed_data(), w.typed_data(), M, K, N, kBlockK * N};
    work->step = ((K + threads - 1) / threads + kBlockK - 1) / kBlockK * kBlockK;
    work->parts = (K + work->step - 1) / work->step;
    work->partial.resize((work->parts - 1) * M * N);
  } else {  // long weight rows: each thread streams a range of columns, row by row
    work->p = {x.typed_data(), w.typed_data(), M, K, N, 4 * kLanes};
    work->step = ((N + 2 * threads - 1) / (2 * threads) + kLanes - 1) / kLanes * kLanes;
    work->parts = (N + work->step - 1) / work->step;
  }
  const int64_t helpers = std::min(threads, work->parts) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work->run(); });
  work->run();
  while (work->done.load(std::memory_order_acquire) < work->parts) std::this_thread::yield();
  if (work->split_rows) {
    float* o = work->out;
    for (int64_t c = 1; c < work->parts; ++c) {
      const float* s = work->partial.data() + (c - 1) * M * N;
      for (int64_t i = 0; i < M * N; ++i) o[i] += s[i];
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallMatmulF32, SmallMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
