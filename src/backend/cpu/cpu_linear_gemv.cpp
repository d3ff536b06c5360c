// Fused dequantize-dot GEMV for n <= 8 activation rows: every weight row is streamed from
// memory once and dotted with all n rows while it is in registers (decode is bound by weight
// bandwidth, so the n-fold reuse is free).
//
// Affine weights use y = sum_g s_g * dot(q_g, x_g) + b_g * sum(x_g): the integer codes are
// converted to float and dotted with x per group, then scaled once per group; the bias term
// uses per-group sums of x computed once per call. For 2/4/8 bits the codes are unpacked by
// bit planes (SIMD and/shift of widened bytes), which yields them in a permuted order; x is
// permuted the same way once per call (gemv_prepare), so the dot product is unchanged.
#include <algorithm>
#include <type_traits>

#include "backend/cpu/cpu_linear.h"
#include "backend/cpu/cpu_simd.h"
#include "tensor/affine.h"
#include "util/error.h"

namespace tokenmill::cpu {
namespace {

template <int P>
using IC = std::integral_constant<int, P>;

// Floats of prepared x per activation row: the permuted row, then its group sums, padded to a
// whole number of cache lines so that every row (and every matrix's preparation in a
// linear_multi buffer) starts on a line boundary (the kernels' full-vector loads of x then never
// straddle two lines).
int64_t prep_stride(const MatView& m) {
  return (m.cols + m.groups + 15) / 16 * 16;
}

// Scales and biases are converted to F32 for kSbChunk groups of a row at a time, outside the
// dot-product loop (keeps the dtype switch and the f16 conversion call out of it).
constexpr int64_t kSbChunk = 64;
void load_row_sb(const MatView& m, int64_t r, int64_t g0, float* s, float* b) {
  const int64_t n = std::min(kSbChunk, m.groups - g0), base = r * m.groups + g0;
  if (m.scale_dtype == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      s[i] = load_sb(DType::BF16, m.scales, base + i);
      b[i] = load_sb(DType::BF16, m.biases, base + i);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    s[i] = load_sb(m.scale_dtype, m.scales, base + i);
    b[i] = load_sb(m.scale_dtype, m.biases, base + i);
  }
}

// Whether the bit-plane kernel applies: bits 2/4/8 and a group's bytes a whole number of
// vector-widths of bytes (otherwise the generic unpack path runs).
template <class S>
bool use_planes(const MatView& m) {
  if (m.bits != 2 && m.bits != 4 && m.bits != 8) return false;
  return (m.group * m.bits / 8) % S::W == 0;
}

// Position of element j (within its group) in the plane order: byte c*W + l of the group
// holds elements (c*W + l)*P + p for planes p < P; plane p of byte chunk c lands at
// (c*P + p)*W + l.
template <class S>
int64_t plane_pos(int64_t j, int bits) {
  const int64_t P = 8 / bits, W = S::W;
  const int64_t byte = j / P, p = j % P, c = byte / W, l = byte % W;
  return (c * P + p) * W + l;
}

// 4-bit on AVX-512 with rows of whole 64-byte blocks: one load gives 16 dwords of 8 nibbles;
// nibble k of dword l is element 8l + k of the 128-element block (see affine4_blocks).
template <class S>
bool use_nibble_blocks(const MatView& m) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  return std::is_same_v<S, Avx512Isa> && m.bits == 4 && m.cols % 128 == 0;
#else
  (void)m;
  return false;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The nibble-block order of x (see affine4_row): per 128-element block, out[16k + l] =
// in[8l + k]. Element e = 8l + k sits in vector e >> 4 = (l3 l2 l1), lane (l0 k2 k1 k0); it
// goes to vector (k2 k1 k0), lane (l3 l2 l1 l0). Three two-source permute stages each swap one
// vector-index bit with one lane bit ((l3,k2), (l2,k1), (l1,k0)), leaving lane (l0 l3 l2 l1),
// which a final one-source permute rotates into place: 32 permutes per block.
struct NibbleOrder {
  __m512i lo[3], hi[3], rot;
  NibbleOrder() {
    alignas(64) int32_t a[16], b[16];
    for (int st = 0; st < 3; ++st) {
      const int lb = 2 - st;  // lane bit swapped with vector bit 2 - st
      for (int j = 0; j < 16; ++j) {
        const int src = (j >> lb & 1) ? 16 : 0;
        a[j] = (j & ~(1 << lb)) | src;
        b[j] = (j | (1 << lb)) | src;
      }
      lo[st] = _mm512_load_si512(a);
      hi[st] = _mm512_load_si512(b);
    }
    // Lane (l0 l3 l2 l1) -> (l3 l2 l1 l0): output lane t = (l3 l2 l1 l0) reads input lane
    // ((t & 1) << 3) | (t >> 1).
    for (int t = 0; t < 16; ++t) a[t] = ((t & 1) << 3) | (t >> 1);
    rot = _mm512_load_si512(a);
  }
  void block(const float* in, float* out) const {
    __m512 v[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm512_loadu_ps(in + 16 * i);
    for (int st = 0; st < 3; ++st) {
      const int vb = 2 - st;  // pairs differ in vector-index bit vb
      for (int i = 0; i < 8; ++i) {
        if (i >> vb & 1) continue;
        const int k = i | (1 << vb);
        const __m512 a = _mm512_permutex2var_ps(v[i], lo[st], v[k]);
        const __m512 b = _mm512_permutex2var_ps(v[i], hi[st], v[k]);
        v[i] = a;
        v[k] = b;
      }
    }
    for (int i = 0; i < 8; ++i) _mm512_storeu_ps(out + 16 * i, _mm512_permutexvar_ps(rot, v[i]));
  }
};
#endif

template <class S>
void prepare(const MatView& m, const float* x, int64_t ldx, int64_t n, float* prep) {
  const int64_t cols = m.cols, G = m.group, stride = prep_stride(m);
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (std::is_same_v<S, Avx512Isa>) {
    if (use_nibble_blocks<S>(m)) {
      const NibbleOrder order;
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x + i * ldx;
        float* xp = prep + i * stride;
        for (int64_t blk = 0; blk < cols; blk += 128) order.block(xi + blk, xp + blk);
        // Group sums (for the bias term), two vector partial sums per group.
        for (int64_t g = 0; g < m.groups; ++g) {
          const float* xg = xi + g * G;
          __m512 s0 = _mm512_loadu_ps(xg), s1 = _mm512_loadu_ps(xg + 16);
          for (int64_t j = 32; j < G; j += 32) {
            s0 = _mm512_add_ps(s0, _mm512_loadu_ps(xg + j));
            s1 = _mm512_add_ps(s1, _mm512_loadu_ps(xg + j + 16));
          }
          xp[cols + g] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
        }
      }
      return;
    }
  }
#endif
  if (use_nibble_blocks<S>(m)) {
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * ldx;
      float* xp = prep + i * stride;
      for (int64_t blk = 0; blk < cols; blk += 128) {
        for (int k = 0; k < 8; ++k)
          for (int l = 0; l < 16; ++l) xp[blk + k * 16 + l] = xi[blk + 8 * l + k];
      }
      for (int64_t g = 0; g < m.groups; ++g) {
        double sum = 0.0;
        for (int64_t j = 0; j < G; ++j) sum += xi[g * G + j];
        xp[cols + g] = static_cast<float>(sum);
      }
    }
    return;
  }
  const bool planes = use_planes<S>(m);
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * ldx;
    float* xp = prep + i * stride;
    float* xs = xp + cols;
    for (int64_t g = 0; g < m.groups; ++g) {
      double sum = 0.0;
      for (int64_t j = 0; j < G; ++j) {
        const float v = xi[g * G + j];
        sum += v;
        xp[g * G + (planes ? plane_pos<S>(j, m.bits) : j)] = v;
      }
      xs[g] = static_cast<float>(sum);
    }
  }
}

