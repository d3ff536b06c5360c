// Thin SIMD wrappers the CPU kernels are written against once, as templates over an ISA type:
// ScalarIsa (portable, always built and tested) and the widest ISA the compiler targets
// (AVX-512F+BW or AVX2+FMA, chosen at compile time; the build uses -march=native).
// Internal to backend/cpu.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensor/dtype.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) || defined(__AVX2__) && defined(__FMA__)
// GCC 12's AVX-512 intrinsics initialise "undefined" operands from themselves and trip
// -Wmaybe-uninitialized where they inline; the warning is located in the header, so silence it
// for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

// Fully unrolls the short constant-trip loops over accumulators, so that they live in
// registers (at -O2, GCC otherwise keeps accumulator arrays on the stack).
#define TM_UNROLL _Pragma("GCC unroll 16")

namespace tokenmill::cpu {

// Width-1 "vectors": the portable fallback. I is a widened byte (one quantized element carrier).
struct ScalarIsa {
  static constexpr int W = 1;
  static constexpr const char* kName = "scalar";
  using V = float;
  using I = uint32_t;
  static V zero() { return 0.0f; }
  static V set1(float a) { return a; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V div(V a, V b) { return a / b; }
  static V exp(V x) { return std::exp(x); }
  static float reduce(V v) { return v; }
  static V load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static V load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static I load_u8(const uint8_t* p) { return *p; }
  // Bits [shift, shift+bits) of each widened byte, as float.
  template <int SHIFT, uint32_t MASK>
  static V plane(I v) {
    return static_cast<float>((v >> SHIFT) & MASK);
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__)
struct Avx512Isa {
  static constexpr int W = 16;
  static constexpr const char* kName = "avx512";
  using V = __m512;
  using I = __m512i;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  // e^x to ~1 ulp (Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial in r, then
  // 2^n by vscalefps, which gives 0 below ~-104 and +inf above ~88.7; NaN stays NaN).
  static V exp(V x) {
    x = _mm512_min_ps(_mm512_set1_ps(100.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
  static float reduce(V v) { return _mm512_reduce_add_ps(v); }
  // bf16 -> f32 is a 16-bit left shift of the widened value.
  static V load_bf16(const uint16_t* p) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static I load_u8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  template <int SHIFT, uint32_t MASK>
  static V plane(I v) {
    __m512i m = _mm512_set1_epi32(static_cast<int>(MASK));
    if constexpr (SHIFT == 0) return _mm512_cvtepi32_ps(_mm512_and_si512(v, m));
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, SHIFT), m));
  }
};
using BestIsa = Avx512Isa;
#elif defined(__AVX2__) && defined(__FMA__)
struct Avx2Isa {
  static constexpr int W = 8;
  static constexpr const char* kName = "avx2";
  using V = __m256;
  using I = __m256i;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  // e^x to ~1 ulp as in Avx512Isa::exp; 2^n is built in the exponent field, so x is clamped to
  // [-87.3, 88.7] (results near FLT_MIN and FLT_MAX there instead of 0 and +inf).
  static V exp(V x) {
    const V nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    x = _mm256_min_ps(_mm256_set1_ps(88.7f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
    const V n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    V p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_or_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), nan);
  }
  static float reduce(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static V load_bf16(const uint16_t* p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I load_u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  template <int SHIFT, uint32_t MASK>
  static V plane(I v) {
    __m256i m = _mm256_set1_epi32(static_cast<int>(MASK));
    if constexpr (SHIFT == 0) return _mm256_cvtepi32_ps(_mm256_and_si256(v, m));
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, SHIFT), m));
  }
};
using BestIsa = Avx2Isa;
#else
using BestIsa = ScalarIsa;
#endif

// Vectors and scalars of F32 read from F32 or BF16 (uint16_t) storage: the BF16 KV cache's
// loops are the F32 ones with a widening load, so they round identically.
template <class S>
inline typename S::V load_elems(const float* p) {
  return S::load(p);
}
template <class S>
inline typename S::V load_elems(const uint16_t* p) {
  return S::load_bf16(p);
}
inline float elem_f32(float x) {
  return x;
}
inline float elem_f32(uint16_t x) {
  return bf16_to_f32(x);
}

// Float dot product and axpy over n elements with 4 independent accumulators (FMA latency); b
// may be F32 or BF16.
template <class S, class T = float>
inline float dot(const float* a, const T* b, int64_t n) {
  constexpr int W = S::W;
  typename S::V a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
  int64_t k = 0;
  for (; k + 4 * W <= n; k += 4 * W) {
    a0 = S::fma(S::load(a + k), load_elems<S>(b + k), a0);
    a1 = S::fma(S::load(a + k + W), load_elems<S>(b + k + W), a1);
    a2 = S::fma(S::load(a + k + 2 * W), load_elems<S>(b + k + 2 * W), a2);
    a3 = S::fma(S::load(a + k + 3 * W), load_elems<S>(b + k + 3 * W), a3);
  }
  for (; k + W <= n; k += W) a0 = S::fma(S::load(a + k), load_elems<S>(b + k), a0);
  float s = S::reduce(S::add(S::add(a0, a1), S::add(a2, a3)));
  for (; k < n; ++k) s += a[k] * elem_f32(b[k]);
  return s;
}

// y[0:n] = y*c + a*x  (c = 1 for a plain axpy).
template <class S>
inline void scale_axpy(float* y, float c, float a, const float* x, int64_t n) {
  constexpr int W = S::W;
  const typename S::V vc = S::set1(c), va = S::set1(a);
  int64_t k = 0;
  for (; k + W <= n; k += W)
    S::store(y + k, S::fma(va, S::load(x + k), S::mul(vc, S::load(y + k))));
  for (; k < n; ++k) y[k] = y[k] * c + a * x[k];
}

}  // namespace tokenmill::cpu

namespace tokenmill::cpu {

// Calls f(ScalarIsa{}) or f(BestIsa{}): kernels written as generic lambdas run either way.
template <class F>
inline void with_isa(bool scalar, F&& f) {
  if (scalar) {
    f(ScalarIsa{});
  } else {
    f(BestIsa{});
  }
}

inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
template <class S>
inline typename S::V silu_v(typename S::V x) {
  return S::div(x, S::add(S::set1(1.0f), S::exp(S::sub(S::zero(), x))));
}
template <class S>
inline typename S::V sigmoid_v(typename S::V x) {
  return S::div(S::set1(1.0f), S::add(S::set1(1.0f), S::exp(S::sub(S::zero(), x))));
}

}  // namespace tokenmill::cpu
