// rope, kv_append and paged causal GQA attention against double-precision references.
// Tolerance 1e-5 relative (plus 1e-6 absolute): F32 dot products of <= 40 terms and a softmax
// over <= 200 keys accumulate errors of a few F32 ulps (6e-8 each).
#include <algorithm>
#include <numeric>

#include "cpu_test_util.h"

namespace tokenmill {
namespace {

using test::Backends;
using test::Rng;

TEST(CpuRope, PartialNeoxMatchesReference) {
  Backends b;
  Rng rng(10);
  const int n = 5, heads = 3, D = 40, rd = 16;
  const int64_t stride = heads * D + 8;  // rows wider than the heads (e.g. a fused qkv row)
  const float theta = 10000.0f;
  const std::vector<int32_t> pos = {0, 1, 7, 63, 30};
  std::vector<float> x0 = rng.normals(static_cast<size_t>(n * stride));
  for (CpuBackend* be : b.all()) {
    std::vector<float> x = x0;
    be->rope(x.data(), pos.data(), n, heads, D, stride, rd, theta);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < heads; ++h) {
        const float* in = x0.data() + t * stride + h * D;
        const float* o = x.data() + t * stride + h * D;
        for (int i = 0; i < rd / 2; ++i) {
          // Small positions: the F32 angle the kernel uses equals the exact one to ~1e-7 rad.
          const double ang = pos[t] * std::pow(static_cast<double>(theta), -2.0 * i / rd);
          const double r0 = in[i] * std::cos(ang) - in[i + rd / 2] * std::sin(ang);
          const double r1 = in[i + rd / 2] * std::cos(ang) + in[i] * std::sin(ang);
          ASSERT_NEAR(o[i], r0, 1e-5 * (1 + std::fabs(r0))) << "t=" << t << " i=" << i;
          ASSERT_NEAR(o[i + rd / 2], r1, 1e-5 * (1 + std::fabs(r1)));
        }
        for (int i = rd; i < D; ++i) ASSERT_EQ(o[i], in[i]) << "dims past rot_dim unchanged";
      }
      for (int64_t c = heads * D; c < stride; ++c) ASSERT_EQ(x[t * stride + c], x0[t * stride + c]);
    }
  }
}

// A paged cache with scattered physical blocks, filled and queried over two forward calls.
struct PagedCase {
  int block_size = 16, kv_heads = 2, D = 20, heads = 6, max_blocks = 16;
  std::vector<int> prev, add;              // per sequence: tokens already cached, tokens this step
  std::vector<int32_t> tables;             // [n_seqs, max_blocks]
  std::vector<float> kc, vc;               // cache storage
  std::vector<std::vector<float>> ks, vs;  // per sequence: all k/v rows by position (reference)
};

void append(CpuBackend& be, PagedCase& pc, const std::vector<int>& lens,
            const std::vector<int>& starts, Rng& rng, KVLayerView& kv, KVPaging& pg,
            std::vector<int32_t>& cu, std::vector<int32_t>& positions, std::vector<int32_t>& ctx) {
  const int S = static_cast<int>(lens.size()), row = pc.kv_heads * pc.D;
  cu.assign(1, 0);
  positions.clear();
  ctx.clear();
  std::vector<float> k, v;
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < lens[s]; ++i) {
      positions.push_back(starts[s] + i);
      std::vector<float> kr = rng.normals(static_cast<size_t>(row)), vr = rng.normals(row);
      k.insert(k.end(), kr.begin(), kr.end());
      v.insert(v.end(), vr.begin(), vr.end());
      pc.ks[s].insert(pc.ks[s].end(), kr.begin(), kr.end());
      pc.vs[s].insert(pc.vs[s].end(), vr.begin(), vr.end());
    }
    cu.push_back(cu.back() + lens[s]);
    ctx.push_back(starts[s] + lens[s]);
  }
  kv = {pc.kc.data(), pc.vc.data(), pc.block_size, pc.kv_heads, pc.D};
  pg = {pc.tables.data(), pc.max_blocks, ctx.data(), *std::max_element(ctx.begin(), ctx.end())};
  SeqLayout sl{S, cu.back(), cu.data(), positions.data(),
               *std::max_element(lens.begin(), lens.end())};
  be.kv_append(kv, pg, sl, k.data(), v.data());
}