template <class S, int BITS, int N>
void affine_planes(const MatView& m, const float* prep, float* out, int64_t ldo, int64_t r0,
                   int64_t r1) {
  using V = typename S::V;
  constexpr int W = S::W, P = 8 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const int64_t G = m.group, groups = m.groups, cols = m.cols, stride = prep_stride(m);
  const int64_t chunks = G * BITS / 8 / W, group_bytes = G * BITS / 8;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wb = m.data + r * m.row_bytes;
    float sbuf[kSbChunk], bbuf[kSbChunk];
    V acc[N];
    float bsum[N];
    TM_UNROLL
    for (int i = 0; i < N; ++i) acc[i] = S::zero(), bsum[i] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      if (g % kSbChunk == 0) load_row_sb(m, r, g, sbuf, bbuf);
      const float s = sbuf[g % kSbChunk], b = bbuf[g % kSbChunk];
      const uint8_t* gb = wb + g * group_bytes;
      const float* xg = prep + g * G;
      V gacc[N];
      TM_UNROLL
      for (int i = 0; i < N; ++i) gacc[i] = S::zero();
      for (int64_t c = 0; c < chunks; ++c) {
        const typename S::I v = S::load_u8(gb + c * W);
        auto plane = [&](auto pc) {
          constexpr int p = decltype(pc)::value;
          const V q = S::template plane<p * BITS, MASK>(v);
          const int64_t off = (c * P + p) * W;
          TM_UNROLL
          for (int i = 0; i < N; ++i) gacc[i] = S::fma(q, S::load(xg + i * stride + off), gacc[i]);
        };
        plane(IC<0>{});
        if constexpr (P > 1) plane(IC<1>{});
        if constexpr (P > 2) {
          plane(IC<2>{});
          plane(IC<3>{});
        }
      }
      const V vs = S::set1(s);
      TM_UNROLL
      for (int i = 0; i < N; ++i) {
        acc[i] = S::fma(vs, gacc[i], acc[i]);
        bsum[i] += b * prep[i * stride + cols + g];
      }
    }
    TM_UNROLL
    for (int i = 0; i < N; ++i) out[i * ldo + r] = S::reduce(acc[i]) + bsum[i];
  }
}

