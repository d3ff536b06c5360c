// MLX affine quantization: bit layout, quantizer (bit for bit against an independent numpy
// implementation, tools/check_affine_numpy.py) and dequantization with negative scales.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/affine.h"
#include "util/error.h"

namespace tokenmill {
namespace {

constexpr int kBits[] = {2, 3, 4, 5, 6, 8};
constexpr int kGroups[] = {32, 64, 128};

std::vector<uint32_t> read_hex(std::istringstream& in) {
  std::vector<uint32_t> out;
  std::string tok;
  while (in >> tok) out.push_back(static_cast<uint32_t>(std::stoul(tok, nullptr, 16)));
  return out;
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

TEST(Affine, QuantizeMatchesNumpyReferenceBitForBit) {
  std::ifstream f(std::string(TM_SOURCE_DIR) + "/tests/unit/tensor/affine_numpy_fixture.txt");
  ASSERT_TRUE(f) << "fixture missing: run /usr/bin/python3 tools/check_affine_numpy.py --write";
  std::string line;
  std::vector<float> w;
  int64_t rows = 0, cols = 0;
  int cases = 0;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "input") {
      in >> rows >> cols;
      auto words = read_hex(in);
      ASSERT_EQ(static_cast<int64_t>(words.size()), rows * cols);
      w.resize(words.size());
      std::memcpy(w.data(), words.data(), words.size() * 4);
      continue;
    }
    ASSERT_EQ(kind, "case");
    int bits = 0, group = 0;
    in >> bits >> group;
    std::vector<uint32_t> expect[3];
    for (auto& e : expect) {
      ASSERT_TRUE(std::getline(f, line));
      std::istringstream rec(line);
      rec >> kind;
      e = read_hex(rec);
    }
    std::vector<uint32_t> packed(static_cast<size_t>(rows * affine::words_per_row(cols, bits)));
    std::vector<float> s(static_cast<size_t>(rows * cols / group)), b(s.size());
    affine::quantize(w.data(), rows, cols, bits, group, packed.data(), s.data(), b.data());
    EXPECT_EQ(packed, expect[0]) << "bits=" << bits << " group=" << group;
    EXPECT_EQ(bits_of(s), expect[1]) << "scales, bits=" << bits << " group=" << group;
    EXPECT_EQ(bits_of(b), expect[2]) << "biases, bits=" << bits << " group=" << group;
    ++cases;
  }
  EXPECT_EQ(cases, 18);
}

TEST(Affine, PackUnpackRoundTripAndElementAccess) {
  std::mt19937 rng(7);
  for (int bits : kBits) {
    for (int64_t cols : {32, 96, 256}) {
      std::vector<uint8_t> q(static_cast<size_t>(cols)), back(q.size());
      for (auto& v : q) v = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
      // Guard word after the row: get() must never read it.
      std::vector<uint32_t> words(static_cast<size_t>(affine::words_per_row(cols, bits)) + 1,
                                  0xdeadbeefu);
      affine::pack_row(q.data(), cols, bits, words.data());
      EXPECT_EQ(words.back(), 0xdeadbeefu);
      affine::unpack_row(words.data(), cols, bits, back.data());
      EXPECT_EQ(q, back) << "bits=" << bits;
      // The spec's decode formula, written independently: a 64-bit window over two words.
      for (int64_t j = 0; j < cols; ++j) {
        int64_t off = j * bits;
        uint64_t lo = words[static_cast<size_t>(off >> 5)];
        uint64_t hi = words[static_cast<size_t>((off >> 5) + 1)];
        uint32_t ref = static_cast<uint32_t>(((hi << 32) | lo) >> (off & 31)) & ((1u << bits) - 1);
        ASSERT_EQ(ref, affine::get(words.data(), j, bits)) << "bits=" << bits << " j=" << j;
      }
    }
  }
}

TEST(Affine, ThreeBitValuesStraddleWords) {
  // 3-bit element 10 occupies bits 30-31 of word 0 and bit 0 of word 1 (MODEL-SPEC A).
  std::vector<uint8_t> q(32, 0);
  q[10] = 5;  // 0b101: bits 30 and 32 set
  uint32_t words[3];
  affine::pack_row(q.data(), 32, 3, words);
  EXPECT_EQ(words[0], 1u << 30);
  EXPECT_EQ(words[1], 1u);
  EXPECT_EQ(words[2], 0u);
  EXPECT_EQ(affine::get(words, 10, 3), 5u);
  // 4-bit: element k of a word at bits 4k; 8-bit: byte k.
  std::vector<uint8_t> q4(32);
  for (int i = 0; i < 32; ++i) q4[static_cast<size_t>(i)] = static_cast<uint8_t>(i & 15);
  uint32_t w4[4];
  affine::pack_row(q4.data(), 32, 4, w4);
  EXPECT_EQ(w4[0], 0x76543210u);
  EXPECT_EQ(w4[1], 0xfedcba98u);
}

TEST(Affine, DequantizeWithNegativeScalesAllScaleTypes) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int bits : kBits) {
    for (int group : kGroups) {
      const int64_t cols = group * 3;
      std::vector<uint8_t> q(static_cast<size_t>(cols));
      for (auto& v : q) v = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
      std::vector<uint32_t> words(static_cast<size_t>(affine::words_per_row(cols, bits)));
      affine::pack_row(q.data(), cols, bits, words.data());
      // Scales exactly representable in bf16 and f16, one of them negative.
      float s[3] = {-0.125f, 0.0625f, -1.5f}, b[3] = {0.75f, -0.5f, 2.0f};
      uint16_t sb[3], bb[3], sh[3], bh[3];
      for (int g = 0; g < 3; ++g) {
        sb[g] = f32_to_bf16(s[g]);
        bb[g] = f32_to_bf16(b[g]);
        sh[g] = f32_to_f16(s[g]);
        bh[g] = f32_to_f16(b[g]);
      }
      std::vector<float> out(static_cast<size_t>(cols));
      const void* sp[3] = {s, sb, sh};
      const void* bp[3] = {b, bb, bh};
      DType types[3] = {DType::F32, DType::BF16, DType::F16};
      for (int t = 0; t < 3; ++t) {
        affine::dequantize_row(words.data(), sp[t], bp[t], types[t], cols, bits, group, out.data());
        for (int64_t j = 0; j < cols; ++j) {
          double ref = static_cast<double>(s[j / group]) * q[static_cast<size_t>(j)] + b[j / group];
          // Products of small integers with powers-of-two scales are exact in F32.
          ASSERT_EQ(out[static_cast<size_t>(j)], static_cast<float>(ref)) << "bits=" << bits;
          ASSERT_EQ(
              affine::dequantize_element(words.data(), sp[t], bp[t], types[t], j, bits, group),
              out[static_cast<size_t>(j)]);
        }
      }
    }
  }
}

