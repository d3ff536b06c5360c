// The 4-bit tile layout both 4-bit GEMVs read (cuda_gemv_q4.cu, cuda_gemv_q4d.cu), made once at
// upload (Weight::packing == kQ4TilePacking) from the checkpoint's MLX packing.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.h"

namespace tokenmill::cuda {
namespace {

// ---- The tile layout (Weight::packing == kQ4TilePacking), made once at upload ----
// The checkpoint's row-major packing makes each lane gather its mma operands from two rows and
// its scales from four places (two 8-byte and four 2-byte loads per group). Rearranged, with
// W = G/32 words per lane and 16-row tiles (rows padded with zeros to a multiple of 16):
// - data: block (tile, group) is 32 lanes x 2W words; lane g*4+t holds words [t*W, t*W+W) of
//   the group in row 16*tile+g, then the same words of row 16*tile+g+8. A warp reads one block
//   as one contiguous 16*G/2-byte run, each lane its operands in one load.
// - scales: block (tile, group) is 8 x 4 values of the scale type, [g][scale(row g), bias(row
//   g), scale(row g+8), bias(row g+8)]: one 8-byte (F32: 16-byte) load per lane.
// Blocks go tile-major (a tile's groups are consecutive), then expert. Words keep their nibble
// order, so q4_unpack_word and the prepared activations are unchanged.

// One thread per destination word; blockIdx.y = expert.
__global__ void q4_pack_data_kernel(const uint32_t* __restrict__ src, int64_t rows, int64_t cols,
                                    int G, int64_t src_stride, int64_t dst_stride,
                                    uint32_t* __restrict__ dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= dst_stride) return;
  const int W = G / 32;
  const int64_t groups = cols / G;
  const int in_lane = static_cast<int>(i % (2 * W));
  const int lane = static_cast<int>((i / (2 * W)) % 32);
  const int64_t block = i / (64 * W), tile = block / groups, grp = block % groups;
  const int64_t r = tile * 16 + (lane >> 2) + 8 * (in_lane / W);
  const int64_t word = grp * (G / 8) + (lane & 3) * W + in_lane % W;
  const int64_t e = blockIdx.y;
  dst[e * dst_stride + i] = r < rows ? src[e * src_stride + r * (cols / 8) + word] : 0u;
}

// One thread per destination scale or bias value (T: its 2- or 4-byte storage).
template <typename T>
__global__ void q4_pack_scales_kernel(const T* __restrict__ scales, const T* __restrict__ biases,
                                      int64_t rows, int64_t groups, int64_t src_stride,
                                      int64_t dst_stride, T* __restrict__ dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= dst_stride) return;
  const int v = static_cast<int>(i & 3), g = static_cast<int>((i >> 2) & 7);
  const int64_t block = i >> 5, tile = block / groups, grp = block % groups;
  const int64_t r = tile * 16 + g + 8 * (v >> 1);
  const int64_t e = blockIdx.y;
  const T* from = (v & 1) ? biases : scales;
  dst[e * dst_stride + i] = r < rows ? from[e * src_stride + r * groups + grp] : T(0);
}

}  // namespace

size_t q4_tile_data_bytes(const Weight& w) {
  const int64_t mats = w.experts > 0 ? w.experts : 1;
  return static_cast<size_t>(mats * (w.rows + 15) / 16 * 16 * (w.cols / 2));
}

size_t q4_tile_scale_bytes(const Weight& w) {
  const int64_t mats = w.experts > 0 ? w.experts : 1;
  return static_cast<size_t>(mats * (w.rows + 15) / 16 * 16 * (w.cols / w.group) * 2) *
         dtype_size(w.scale_dtype);
}

bool q4_tile_packable(const Weight& w) {
  return w.bits == 4 && w.packing == 0 && (w.group == 32 || w.group == 64 || w.group == 128) &&
         w.cols % w.group == 0 && w.data != nullptr && w.scales != nullptr && w.biases != nullptr;
}

void launch_q4_pack(cudaStream_t st, const Weight& w, void* data, void* scales) {
  TM_CUDA_REQUIRE(q4_tile_packable(w), "q4 pack: not a 4-bit affine weight in the MLX layout");
  const int64_t mats = w.experts > 0 ? w.experts : 1;
  const int64_t padded = (w.rows + 15) / 16 * 16, groups = w.cols / w.group;
  TM_CUDA_REQUIRE(mats <= 65535, "q4 pack: too many experts");
  const int64_t words = padded * (w.cols / 8);
  q4_pack_data_kernel<<<dim3(blocks_for(words, 256), static_cast<unsigned>(mats)), 256, 0, st>>>(
      static_cast<const uint32_t*>(w.data), w.rows, w.cols, w.group, w.rows * (w.cols / 8), words,
      static_cast<uint32_t*>(data));
  TM_CUDA_LAUNCHED();
  const int64_t vals = padded * groups * 2;
  const dim3 grid(blocks_for(vals, 256), static_cast<unsigned>(mats));
  if (dtype_size(w.scale_dtype) == 4) {
    q4_pack_scales_kernel<<<grid, 256, 0, st>>>(
        static_cast<const uint32_t*>(w.scales), static_cast<const uint32_t*>(w.biases), w.rows,
        groups, w.rows * groups, vals, static_cast<uint32_t*>(scales));
  } else {
    q4_pack_scales_kernel<<<grid, 256, 0, st>>>(
        static_cast<const uint16_t*>(w.scales), static_cast<const uint16_t*>(w.biases), w.rows,
        groups, w.rows * groups, vals, static_cast<uint16_t*>(scales));
  }
  TM_CUDA_LAUNCHED();
}

}  // namespace tokenmill::cuda