// The per-row, per-group dot of the kernels that turn a group's codes into float vectors first:
// `codes.start(row, g)` once per group, then `codes.at(c)` gives the codes [c, c + S::W) of it.
template <class S, int N, class Codes>
void affine_rows(const MatView& m, const float* prep, float* out, int64_t ldo, int64_t r0,
                 int64_t r1, Codes& codes) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int64_t G = m.group, groups = m.groups, cols = m.cols, stride = prep_stride(m);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wb = m.data + r * m.row_bytes;
    float sbuf[kSbChunk], bbuf[kSbChunk];
    V acc[N];
    float bsum[N];
    TM_UNROLL
    for (int i = 0; i < N; ++i) acc[i] = S::zero(), bsum[i] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      codes.start(wb, g);
      if (g % kSbChunk == 0) load_row_sb(m, r, g, sbuf, bbuf);
      const float s = sbuf[g % kSbChunk], b = bbuf[g % kSbChunk];
      const float* xg = prep + g * G;
      V gacc[N];
      TM_UNROLL
      for (int i = 0; i < N; ++i) gacc[i] = S::zero();
      for (int64_t c = 0; c < G; c += W) {
        const V qv = codes.at(c);
        TM_UNROLL
        for (int i = 0; i < N; ++i) gacc[i] = S::fma(qv, S::load(xg + i * stride + c), gacc[i]);
      }
      const V vs = S::set1(s);
      TM_UNROLL
      for (int i = 0; i < N; ++i) {
        acc[i] = S::fma(vs, gacc[i], acc[i]);
        bsum[i] += b * prep[i * stride + cols + g];
      }
    }
    TM_UNROLL
    for (int i = 0; i < N; ++i) out[i * ldo + r] = S::reduce(acc[i]) + bsum[i];
  }
}

// Any bit width: unpack each group to bytes (natural order), then the same per-group dot.
template <class S>
struct BytewiseCodes {
  const MatView& m;
  alignas(64) uint8_t q[128];
  void start(const uint8_t* row, int64_t g) { unpack_group(m, row, g, q); }
  typename S::V at(int64_t c) const { return S::template plane<0, 0xffu>(S::load_u8(q + c)); }
};

template <class S, int N>
void affine_generic(const MatView& m, const float* prep, float* out, int64_t ldo, int64_t r0,
                    int64_t r1) {
  BytewiseCodes<S> codes{m, {}};
  affine_rows<S, N>(m, prep, out, ldo, r0, r1, codes);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VBMI__)
// Odd bit widths (3, 5, 6) on AVX-512 VBMI: 16 consecutive codes span 2*BITS bytes; one byte
// permute puts the 4 bytes holding code l into dword lane l, a per-lane variable shift and a
// mask extract it. The load is masked to exactly those bytes (never reads past the row).
template <int BITS>
struct OddUnpack {
  __m512i idx, shift, mask;
  OddUnpack() {
    alignas(64) uint8_t ib[64];
    alignas(64) uint32_t sh[16];
    for (int l = 0; l < 16; ++l) {
      const int bit = l * BITS;
      for (int b = 0; b < 4; ++b) ib[4 * l + b] = static_cast<uint8_t>(std::min(bit / 8 + b, 63));
      sh[l] = static_cast<uint32_t>(bit % 8);
    }
    idx = _mm512_load_si512(ib);
    shift = _mm512_load_si512(sh);
    mask = _mm512_set1_epi32((1 << BITS) - 1);
  }
  __m512 operator()(const uint8_t* p) const {
    const __m512i src = _mm512_maskz_loadu_epi8((uint64_t{1} << (2 * BITS)) - 1, p);
    const __m512i d = _mm512_srlv_epi32(_mm512_permutexvar_epi8(idx, src), shift);
    return _mm512_cvtepi32_ps(_mm512_and_si512(d, mask));
  }
};

