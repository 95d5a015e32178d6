// Grouped-query attention of queries over a prefix of cached slots, for XLA:CPU (an XLA FFI handler).
//
// XLA's CPU backend must attend every slot of the cache window (static shapes) in three separate passes
// (scores, softmax, values), its small batched products reading the keys at a third of the memory
// bandwidth. This kernel reads, per (row, kv head), only the slots each query may attend (a prefix whose
// length the caller gives), scores, normalises and mixes them in one pass, and splits the (row, kv head)
// pairs over XLA's intra-op threads. Written as plain loops for the compiler to vectorise
// (-O3 -march=native): nothing here is specific to one instruction set.
//
//   queries [B, K, Q, E]    f32  Q query vectors per kv head (a group's G heads times T positions, g-major)
//   keys    [L, B, K, E, S] f32  the stacked cache's layout: slots last
//   values  [L, B, K, S, E] f32
//   layer   []              s32  which of the L layers to read (in place: no slice is copied out)
//   limits  [B, T]          s32  query (g, t) of row b attends slots [0, limits[b, t]); 0: output zeros
//   out     [B, K, Q, E] f32    softmax(q . k * scale) . v over the prefix
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "parallel_parts.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Shapes {
  int64_t B, K, Q, E, S, T;
};

using coevo_jax::kLanes, coevo_jax::load, coevo_jax::store, coevo_jax::Vec;

constexpr int64_t kBlock = 8;      // queries scored together
constexpr int64_t kMaxDim = 256;   // head_dim the query buffers hold

// scores[j][s] += query[j][e0:e1] . keys[e0:e1, s] over slots [s0, s0 + a multiple of kTiles * 16 <= n);
// returns where it stopped. The keys' rows (one per head dimension, slots along each) are streamed kRows at
// a time over the whole range, the partial scores staying in `scores` (in L1) between passes: few long
// sequential reads, where a slot tile at a time would jump between all E rows (each a whole cache window
// apart, which alias in the L1 cache when the window is a multiple of 1,024 slots).
constexpr int64_t kRows = 8;
constexpr int64_t kPrefetch = 256;  // floats ahead along a key row

template <int J, int kTiles>
int64_t score_rows(const float (*query)[kMaxDim], const float* __restrict k, int64_t S, int64_t E, int64_t s0,
                   int64_t n, float* __restrict scores) {
  const int64_t end = s0 + (n - s0) / (kTiles * kLanes) * (kTiles * kLanes);
  for (int64_t e0 = 0; e0 < E; e0 += kRows) {
    const int64_t e1 = std::min(E, e0 + kRows);
    for (int64_t s = s0; s < end; s += kTiles * kLanes) {
      Vec acc[J][kTiles];
      for (int j = 0; j < J; ++j) {
        for (int t = 0; t < kTiles; ++t) acc[j][t] = e0 == 0 ? Vec{} : load(scores + j * S + s + t * kLanes);
      }
      for (int64_t e = e0; e < e1; ++e) {
        // along the row, then on into the same row of the next pass (short live rows end before 256 floats)
        const int64_t ahead = s + kPrefetch;
        if (ahead < n) {
          __builtin_prefetch(k + e * S + ahead, 0, 0);
        } else if (e + kRows < E) {
          __builtin_prefetch(k + (e + kRows) * S + (ahead - n), 0, 0);
        }
        for (int t = 0; t < kTiles; ++t) {
          const Vec key = load(k + e * S + s + t * kLanes);
          for (int j = 0; j < J; ++j) acc[j][t] += key * query[j][e];
        }
      }
      for (int j = 0; j < J; ++j) {
        for (int t = 0; t < kTiles; ++t) store(scores + j * S + s + t * kLanes, acc[j][t]);
      }
    }
  }
  return end;
}

// scores[j][s] = query[j] . keys[:, s] for s < n. One or two queries (a decode step of 1-2 query heads per
// kv head) also take 4 vectors of slots a step: their 8 accumulators fit the registers beside the
// broadcasts (the anchor's decode attention ~1.2x faster alone; with three queries it was slower).
template <int J>
void score(const float (*query)[kMaxDim], const float* __restrict k, int64_t S, int64_t E, int64_t n,
           float* __restrict scores) {
  int64_t s = score_rows<J, J <= 2 ? 4 : 1>(query, k, S, E, 0, n, scores);
  s = score_rows<J, 1>(query, k, S, E, s, n, scores);
  for (; s < n; ++s) {
    for (int j = 0; j < J; ++j) {
      float total = 0.0f;
      for (int64_t e = 0; e < E; ++e) total += query[j][e] * k[e * S + s];
      scores[j * S + s] = total;
    }
  }
}

