// The kernels' vector type and scalar math written for the compiler to vectorise (-O3 -march=native).
#ifndef COEVO_JAX_VECTOR_MATH_H_
#define COEVO_JAX_VECTOR_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace coevo_jax {

// Vectors of 16 floats (GCC/Clang vector extensions: one AVX-512 register, two AVX2 ones), so that the
// kernels keep their accumulators in registers whatever the instruction set; loads and stores unaligned.
constexpr int64_t kLanes = 16;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }

// exp(x) for x <= 0 (softmax arguments), as a loop body the compiler vectorises: x = n ln2 + r with
// |r| <= ln2 / 2, a degree-6 polynomial for exp(r), 2^n built in the exponent. Relative error at most
// 2.4e-7 over every float in [-87, 0] against double-precision exp.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // below: 0 to float precision (2^-126 is the smallest normal)
  const float n = std::nearbyint(x * 1.44269504088896341f);
  // the high part of ln 2 first: x - n ln2_hi cancels exactly, so r keeps x's low bits
  const float r = std::fma(n, -1.428606765330187e-06f, std::fma(n, -0.693145751953125f, x));
  float p = 1.0f / 720.0f;
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace coevo_jax

#endif  // COEVO_JAX_VECTOR_MATH_H_