template <int BITS>
struct OddCodes {
  const OddUnpack<BITS> unpack;
  const int64_t group;
  const uint8_t* gb = nullptr;
  void start(const uint8_t* row, int64_t g) { gb = row + g * group * BITS / 8; }
  __m512 at(int64_t c) const { return unpack(gb + c / 16 * 2 * BITS); }
};

template <int BITS, int N>
void affine_odd_vbmi(const MatView& m, const float* prep, float* out, int64_t ldo, int64_t r0,
                     int64_t r1) {
  static_assert(Avx512Isa::W == 16, "OddUnpack yields 16 codes per vector");
  OddCodes<BITS> codes{OddUnpack<BITS>(), m.group};
  affine_rows<Avx512Isa, N>(m, prep, out, ldo, r0, r1, codes);
}
#define TM_HAVE_ODD_VBMI 1
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
// Scales or biases of groups [g0, g0 + count) of row r as F32 lanes (count <= 16; the other
// lanes are 0).
template <DType SD>
inline __m512 load_sb16(const uint8_t* base, int64_t idx, __mmask16 k) {
  if constexpr (SD == DType::F32) return _mm512_maskz_loadu_ps(k, base + idx * 4);
  const __m256i h = _mm256_maskz_loadu_epi16(k, base + idx * 2);
  if constexpr (SD == DType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 4-bit, 128 elements (64 bytes) per step. One load gives 16 dwords of 8 nibbles; nibble
// plane k = (dwords >> 4k) looked up in a 16-entry float table by vpermps (which reads only the
// low 4 bits of each index: no mask, no int->float conversion). Lane l belongs to group 8l/G of
// the block. Per chunk of 16 groups the row's scales and biases are converted once as vectors;
// the bias term sum_g b_g * sum(x_g) is one lane-wise FMA into the accumulator (every lane is
// summed at the end), and the scales are permuted to lanes once per block.
//
// One row at a time: several rows at once share the x loads and ran 10-20% faster with the
// matrix in L3, but from DRAM the interleaved access to several rows defeats the hardware
// prefetcher (a decode's GEMVs on 2 threads: 23-26 GB/s with 4 rows, 31-34 GB/s with 1).
// Everything loop-invariant is hoisted into locals and the scale type is a template parameter:
// with the fields read through the MatView and a type switch per row the same loop ran ~20%
// slower (register spills).
template <int N, DType SD>
void affine4_rows(const MatView& m, const float* prep, float* out, int64_t ldo, int64_t r0,
                  int64_t r1) {
  using S = Avx512Isa;
  using V = S::V;
  const int64_t G = m.group, groups = m.groups, cols = m.cols, stride = prep_stride(m);
  const int64_t row_bytes = m.row_bytes;
  const uint8_t *data = m.data, *scales = m.scales, *biases = m.biases;
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  alignas(64) int32_t gi[16];
  for (int l = 0; l < 16; ++l) gi[l] = static_cast<int32_t>(8 * l / G);
  const __m512i gidx0 = _mm512_load_si512(gi);  // lane l -> group 8l/G of a block
  const __m512i gstep = _mm512_set1_epi32(static_cast<int>(128 / G));
  const int64_t blocks_per_chunk = 16 * G / 128;  // blocks of 16 groups
  const int64_t blocks = cols / 128;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wrow = data + r * row_bytes;
    V acc[N];
    TM_UNROLL
    for (int i = 0; i < N; ++i) acc[i] = S::zero();
    for (int64_t b0 = 0; b0 < blocks; b0 += blocks_per_chunk) {
      const int64_t g0 = b0 * 128 / G, count = std::min<int64_t>(16, groups - g0);
      const auto k = static_cast<__mmask16>((1u << count) - 1u);
      const V sc = load_sb16<SD>(scales, r * groups + g0, k);
      const V bv = load_sb16<SD>(biases, r * groups + g0, k);
      TM_UNROLL
      for (int i = 0; i < N; ++i)
        acc[i] = S::fma(bv, _mm512_maskz_loadu_ps(k, prep + i * stride + cols + g0), acc[i]);
      __m512i gidx = gidx0;
      const int64_t b1 = std::min(blocks, b0 + blocks_per_chunk);
      for (int64_t b = b0; b < b1; ++b) {
        const float* xb = prep + b * 128;
        __m512i w = _mm512_loadu_si512(wrow + b * 64);
        // One load into a register: otherwise GCC folds the load into each of the seven
        // shifts, and eight loads of a line still in flight from memory cost ~30% of the speed.
        asm("" : "+v"(w));
        V ga[N], gb[N];
        TM_UNROLL
        for (int i = 0; i < N; ++i) {
          ga[i] = S::mul(_mm512_permutexvar_ps(w, table), S::load(xb + i * stride));
          gb[i] = S::mul(_mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), table),
                         S::load(xb + i * stride + 16));
        }
        auto plane2 = [&](auto kc) {  // planes k and k+1 into the two chains
          constexpr int kp = decltype(kc)::value;
          const V qa = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4 * kp), table);
          const V qb = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4 * kp + 4), table);
          TM_UNROLL
          for (int i = 0; i < N; ++i) {
            ga[i] = S::fma(qa, S::load(xb + i * stride + 16 * kp), ga[i]);
            gb[i] = S::fma(qb, S::load(xb + i * stride + 16 * kp + 16), gb[i]);
          }
        };
        plane2(IC<2>{});
        plane2(IC<4>{});
        plane2(IC<6>{});
        const V vs = _mm512_permutexvar_ps(gidx, sc);
        TM_UNROLL
        for (int i = 0; i < N; ++i) acc[i] = S::fma(vs, S::add(ga[i], gb[i]), acc[i]);
        gidx = _mm512_add_epi32(gidx, gstep);
      }
    }
    TM_UNROLL
    for (int i = 0; i < N; ++i) out[i * ldo + r] = S::reduce(acc[i]);
  }
}