// mixed[j][e0:e0 + kTiles * 16] = sum_s probs[j][s] values[s][...] for s < n, for each such run of head
// dimensions from e0 on; returns where it stopped. Each value row's run is read once for all J queries.
template <int J, int kTiles>
int64_t mix_tiles(const float* __restrict probs, int64_t S, const float* __restrict v, int64_t E, int64_t n,
                  int64_t e0, float (*mixed)[kMaxDim]) {
  for (; e0 + kTiles * kLanes <= E; e0 += kTiles * kLanes) {
    Vec acc[J][kTiles] = {};
    for (int64_t s = 0; s < n; ++s) {
      __builtin_prefetch(v + (s + 8) * E + e0, 0, 0);
      for (int t = 0; t < kTiles; ++t) {
        const Vec value = load(v + s * E + e0 + t * kLanes);
        for (int j = 0; j < J; ++j) acc[j][t] += value * probs[j * S + s];
      }
    }
    for (int j = 0; j < J; ++j) {
      for (int t = 0; t < kTiles; ++t) store(mixed[j] + e0 + t * kLanes, acc[j][t]);
    }
  }
  return e0;
}

// mixed[j][e] = sum_s probs[j][s] values[s][e] for s < n: as many head dimensions a pass as J queries' 16
// accumulators allow, so a decode step reads each value row once, in order (SmolLM2's 64 dimensions in
// one pass instead of four; with the scores above, its decode attention at 1,500 live slots took 1.55x
// less time, 33 GB/s of live keys and values).
template <int J>
void mix(const float* __restrict probs, int64_t S, const float* __restrict v, int64_t E, int64_t n,
         float (*mixed)[kMaxDim]) {
  int64_t e0 = 0;
  if constexpr (J <= 2) e0 = mix_tiles<J, 8>(probs, S, v, E, n, e0, mixed);
  if constexpr (J <= 4) e0 = mix_tiles<J, 4>(probs, S, v, E, n, e0, mixed);
  if constexpr (J <= 8) e0 = mix_tiles<J, 2>(probs, S, v, E, n, e0, mixed);
  e0 = mix_tiles<J, 1>(probs, S, v, E, n, e0, mixed);
  for (int j = 0; j < J; ++j) {
    for (int64_t e = e0; e < E; ++e) {
      float total = 0.0f;
      for (int64_t s = 0; s < n; ++s) total += probs[j * S + s] * v[s * E + e];
      mixed[j][e] = total;
    }
  }
}

// row[s] = exp(row[s] - max) over [0, n), 0 over [n, end); returns their sum. Whole vectors only: a
// prefix's last partial vector goes through a 16-float buffer (a scalar tail of up to 15 exponentials
// cost about as much as the vectors before it, prefixes in a prefill chunk averaging ~128 slots).
inline float exp_weights(float* __restrict row, int64_t n, int64_t end) {
  const int64_t full = n / kLanes * kLanes;
  const float lowest = -std::numeric_limits<float>::infinity();
  Vec top_lanes = Vec{} + lowest;
  for (int64_t s = 0; s < full; s += kLanes) {
    const Vec v = load(row + s);
    top_lanes = v > top_lanes ? v : top_lanes;
  }
  float top = lowest;
  for (int64_t l = 0; l < kLanes; ++l) top = std::max(top, top_lanes[l]);
  for (int64_t s = full; s < n; ++s) top = std::max(top, row[s]);
  Vec sum_lanes = {};
  for (int64_t s = 0; s < full; s += kLanes) {
    float* w = row + s;
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) w[l] = coevo_jax::exp_nonpositive(w[l] - top);
    sum_lanes += load(w);
  }
  if (full < n) {
    float buffer[kLanes];
    const int64_t rest = n - full;
    for (int64_t l = 0; l < kLanes; ++l) buffer[l] = l < rest ? row[full + l] - top : -100.0f;
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) buffer[l] = l < rest ? coevo_jax::exp_nonpositive(buffer[l]) : 0.0f;
    std::copy(buffer, buffer + rest, row + full);
    sum_lanes += load(buffer);
  }
  std::fill(row + n, row + end, 0.0f);
  float total = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) total += sum_lanes[l];
  return total;
}

template <int J>
void score_and_mix(const float (*query)[kMaxDim], const float* k, const float* v, int64_t S, int64_t E,
                   int64_t longest, const int64_t* prefix, float* scores, float (*mixed)[kMaxDim]) {
  score<J>(query, k, S, E, longest, scores);
  float inverse[J];
  for (int j = 0; j < J; ++j) {  // weights over [0, prefix), zeros beyond; normalised after mixing
    float* row = scores + j * S;
    const int64_t n = prefix[j];
    inverse[j] = n > 0 ? 1.0f / exp_weights(row, n, longest) : 0.0f;
    if (n == 0) std::fill(row, row + longest, 0.0f);
  }
  mix<J>(scores, S, v, E, longest, mixed);
  for (int j = 0; j < J; ++j) {
    for (int64_t e = 0; e < E; ++e) mixed[j][e] *= inverse[j];
  }
}