// Attention of the rows `add` appended after `prev` cached positions per sequence, against a
// double-precision softmax.
void check_paged_attention(const std::vector<int>& prev, const std::vector<int>& add) {
  Backends b;
  for (CpuBackend* be : b.all()) {
    Rng rng(11);
    PagedCase pc;
    pc.prev = prev;
    pc.add = add;
    const int S = 4, total_blocks = S * pc.max_blocks;
    pc.tables.resize(static_cast<size_t>(S * pc.max_blocks));
    std::iota(pc.tables.begin(), pc.tables.end(), 0);
    std::shuffle(pc.tables.begin(), pc.tables.end(), rng.gen);  // scattered blocks
    pc.kc.assign(static_cast<size_t>(total_blocks * pc.block_size * pc.kv_heads * pc.D), NAN);
    pc.vc = pc.kc;
    pc.ks.resize(S);
    pc.vs.resize(S);
    KVLayerView kv;
    KVPaging pg;
    std::vector<int32_t> cu, positions, ctx;
    append(*be, pc, pc.prev, {0, 0, 0, 0}, rng, kv, pg, cu, positions, ctx);
    append(*be, pc, pc.add, pc.prev, rng, kv, pg, cu, positions, ctx);
    SeqLayout sl{S, cu.back(), cu.data(), positions.data(), 30};
    const int H = pc.heads, D = pc.D, r = H / pc.kv_heads;
    std::vector<float> q = rng.normals(static_cast<size_t>(cu.back() * H * D));
    std::vector<float> out(q.size(), NAN);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    be->attention(kv, pg, sl, q.data(), H, scale, out.data());
    for (int s = 0; s < S; ++s) {
      for (int t = cu[s]; t < cu[s + 1]; ++t) {
        const int pos = positions[t];
        for (int h = 0; h < H; ++h) {
          const int kvh = h / r;
          std::vector<double> sc(static_cast<size_t>(pos + 1));
          double mx = -1e300;
          for (int p = 0; p <= pos; ++p) {
            double d = 0;
            for (int i = 0; i < D; ++i) {
              d += static_cast<double>(q[(t * H + h) * D + i]) *
                   pc.ks[s][(p * pc.kv_heads + kvh) * D + i];
            }
            sc[p] = d * scale;
            mx = std::max(mx, sc[p]);
          }
          double sum = 0;
          for (auto& v : sc) sum += (v = std::exp(v - mx));
          for (int i = 0; i < D; ++i) {
            double ref = 0;
            for (int p = 0; p <= pos; ++p)
              ref += sc[p] / sum * pc.vs[s][(p * pc.kv_heads + kvh) * D + i];
            ASSERT_NEAR(out[(t * H + h) * D + i], ref, 1e-5 * std::fabs(ref) + 1e-6)
                << be->isa() << " seq " << s << " pos " << pos << " head " << h;
          }
        }
      }
    }
  }
}

TEST(CpuAttention, PagedCausalGqaAcrossBlocks) {
  // seq 0: fresh prefill of 5; seq 1: decode after 37 cached; seq 2: 30 new after 20 cached
  // (crossing blocks); seq 3: decode at position 150 (several softmax tiles).
  check_paged_attention({0, 37, 20, 150}, {5, 1, 30, 1});
}

TEST(CpuAttention, DecodeSplitsLongContextsIntoMergedChunks) {
  // Two decode rows (few tokens: the context is split into chunks whose partial softmaxes are
  // merged): position 37 (one chunk) and position 240 (four chunks, the last one short).
  check_paged_attention({0, 37, 0, 240}, {0, 1, 0, 1});
}

