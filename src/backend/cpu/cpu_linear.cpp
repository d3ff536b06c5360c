// CpuBackend::linear: picks the fused GEMV (n <= 8) or the blocked GEMM and spreads the work
// over the pool; plus the weight-format helpers both paths share.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_linear.h"
#include "tensor/affine.h"
#include "util/error.h"

namespace tokenmill::cpu {

MatView resolve(const Weight& w, int expert) {
  MatView m;
  TM_CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0, "linear on an empty weight ({}x{})",
           w.rows, w.cols);
  TM_CHECK(w.packing == 0, "weight in another backend's packing ({}): upload it to this one",
           w.packing);
  const int64_t count = w.experts > 0 ? w.experts : 1;
  TM_CHECK(expert >= 0 && expert < count, "expert {} of a weight with {} matrices", expert, count);
  m.dtype = w.dtype;
  m.bits = w.bits;
  m.group = w.group;
  m.scale_dtype = w.scale_dtype;
  m.rows = w.rows;
  m.cols = w.cols;
  const auto* base = static_cast<const uint8_t*>(w.data);
  if (!w.quantized()) {
    TM_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16,
             "float weight of type {} (expected F32, F16 or BF16)", dtype_name(w.dtype));
    m.row_bytes = w.cols * static_cast<int64_t>(dtype_size(w.dtype));
    m.data = base + expert * m.rows * m.row_bytes;
    return m;
  }
  affine::check_layout(w.bits, w.group, w.cols, "affine weight");
  TM_CHECK(
      w.scale_dtype == DType::F32 || w.scale_dtype == DType::BF16 || w.scale_dtype == DType::F16,
      "affine scales of type {}", dtype_name(w.scale_dtype));
  TM_CHECK(w.scales != nullptr && w.biases != nullptr, "affine weight without scales/biases");
  m.row_bytes = affine::words_per_row(w.cols, w.bits) * 4;
  m.groups = w.cols / w.group;
  const int64_t sb_bytes = m.rows * m.groups * static_cast<int64_t>(dtype_size(w.scale_dtype));
  m.data = base + expert * m.rows * m.row_bytes;
  m.scales = static_cast<const uint8_t*>(w.scales) + expert * sb_bytes;
  m.biases = static_cast<const uint8_t*>(w.biases) + expert * sb_bytes;
  return m;
}

void unpack_group(const MatView& m, const uint8_t* row, int64_t g, uint8_t* q) {
  const int bits = m.bits;
  const uint32_t mask = (1u << bits) - 1u;
  const uint8_t* p = row + g * m.group * bits / 8;  // groups start on a word boundary
  // A bit buffer refilled one little-endian U32 word at a time (memcpy: the mapped checkpoint
  // gives no alignment guarantee).
  uint64_t buf = 0;
  int have = 0;
  for (int64_t j = 0; j < m.group; ++j) {
    if (have < bits) {
      uint32_t word;
      std::memcpy(&word, p, 4);
      p += 4;
      buf |= static_cast<uint64_t>(word) << have;
      have += 32;
    }
    q[j] = static_cast<uint8_t>(buf & mask);
    buf >>= bits;
    have -= bits;
  }
}

void dequantize_segment(const MatView& m, int64_t r, int64_t k0, int64_t len, float* out) {
  const uint8_t* row = m.data + r * m.row_bytes;
  if (m.bits == 0) {
    convert_to_f32(m.dtype, row + k0 * static_cast<int64_t>(dtype_size(m.dtype)), out,
                   static_cast<size_t>(len));
    return;
  }
  alignas(64) uint8_t q[128];
  for (int64_t g = k0 / m.group; g < (k0 + len) / m.group; ++g) {
    unpack_group(m, row, g, q);
    const float s = load_sb(m.scale_dtype, m.scales, r * m.groups + g);
    const float b = load_sb(m.scale_dtype, m.biases, r * m.groups + g);
    float* o = out + g * m.group - k0;
    for (int64_t j = 0; j < m.group; ++j) o[j] = s * static_cast<float>(q[j]) + b;
  }
}

void run_task(bool scalar, const LinearTask& t, float* scratch) {
  if (t.n <= CpuBackend::kGemvMaxRows) {
    gemv_rows(scalar, t.m, t.x, t.ldx, t.prep, t.n, t.out, t.ldo, t.r0, t.r1);
    return;
  }
  for (int64_t r0 = t.r0; r0 < t.r1; r0 += kGemmTileRows) {
    gemm_tile(scalar, t.m, t.x, t.ldx, 0, t.n, t.out, t.ldo, r0, std::min(t.r1, r0 + kGemmTileRows),
              scratch);
  }
}

}  // namespace tokenmill::cpu