template <int N>
void affine4_blocks(const MatView& m, const float* prep, float* out, int64_t ldo, int64_t r0,
                    int64_t r1) {
  switch (m.scale_dtype) {
    case DType::F32:
      return affine4_rows<N, DType::F32>(m, prep, out, ldo, r0, r1);
    case DType::F16:
      return affine4_rows<N, DType::F16>(m, prep, out, ldo, r0, r1);
    default:
      return affine4_rows<N, DType::BF16>(m, prep, out, ldo, r0, r1);
  }
}
#endif

template <class S, DType T>
typename S::V load_w(const uint8_t* p, int64_t k) {
  if constexpr (T == DType::F32) return S::load(reinterpret_cast<const float*>(p) + k);
  if constexpr (T == DType::BF16) return S::load_bf16(reinterpret_cast<const uint16_t*>(p) + k);
  if constexpr (T == DType::F16) return S::load_f16(reinterpret_cast<const uint16_t*>(p) + k);
}

template <DType T>
float load_w1(const uint8_t* p, int64_t k) {
  if constexpr (T == DType::F32) return reinterpret_cast<const float*>(p)[k];
  if constexpr (T == DType::BF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
  if constexpr (T == DType::F16) return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
}

// Float weights: U independent accumulators per activation row hide the FMA latency.
template <class S, DType T, int N>
void float_rows(const MatView& m, const float* x, int64_t ldx, float* out, int64_t ldo, int64_t r0,
                int64_t r1) {
  using V = typename S::V;
  constexpr int W = S::W;
  constexpr int U = N == 1 ? 4 : (N <= 3 ? 2 : 1);
  const int64_t cols = m.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = m.data + r * m.row_bytes;
    V acc[N][U];
    TM_UNROLL
    for (int i = 0; i < N; ++i) TM_UNROLL
    for (int u = 0; u < U; ++u) acc[i][u] = S::zero();
    int64_t k = 0;
    for (; k + U * W <= cols; k += U * W) {
      TM_UNROLL
      for (int u = 0; u < U; ++u) {
        const V w = load_w<S, T>(wr, k + u * W);
        TM_UNROLL
        for (int i = 0; i < N; ++i)
          acc[i][u] = S::fma(w, S::load(x + i * ldx + k + u * W), acc[i][u]);
      }
    }
    for (; k + W <= cols; k += W) {
      const V w = load_w<S, T>(wr, k);
      TM_UNROLL
      for (int i = 0; i < N; ++i) acc[i][0] = S::fma(w, S::load(x + i * ldx + k), acc[i][0]);
    }
    TM_UNROLL
    for (int i = 0; i < N; ++i) {
      V a = acc[i][0];
      TM_UNROLL
      for (int u = 1; u < U; ++u) a = S::add(a, acc[i][u]);
      float s = S::reduce(a);
      for (int64_t kk = k; kk < cols; ++kk) s += load_w1<T>(wr, kk) * x[i * ldx + kk];
      out[i * ldo + r] = s;
    }
  }
}