// A BF16 cache holds each appended value rounded to nearest-even BF16, and attention over it
// equals attention over an F32 cache holding those rounded values (the loops are the same with a
// widening load; 1e-6 relative leaves room for the compiler fusing a multiply-add in one copy
// and not the other). Prefill rows (one pass) and decode rows (merged chunks).
TEST(CpuAttention, Bf16CacheEqualsF32CacheOfRoundedValues) {
  Backends b;
  for (CpuBackend* be : b.all()) {
    ASSERT_TRUE(be->supports_kv_dtype(DType::BF16));
    ASSERT_FALSE(be->supports_kv_dtype(DType::F16));
    Rng rng(12);
    const int block_size = 16, kv_heads = 2, D = 40, H = 6, max_blocks = 16, S = 2;
    const int row = kv_heads * D;
    std::vector<int32_t> tables(S * max_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng.gen);
    const size_t cache_n = static_cast<size_t>(S * max_blocks * block_size * row);
    std::vector<float> kf(cache_n, 0.0f), vf = kf;
    std::vector<uint16_t> kb(cache_n, 0), vb = kb;
    KVLayerView f32{kf.data(), vf.data(), block_size, kv_heads, D, DType::F32};
    KVLayerView b16{kb.data(), vb.data(), block_size, kv_heads, D, DType::BF16};
    // Step 1 fills positions 0..19 of seq 0 and 0..239 of seq 1; step 2 adds 30 rows to seq 0
    // (prefill) and one to seq 1 (a decode at position 240: several merged chunks).
    const std::vector<std::pair<std::vector<int>, std::vector<int>>> steps = {{{0, 0}, {20, 240}},
                                                                              {{20, 240}, {30, 1}}};
    for (const auto& [starts, lens] : steps) {
      std::vector<int32_t> cu = {0}, positions, ctx;
      for (int s = 0; s < S; ++s) {
        for (int i = 0; i < lens[s]; ++i) positions.push_back(starts[s] + i);
        cu.push_back(cu.back() + lens[s]);
        ctx.push_back(starts[s] + lens[s]);
      }
      const int T = cu.back();
      std::vector<float> k = rng.normals(static_cast<size_t>(T * row)), v = rng.normals(k.size());
      std::vector<float> kr = k, vr = v;  // rounded to BF16 and back
      for (float& x : kr) x = bf16_to_f32(f32_to_bf16(x));
      for (float& x : vr) x = bf16_to_f32(f32_to_bf16(x));
      KVPaging pg{tables.data(), max_blocks, ctx.data(), *std::max_element(ctx.begin(), ctx.end())};
      SeqLayout sl{S, T, cu.data(), positions.data(), *std::max_element(lens.begin(), lens.end())};
      be->kv_append(f32, pg, sl, kr.data(), vr.data());
      be->kv_append(b16, pg, sl, k.data(), v.data());
      for (size_t i = 0; i < cache_n; ++i) {
        ASSERT_EQ(bf16_to_f32(kb[i]), kf[i]) << "k element " << i;
        ASSERT_EQ(bf16_to_f32(vb[i]), vf[i]) << "v element " << i;
      }
      std::vector<float> q = rng.normals(static_cast<size_t>(T * H * D));
      std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      be->attention(f32, pg, sl, q.data(), H, scale, want.data());
      be->attention(b16, pg, sl, q.data(), H, scale, got.data());
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i]))) << be->isa() << " " << i;
      }
    }
  }
}

TEST(CpuAttention, RejectsQueriesBeyondTheCache) {
  Backends b;
  std::vector<float> kc(16 * 4, 0.0f), vc = kc, q(4), out(4);
  std::vector<int32_t> table = {0}, ctx = {2}, cu = {0, 1}, pos = {5};
  KVLayerView kv{kc.data(), vc.data(), 16, 1, 4};
  KVPaging pg{table.data(), 1, ctx.data(), 2};
  SeqLayout sl{1, 1, cu.data(), pos.data(), 1};
  EXPECT_THROW(b.simd->attention(kv, pg, sl, q.data(), 1, 1.0f, out.data()), Error);
  pos[0] = 16;  // needs a second block that the table does not have
  EXPECT_THROW(b.simd->kv_append(kv, pg, sl, q.data(), q.data()), Error);
}

}  // namespace
}  // namespace tokenmill