namespace tokenmill {

void CpuBackend::linear(const float* x, int64_t n, const Weight& w, float* out, int expert) {
  linear_strided(x, w.cols, n, w, expert, out, w.rows);
}

void CpuBackend::linear_strided(const float* x, int64_t ldx, int64_t n, const Weight& w, int expert,
                                float* out, int64_t ldo) {
  if (n <= 0) return;
  const cpu::MatView m = cpu::resolve(w, expert);
  const bool scalar = options_.scalar_kernels;
  if (n <= kGemvMaxRows) {
    float* prep = shared_scratch(cpu::gemv_prep_floats(m, n));
    cpu::gemv_prepare(scalar, m, x, ldx, n, prep);
    pool_.run(
        m.rows,
        [&](int64_t b, int64_t e, int) {
          cpu::gemv_rows(scalar, m, x, ldx, prep, n, out, ldo, b, e);
        },
        16);
    return;
  }
  reserve_thread_scratch(cpu::gemm_scratch_floats());
  // Work items: W row tiles x activation-row blocks; activation rows are split only when there
  // are too few row tiles to keep every thread busy (each split re-dequantizes the tile).
  const int64_t tiles = (m.rows + cpu::kGemmTileRows - 1) / cpu::kGemmTileRows;
  const int64_t want = 2 * static_cast<int64_t>(pool_.size());
  int64_t parts = tiles >= want ? 1 : std::min((want + tiles - 1) / tiles, (n + 5) / 6);
  const int64_t per = ((n + parts - 1) / parts + 5) / 6 * 6;
  parts = (n + per - 1) / per;
  pool_.run(
      tiles * parts,
      [&](int64_t b, int64_t e, int t) {
        for (int64_t item = b; item < e; ++item) {
          const int64_t tile = item / parts, part = item % parts;
          const int64_t i0 = part * per, i1 = std::min(n, i0 + per);
          const int64_t r0 = tile * cpu::kGemmTileRows;
          const int64_t r1 = std::min(m.rows, r0 + cpu::kGemmTileRows);
          cpu::gemm_tile(scalar, m, x, ldx, i0, i1, out, ldo, r0, r1, thread_scratch(t));
        }
      },
      1);
}

void CpuBackend::linear_multi(const float* x, int64_t n, const Weight* const* ws,
                              float* const* outs, int count) {
  if (n <= 0 || count <= 0) return;
  constexpr int kMaxParts = 8;
  if (n > kGemvMaxRows || count == 1 || count > kMaxParts) {
    for (int i = 0; i < count; ++i) linear(x, n, *ws[i], outs[i]);
    return;
  }
  const bool scalar = options_.scalar_kernels;
  struct Part {
    cpu::MatView m;
    const float* prep;
    float* out;
    int64_t row0;  // first row of this matrix in the concatenated row range
  };
  Part parts[kMaxParts];
  // x prepared once per distinct layout (bits, group, cols): the matrices of one call usually
  // share it.
  size_t prep_floats = 0;
  for (int i = 0; i < count; ++i) {
    parts[i].m = cpu::resolve(*ws[i], 0);
    TM_CHECK(parts[i].m.cols == parts[0].m.cols, "linear_multi: matrices of {} and {} columns",
             parts[0].m.cols, parts[i].m.cols);
    prep_floats += cpu::gemv_prep_floats(parts[i].m, n);
  }
  float* prep = shared_scratch(prep_floats);
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) {
    Part& p = parts[i];
    p.out = outs[i];
    p.row0 = rows;
    rows += p.m.rows;
    p.prep = nullptr;
    for (int j = 0; j < i && p.m.bits > 0; ++j) {
      if (parts[j].m.bits == p.m.bits && parts[j].m.group == p.m.group) p.prep = parts[j].prep;
    }
    if (p.prep == nullptr && p.m.bits > 0) {
      cpu::gemv_prepare(scalar, p.m, x, p.m.cols, n, prep);
      p.prep = prep;
      prep += cpu::gemv_prep_floats(p.m, n);
    }
  }
  pool_.run(
      rows,
      [&](int64_t b, int64_t e, int) {
        for (int i = 0; i < count; ++i) {
          const Part& p = parts[i];
          const int64_t r0 = std::max(b, p.row0), r1 = std::min(e, p.row0 + p.m.rows);
          if (r0 >= r1) continue;
          cpu::gemv_rows(scalar, p.m, x, p.m.cols, p.prep, n, p.out, p.m.rows, r0 - p.row0,
                         r1 - p.row0);
        }
      },
      16);
}

void CpuBackend::embed(const Weight& table, const int32_t* ids, int n, float* out) {
  const cpu::MatView m = cpu::resolve(table, 0);
  for (int i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= m.rows) {
      fail(
          "embed: token id {} at row {} is outside the vocabulary of {} rows; the token ids "
          "do not match the model",
          ids[i], i, m.rows);
    }
  }
  pool_.run(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          cpu::dequantize_segment(m, ids[i], 0, m.cols, out + i * m.cols);
        }
      },
      4);
}

}  // namespace tokenmill