template <class S, int N>
void rows_n(const MatView& m, const float* x, int64_t ldx, const float* prep, float* out,
            int64_t ldo, int64_t r0, int64_t r1) {
  if (m.bits == 0) {
    switch (m.dtype) {
      case DType::F32:
        return float_rows<S, DType::F32, N>(m, x, ldx, out, ldo, r0, r1);
      case DType::BF16:
        return float_rows<S, DType::BF16, N>(m, x, ldx, out, ldo, r0, r1);
      default:
        return float_rows<S, DType::F16, N>(m, x, ldx, out, ldo, r0, r1);
    }
  }
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (std::is_same_v<S, Avx512Isa>) {
    if (use_nibble_blocks<S>(m)) return affine4_blocks<N>(m, prep, out, ldo, r0, r1);
  }
#endif
  if (use_planes<S>(m)) {
    if (m.bits == 4) return affine_planes<S, 4, N>(m, prep, out, ldo, r0, r1);
    if (m.bits == 8) return affine_planes<S, 8, N>(m, prep, out, ldo, r0, r1);
    return affine_planes<S, 2, N>(m, prep, out, ldo, r0, r1);
  }
#ifdef TM_HAVE_ODD_VBMI
  if constexpr (std::is_same_v<S, Avx512Isa>) {
    if (m.bits == 3) return affine_odd_vbmi<3, N>(m, prep, out, ldo, r0, r1);
    if (m.bits == 5) return affine_odd_vbmi<5, N>(m, prep, out, ldo, r0, r1);
    if (m.bits == 6) return affine_odd_vbmi<6, N>(m, prep, out, ldo, r0, r1);
  }
#endif
  affine_generic<S, N>(m, prep, out, ldo, r0, r1);
}

template <class S>
void rows(const MatView& m, const float* x, int64_t ldx, const float* prep, int64_t n, float* out,
          int64_t ldo, int64_t r0, int64_t r1) {
  switch (n) {
    case 1:
      return rows_n<S, 1>(m, x, ldx, prep, out, ldo, r0, r1);
    case 2:
      return rows_n<S, 2>(m, x, ldx, prep, out, ldo, r0, r1);
    case 3:
      return rows_n<S, 3>(m, x, ldx, prep, out, ldo, r0, r1);
    case 4:
      return rows_n<S, 4>(m, x, ldx, prep, out, ldo, r0, r1);
    case 5:
      return rows_n<S, 5>(m, x, ldx, prep, out, ldo, r0, r1);
    case 6:
      return rows_n<S, 6>(m, x, ldx, prep, out, ldo, r0, r1);
    case 7:
      return rows_n<S, 7>(m, x, ldx, prep, out, ldo, r0, r1);
    case 8:
      return rows_n<S, 8>(m, x, ldx, prep, out, ldo, r0, r1);
    default:
      TM_CHECK(false, "gemv with {} rows (at most 8)", n);
  }
}

}  // namespace

size_t gemv_prep_floats(const MatView& m, int64_t n) {
  return m.bits == 0 ? 0 : static_cast<size_t>(n * prep_stride(m));
}

void gemv_prepare(bool scalar, const MatView& m, const float* x, int64_t ldx, int64_t n,
                  float* prep) {
  if (m.bits == 0) return;
  if (scalar) return prepare<ScalarIsa>(m, x, ldx, n, prep);
  prepare<BestIsa>(m, x, ldx, n, prep);
}

void gemv_rows(bool scalar, const MatView& m, const float* x, int64_t ldx, const float* prep,
               int64_t n, float* out, int64_t ldo, int64_t r0, int64_t r1) {
  if (scalar) return rows<ScalarIsa>(m, x, ldx, prep, n, out, ldo, r0, r1);
  rows<BestIsa>(m, x, ldx, prep, n, out, ldo, r0, r1);
}

}  // namespace tokenmill::cpu