TEST(Affine, QuantizeReconstructsWithinHalfAStep) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int bits : kBits) {
    for (int group : kGroups) {
      const int64_t rows = 8, cols = 2 * group;
      std::vector<float> w(static_cast<size_t>(rows * cols)), deq(static_cast<size_t>(cols));
      for (auto& v : w) v = nd(rng);
      std::vector<uint32_t> packed(static_cast<size_t>(rows * affine::words_per_row(cols, bits)));
      std::vector<float> s(static_cast<size_t>(rows * cols / group)), b(s.size());
      affine::quantize(w.data(), rows, cols, bits, group, packed.data(), s.data(), b.data());
      bool saw_negative = false;
      for (int64_t r = 0; r < rows; ++r) {
        affine::dequantize_row(packed.data() + r * affine::words_per_row(cols, bits),
                               s.data() + r * (cols / group), b.data() + r * (cols / group),
                               DType::F32, cols, bits, group, deq.data());
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t gi = r * (cols / group) + j / group;
          const float step = std::fabs(s[static_cast<size_t>(gi)]);
          saw_negative |= s[static_cast<size_t>(gi)] < 0;
          const float* gw = w.data() + r * cols + (j / group) * group;
          float hi = gw[0], lo = gw[0];
          for (int i = 1; i < group; ++i) hi = std::max(hi, gw[i]), lo = std::min(lo, gw[i]);
          // The grid is anchored at the edge with q0 rounded, so it spans n*|s|, which may fall
          // short of the range by the rounding of q0: values beyond it clip to the far level.
          const float n = static_cast<float>((1 << bits) - 1);
          const float bound = 0.5f * step + std::max(0.0f, (hi - lo) - n * step);
          EXPECT_LE(std::fabs(deq[static_cast<size_t>(j)] - w[static_cast<size_t>(r * cols + j)]),
                    bound * 1.001f + 1e-6f);
        }
      }
      EXPECT_TRUE(saw_negative) << "a normal sample should produce some negative scales";
    }
  }
}

TEST(Affine, RejectsBadLayouts) {
  EXPECT_THROW(affine::check_layout(7, 64, 128, "w"), Error);
  EXPECT_THROW(affine::check_layout(4, 48, 96, "w"), Error);
  EXPECT_THROW(affine::check_layout(4, 64, 96, "w"), Error);
  EXPECT_NO_THROW(affine::check_layout(3, 32, 96, "w"));
  try {
    affine::check_layout(4, 64, 100, "layers.0.mlp.up_proj");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.mlp.up_proj"), std::string::npos);
  }
}

}  // namespace
}  // namespace tokenmill