// One (row, kv head): its queries in blocks of up to `kBlock` (a decode step's G heads, or a chunk's
// consecutive positions of one head, whose prefixes differ by one slot each); each block reads the keys and
// values of its longest prefix once, and every query normalises over its own prefix.
void attend_pair(const Shapes& d, float scale, const float* q, const float* k, const float* v,
                 const int32_t* limits, float* out, float* scores) {
  for (int64_t first = 0; first < d.Q; first += kBlock) {
    const int64_t count = std::min(kBlock, d.Q - first);
    int64_t prefix[kBlock], longest = 0;
    for (int64_t j = 0; j < count; ++j) {
      prefix[j] = std::clamp<int64_t>(limits[(first + j) % d.T], 0, d.S);
      longest = std::max(longest, prefix[j]);
    }
    float* result = out + first * d.E;
    if (longest == 0) {
      std::fill(result, result + count * d.E, 0.0f);
      continue;
    }
    float query[kBlock][kMaxDim];  // scaled queries
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t e = 0; e < d.E; ++e) query[j][e] = q[(first + j) * d.E + e] * scale;
    }
    float mixed[kBlock][kMaxDim];
    switch (count) {
      case 1: score_and_mix<1>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
      case 2: score_and_mix<2>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
      case 3: score_and_mix<3>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
      case 4: score_and_mix<4>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
      case 5: score_and_mix<5>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
      case 6: score_and_mix<6>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
      case 7: score_and_mix<7>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
      default: score_and_mix<8>(query, k, v, d.S, d.E, longest, prefix, scores, mixed); break;
    }
    for (int64_t j = 0; j < count; ++j) {
      if (prefix[j] == 0) {
        std::fill(result + j * d.E, result + (j + 1) * d.E, 0.0f);
      } else {
        std::copy(mixed[j], mixed[j] + d.E, result + j * d.E);
      }
    }
  }
}

void attend_pairs(const Shapes& d, float scale, const float* q, const float* k, const float* v,
                  const int32_t* limits, float* out, int64_t begin, int64_t end) {
  std::vector<float> scores(kBlock * d.S);
  for (int64_t pair = begin; pair < end; ++pair) {
    const int64_t b = pair / d.K;
    attend_pair(d, scale, q + pair * d.Q * d.E, k + pair * d.E * d.S, v + pair * d.S * d.E,
                limits + b * d.T, out + pair * d.Q * d.E, scores.data());
  }
}

ffi::Error PrefixAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> queries,
                               ffi::Buffer<ffi::F32> keys, ffi::Buffer<ffi::F32> values,
                               ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> limits,
                               ffi::ResultBuffer<ffi::F32> out, float scale) {
  const auto qd = queries.dimensions(), kd = keys.dimensions(), vd = values.dimensions();
  const auto ld = limits.dimensions();
  if (qd.size() != 4 || kd.size() != 5 || vd.size() != 5 || ld.size() != 2 || layer.element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "prefix_attention: expected 4-d queries, 5-d keys and values, a scalar layer, 2-d limits");
  }
  const Shapes d{qd[0], qd[1], qd[2], qd[3], kd[4], ld[1]};
  if (d.E > kMaxDim) {
    return ffi::Error::InvalidArgument("prefix_attention: head_dim above 256");
  }
  if (kd[1] != d.B || kd[2] != d.K || kd[3] != d.E || vd[0] != kd[0] || vd[1] != d.B || vd[2] != d.K ||
      vd[3] != d.S || vd[4] != d.E || ld[0] != d.B || d.T == 0 || d.Q % d.T != 0) {
    return ffi::Error::InvalidArgument("prefix_attention: inconsistent shapes");
  }
  const int64_t index = layer.typed_data()[0];
  if (index < 0 || index >= kd[0]) {
    return ffi::Error::InvalidArgument("prefix_attention: layer index out of range");
  }
  const int64_t layer_size = d.B * d.K * d.E * d.S;
  const float* q = queries.typed_data();
  const float* k = keys.typed_data() + index * layer_size;
  const float* v = values.typed_data() + index * layer_size;
  const int32_t* limit_data = limits.typed_data();
  float* out_data = out->typed_data();
  // chunks of (row, kv head) pairs, about four a thread
  const int64_t pairs = d.B * d.K;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), pairs));
  const int64_t wanted = std::min<int64_t>(pairs, threads * 4);
  const int64_t chunk = (pairs + wanted - 1) / wanted;
  coevo_jax::run_parts(pool, (pairs + chunk - 1) / chunk, [=](int64_t c) {
    attend_pairs(d, scale, q, k, v, limit_data, out_data, c * chunk, std::min(c * chunk + chunk, pairs));
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrefixAttentionF32, PrefixAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
