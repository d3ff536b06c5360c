// Paged KV append + causal GQA attention (several sequences, scattered blocks, two steps), and
// the Gated DeltaNet ops (conv1d_silu, gated_delta_rule with step states) continuing their
// state across calls: CUDA against the CPU backend.
// Tolerances: KV appends are copies (exact); attention 1e-5 relative (F32 dots and a softmax
// over <= 130 keys); the delta rule 1e-4 relative (F32 recurrences over 70 tokens in the same
// per-column order, fused multiply-adds on the device).
#include <algorithm>
#include <numeric>

#include "cuda_test_util.h"

namespace tokenmill::cudatest {
namespace {

class CudaAttention : public CudaVsCpu {
 protected:
  // One step of S sequences, sequence s adding add[s] tokens after its prev[s] cached ones: the
  // varlen layout and the paging over `tables` on the host, and their device copies (dseqs,
  // dpg, with the device's copy of the tables).
  struct Step {
    std::vector<int32_t> cu = {0}, positions, ctx;
    SeqLayout seqs, dseqs;
    KVPaging pg, dpg;
    int tokens = 0;
  };
  Step make_step(const std::vector<int>& prev, const std::vector<int>& add,
                 const std::vector<int32_t>& tables, int32_t* dtables, int max_blocks) {
    Step st;
    const int S = static_cast<int>(prev.size());
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < add[s]; ++i) st.positions.push_back(prev[s] + i);
      st.cu.push_back(st.cu.back() + add[s]);
      st.ctx.push_back(prev[s] + add[s]);
    }
    st.tokens = st.cu.back();
    st.seqs = SeqLayout{S, st.tokens, st.cu.data(), st.positions.data(),
                        *std::max_element(add.begin(), add.end())};
    st.pg = KVPaging{tables.data(), max_blocks, st.ctx.data(),
                     *std::max_element(st.ctx.begin(), st.ctx.end())};
    st.dseqs = st.seqs;
    st.dseqs.cu_seqlens = up(st.cu);
    st.dseqs.positions = up(st.positions);
    st.dpg = st.pg;
    st.dpg.block_tables = dtables;
    st.dpg.context_lens = up(st.ctx);
    return st;
  }
  // attention() with a split-context workspace of the size it asks for; empty when it asks for
  // none (the step's rows or head_dim do not take the split kernel).
  std::vector<float> split_attention(const KVLayerView& dkv, const Step& st, const float* dq,
                                     int heads, float scale, int capacity, size_t n) {
    const size_t ws = gpu->attention_workspace_floats(st.tokens, heads, dkv.head_dim, capacity);
    if (ws == 0) return {};
    gpu->set_attention_workspace(poisoned(ws), ws);
    float* out = poisoned(n);
    gpu->attention(dkv, st.dpg, st.dseqs, dq, heads, scale, out);
    gpu->set_attention_workspace(nullptr, 0);
    return down(out, n);
  }
};

TEST_F(CudaAttention, PagedCausalGqaTwoSteps) {
  Rng rng(21);
  // A wide block table (600 blocks of 16) makes the split kernel use longer splits, mostly past
  // the contexts. Blocks of 4 and 16 positions take the split kernel's one-read-per-step path,
  // blocks of 6 its per-position lookups.
  struct Case {
    int D, max_blocks, block_size;
  };
  for (const Case& c : {Case{20, 16, 16}, Case{128, 16, 16}, Case{256, 16, 16}, Case{128, 600, 16},
                        Case{128, 40, 6}, Case{256, 40, 4}}) {
    const int D = c.D, max_blocks = c.max_blocks, block_size = c.block_size;
    // Enough blocks per sequence for the 140 positions the steps reach, none shared.
    const int per_seq = (140 + block_size - 1) / block_size, kv_heads = 2, heads = 6;
    const int num_blocks = 4 * per_seq;
    const int64_t row = int64_t{kv_heads} * D;
    const size_t cache_n = static_cast<size_t>(num_blocks) * block_size * row;
    std::vector<float> kc = rng.normals(cache_n), vc = rng.normals(cache_n);
    std::vector<int32_t> phys(num_blocks);
    std::iota(phys.begin(), phys.end(), 0);
    std::shuffle(phys.begin(), phys.end(), rng.gen);
    const std::vector<int> prev0 = {0, 17, 100, 3};
    const int S = static_cast<int>(prev0.size());
    std::vector<int32_t> tables(static_cast<size_t>(S) * max_blocks, -1);
    size_t next_block = 0;
    for (int s = 0; s < S; ++s) {
      for (int b = 0; b < per_seq; ++b)
        tables[static_cast<size_t>(s) * max_blocks + b] = phys[next_block++ % phys.size()];
    }
    float* dk = up(kc);
    float* dv = up(vc);
    int32_t* dtables = up(tables);
    std::vector<int> prev = prev0;
    for (const std::vector<int>& add :
         {std::vector<int>{5, 1, 30, 1}, std::vector<int>{1, 12, 1, 2}}) {
      const Step st = make_step(prev, add, tables, dtables, max_blocks);
      const SeqLayout &seqs = st.seqs, &dseqs = st.dseqs;
      const KVPaging &pg = st.pg, &dpg = st.dpg;
      const int T = st.tokens;
      std::vector<float> k = rng.normals(static_cast<size_t>(T) * row);
      std::vector<float> v = rng.normals(k.size());
      std::vector<float> q = rng.normals(static_cast<size_t>(T) * heads * D);
      KVLayerView kv{kc.data(), vc.data(), block_size, kv_heads, D};
      cpu->kv_append(kv, pg, seqs, k.data(), v.data());
      std::vector<float> want(q.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      cpu->attention(kv, pg, seqs, q.data(), heads, scale, want.data());

      KVLayerView dkv{dk, dv, block_size, kv_heads, D};
      gpu->kv_append(dkv, dpg, dseqs, up(k), up(v));
      float* dq = up(q);
      float* dout = poisoned(want.size());
      gpu->set_attention_workspace(nullptr, 0);  // the one-pass kernel
      gpu->attention(dkv, dpg, dseqs, dq, heads, scale, dout);
      EXPECT_EQ(down(dk, cache_n), kc) << "k cache after append, D=" << D;
      EXPECT_EQ(down(dv, cache_n), vc) << "v cache after append, D=" << D;
      expect_close(down(dout, want.size()), want, 1e-5,
                   "attention D=" + std::to_string(D) + " block " + std::to_string(block_size));
      // With a workspace, few query rows and head_dim a multiple of 128: split-context decoding.
      const std::vector<float> split =
          split_attention(dkv, st, dq, heads, scale, max_blocks * block_size, want.size());
      EXPECT_EQ(!split.empty(), D % 128 == 0) << "D=" << D;
      if (!split.empty())
        expect_close(
            split, want, 1e-5,
            "split attention D=" + std::to_string(D) + " block " + std::to_string(block_size));
      for (int s = 0; s < S; ++s) prev[s] += add[s];
    }
  }
}

std::vector<float> widen_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_f32(v[i]);
  return f;
}

// BF16 caches: kv_append rounds as the CPU does (the caches are equal bit for bit), attention
// (one pass and split) matches the CPU's over the same BF16 cache, and the fused front writes
// the rounded k and v (k within one BF16 step: the CPU's and the GPU's F32 k differ in the last
// bits and may round apart).
TEST_F(CudaAttention, Bf16CacheMatchesCpu) {
  Rng rng(26);
  for (int D : {128, 256}) {
    const int block_size = 16, kv_heads = 2, heads = 6, max_blocks = 16, num_blocks = 40, S = 4;
    const int64_t row = int64_t{kv_heads} * D;
    const size_t cache_n = static_cast<size_t>(num_blocks) * block_size * row;
    std::vector<uint16_t> kc(cache_n, 0), vc(cache_n, 0);
    uint16_t* dk = up(kc);
    uint16_t* dv = up(vc);
    std::vector<int32_t> phys(num_blocks);
    std::iota(phys.begin(), phys.end(), 0);
    std::shuffle(phys.begin(), phys.end(), rng.gen);
    std::vector<int32_t> tables(static_cast<size_t>(S) * max_blocks, -1);
    for (int s = 0; s < S; ++s) {
      for (int b = 0; b < 9; ++b) tables[static_cast<size_t>(s) * max_blocks + b] = phys[s * 9 + b];
    }
    int32_t* dtables = up(tables);
    std::vector<int> prev = {0, 17, 100, 3};
    for (const std::vector<int>& add :
         {std::vector<int>{5, 1, 30, 1}, std::vector<int>{1, 12, 1, 2}}) {
      const Step st = make_step(prev, add, tables, dtables, max_blocks);
      const SeqLayout &seqs = st.seqs, &dseqs = st.dseqs;
      const KVPaging &pg = st.pg, &dpg = st.dpg;
      const int T = st.tokens;
      std::vector<float> k = rng.normals(static_cast<size_t>(T) * row), v = rng.normals(k.size());
      std::vector<float> q = rng.normals(static_cast<size_t>(T) * heads * D);
      KVLayerView kv{kc.data(), vc.data(), block_size, kv_heads, D, DType::BF16};
      cpu->kv_append(kv, pg, seqs, k.data(), v.data());
      std::vector<float> want(q.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      cpu->attention(kv, pg, seqs, q.data(), heads, scale, want.data());
      KVLayerView dkv{dk, dv, block_size, kv_heads, D, DType::BF16};
      gpu->kv_append(dkv, dpg, dseqs, up(k), up(v));
      EXPECT_EQ(down(dk, cache_n), kc) << "bf16 k cache, D=" << D;
      EXPECT_EQ(down(dv, cache_n), vc) << "bf16 v cache, D=" << D;
      float* dq = up(q);
      float* dout = poisoned(want.size());
      gpu->set_attention_workspace(nullptr, 0);
      gpu->attention(dkv, dpg, dseqs, dq, heads, scale, dout);
      expect_close(down(dout, want.size()), want, 1e-5, "bf16 attention D=" + std::to_string(D));
      const std::vector<float> split =
          split_attention(dkv, st, dq, heads, scale, max_blocks * block_size, want.size());
      ASSERT_FALSE(split.empty());
      // 1e-4: on sm_90 the tensor-core pass (queries and probabilities in 16 significant bits;
      // test_cuda_attention_split.cpp).
      expect_close(split, want, 1e-4, "bf16 split attention D=" + std::to_string(D));
      for (int s = 0; s < S; ++s) prev[s] += add[s];
    }
    // The fused front appends the next token of each sequence.
    const Step st = make_step(prev, std::vector<int>(S, 1), tables, dtables, max_blocks);
    const SeqLayout &seqs = st.seqs, &dseqs = st.dseqs;
    const KVPaging &pg = st.pg, &dpg = st.dpg;
    const int T = S;
    std::vector<float> qp = rng.normals(static_cast<size_t>(T) * heads * D * 2, 3.0f);
    std::vector<float> k = rng.normals(static_cast<size_t>(T) * row, 3.0f);
    std::vector<float> v = rng.normals(k.size());
    std::vector<float> qn = rng.normals(static_cast<size_t>(D), 0.5f);
    std::vector<float> kn = rng.normals(static_cast<size_t>(D), 0.5f);
    KVLayerView kv{kc.data(), vc.data(), block_size, kv_heads, D, DType::BF16};
    const size_t nq = static_cast<size_t>(T) * heads * D;
    std::vector<float> q(nq), gate(nq), kw = k;
    cpu->attention_front(kv, pg, seqs, qp.data(), true, qn.data(), kn.data(), 1e-6f, heads, 64,
                         1e6f, q.data(), gate.data(), kw.data(), v.data());
    KVLayerView dkv{dk, dv, block_size, kv_heads, D, DType::BF16};
    gpu->attention_front(dkv, dpg, dseqs, up(qp), true, up(qn), up(kn), 1e-6f, heads, 64, 1e6f,
                         poisoned(nq), poisoned(nq), up(k), up(v));
    expect_close(widen_bf16(down(dk, cache_n)), widen_bf16(kc), 8e-3,
                 "bf16 front k cache D=" + std::to_string(D));
    EXPECT_EQ(down(dv, cache_n), vc) << "bf16 front v cache D=" << D;
  }
}

// Prefill rows (the tensor-core kernel): three sequences, one starting fresh with 200 tokens,
// one adding 77 after 45 cached, one adding a single token after 130; GQA groups of 1, 2, 6
// and 8, head_dim 32 to 256 (128 and 256 split over warp pairs up to groups of 6), F32 and
// BF16 caches; against the CPU over the same cache. The same with PrefillPrecision::kFast,
// within F16's error.
TEST_F(CudaAttention, PrefillMatchesCpu) {
  Rng rng(27);
  std::unique_ptr<Backend> fast = make_cuda_backend(0, PrefillPrecision::kFast);
  struct Geo {
    int D, heads, kv_heads;
    DType dtype;
  };
  for (Geo geo :
       {Geo{256, 12, 2, DType::F32}, Geo{128, 16, 2, DType::F32}, Geo{64, 2, 2, DType::BF16},
        Geo{32, 4, 2, DType::F32}, Geo{256, 4, 2, DType::BF16}, Geo{256, 12, 2, DType::BF16},
        Geo{128, 8, 2, DType::BF16}}) {
    const int D = geo.D, heads = geo.heads, block_size = 16, max_blocks = 20, S = 3;
    const int64_t row = int64_t{geo.kv_heads} * D;
    const size_t cache_n = static_cast<size_t>(S) * max_blocks * block_size * row;
    const bool bf16 = geo.dtype == DType::BF16;
    const size_t esize = bf16 ? 2 : 4;
    std::vector<unsigned char> kc(cache_n * esize, 0), vc(cache_n * esize, 0);
    unsigned char* dk = up(kc);
    unsigned char* dv = up(vc);
    std::vector<int32_t> tables(static_cast<size_t>(S) * max_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng.gen);
    int32_t* dtables = up(tables);
    KVLayerView kv{kc.data(), vc.data(), block_size, geo.kv_heads, D, geo.dtype};
    KVLayerView dkv{dk, dv, block_size, geo.kv_heads, D, geo.dtype};
    const std::vector<int> prefix = {0, 45, 130}, add = {200, 77, 1};
    std::vector<float> want, got;
    for (int step = 0; step < 2; ++step) {
      const Step st = step == 0 ? make_step({0, 0, 0}, prefix, tables, dtables, max_blocks)
                                : make_step(prefix, add, tables, dtables, max_blocks);
      const int T = st.tokens;
      std::vector<float> k = rng.normals(static_cast<size_t>(T) * row, 2.0f);
      std::vector<float> v = rng.normals(k.size(), 3.0f);
      cpu->kv_append(kv, st.pg, st.seqs, k.data(), v.data());
      gpu->kv_append(dkv, st.dpg, st.dseqs, up(k), up(v));
      if (step == 0) continue;
      std::vector<float> q = rng.normals(static_cast<size_t>(T) * heads * D, 2.0f);
      want.assign(q.size(), 0.0f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      cpu->attention(kv, st.pg, st.seqs, q.data(), heads, scale, want.data());
      gpu->set_attention_workspace(nullptr, 0);
      float* dout = poisoned(want.size());
      float* dq = up(q);
      gpu->attention(dkv, st.dpg, st.dseqs, dq, heads, scale, dout);
      got = down(dout, want.size());
      // PrefillPrecision::kFast on the same cache: one F16 pass per product, so F16's error
      // (about 1e-3 of the output's scale) where the exact kernel has F32's (1e-6).
      float* fout = poisoned(want.size());
      gpu->synchronize();  // the cache, q and fout are written on gpu's stream
      fast->attention(dkv, st.dpg, st.dseqs, dq, heads, scale, fout);
      fast->synchronize();
      const std::vector<float> fgot = down(fout, want.size());
      const std::string what = "prefill attention D=" + std::to_string(D) +
                               " heads=" + std::to_string(heads) + (bf16 ? " bf16" : " f32");
      expect_close(fgot, want, 2e-2, "fast " + what);
      double ss = 0, worst = 0;
      for (float w : want) ss += double{w} * w;
      const double rms = std::sqrt(ss / static_cast<double>(want.size()));
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(double{fgot[i]} - want[i]) / rms);
      }
      EXPECT_GT(worst, 1e-5) << "fast " << what << ": F32-accurate, so the exact kernel ran";
    }
    expect_close(got, want, 1e-5,
                 "prefill attention D=" + std::to_string(D) + " heads=" + std::to_string(heads) +
                     (bf16 ? " bf16" : " f32"));
  }
}

// attention_front, fused on CUDA: gated and plain q_proj rows, partial and full rotation,
// tokens of two sequences at scattered positions (one token, then 20); q, gate, k and both
// caches against the CPU's op-by-op form (the v cache exactly: copies).
TEST_F(CudaAttention, FrontMatchesCpu) {
  Rng rng(25);
  struct Geo {
    int D, rot;
    bool gated;
  };
  for (Geo geo : {Geo{256, 64, true}, Geo{128, 128, false}, Geo{40, 20, true}}) {
    const int D = geo.D, block_size = 16, kv_heads = 2, heads = 6, max_blocks = 8, blocks = 20;
    const int64_t row = int64_t{kv_heads} * D;
    const size_t cache_n = static_cast<size_t>(blocks) * block_size * row;
    std::vector<float> kc = rng.normals(cache_n), vc = rng.normals(cache_n);
    float* dkc = up(kc);  // the device caches start as the CPU's
    float* dvc = up(vc);
    std::vector<int32_t> tables(static_cast<size_t>(2) * max_blocks, -1);
    for (int b = 0; b < max_blocks; ++b) {
      tables[static_cast<size_t>(b)] = 2 * b + 1;
      tables[static_cast<size_t>(max_blocks + b)] = 2 * b;
    }
    // 21 tokens: three blocks of the warp-per-row form (8 tokens a block), the last partial.
    const std::vector<int32_t> cu = {0, 1, 21}, ctx = {38, 101};
    std::vector<int32_t> positions = {37};
    for (int i = 0; i < 19; ++i) positions.push_back(5 + 3 * i);
    positions.push_back(100);
    const int T = 21;
    const int64_t qp_cols = int64_t{heads} * D * (geo.gated ? 2 : 1);
    const size_t nq = static_cast<size_t>(T) * heads * D;
    std::vector<float> qp = rng.normals(static_cast<size_t>(T * qp_cols), 3.0f);
    std::vector<float> k = rng.normals(static_cast<size_t>(T * row), 3.0f);
    std::vector<float> v = rng.normals(k.size());
    std::vector<float> qn = rng.normals(static_cast<size_t>(D), 0.5f);
    std::vector<float> kn = rng.normals(static_cast<size_t>(D), 0.5f);
    SeqLayout seqs{2, T, cu.data(), positions.data(), 20};
    KVPaging pg{tables.data(), max_blocks, ctx.data(), 101};
    KVLayerView kv{kc.data(), vc.data(), block_size, kv_heads, D};
    // Plain rows are normalised in place (qp is q); gated rows are split into q and gate.
    std::vector<float> qw = qp, q(geo.gated ? nq : 0), gate(q.size()), kw = k;
    float* q_cpu = geo.gated ? q.data() : qw.data();
    cpu->attention_front(kv, pg, seqs, qw.data(), geo.gated, qn.data(), kn.data(), 1e-6f, heads,
                         geo.rot, 1e6f, q_cpu, geo.gated ? gate.data() : nullptr, kw.data(),
                         v.data());
    SeqLayout dseqs = seqs;
    dseqs.cu_seqlens = up(cu);
    dseqs.positions = up(positions);
    KVPaging dpg = pg;
    dpg.block_tables = up(tables);
    dpg.context_lens = up(ctx);
    KVLayerView dkv{dkc, dvc, block_size, kv_heads, D};
    float* dqp = up(qp);
    float* dq = geo.gated ? poisoned(nq) : dqp;
    float* dgate = geo.gated ? poisoned(nq) : nullptr;
    float* dk = up(k);
    gpu->attention_front(dkv, dpg, dseqs, dqp, geo.gated, up(qn), up(kn), 1e-6f, heads, geo.rot,
                         1e6f, dq, dgate, dk, up(v));
    const std::string d = " D=" + std::to_string(D) + (geo.gated ? " gated" : "");
    expect_close(down(dq, nq), std::vector<float>(q_cpu, q_cpu + nq), 1e-5, "front q" + d);
    if (geo.gated) expect_close(down(dgate, nq), gate, 0.0, "front gate" + d);
    expect_close(down(dk, kw.size()), kw, 1e-5, "front k" + d);
    expect_close(down(dkc, cache_n), kc, 1e-5, "front k cache" + d);
    EXPECT_EQ(down(dvc, cache_n), vc) << "front v cache" << d;
  }
}

class CudaGdn : public CudaVsCpu {};

TEST_F(CudaGdn, ConvContinuesState) {
  Rng rng(22);
  for (int K : {2, 4}) {
    const int C = 70, slots_n = 3;
    GDNStateView st{};
    st.channels = C;
    st.kernel = K;
    std::vector<float> conv = rng.normals(static_cast<size_t>(slots_n) * C * (K - 1));
    std::vector<float> w = rng.normals(static_cast<size_t>(C) * K);
    const std::vector<int32_t> slots = {2, 0, 1};
    float* dconv = up(conv);
    // Short sequences (one thread walks each); sequences longer than a 32-row tile (rows in
    // parallel): sequences starting inside a tile, an empty one, one shorter than the history.
    for (const std::vector<int>& lens :
         {std::vector<int>{1, 9}, std::vector<int>{3, 1}, std::vector<int>{40, 2},
          std::vector<int>{2, 0, 100}, std::vector<int>{33, 64, 1}}) {
      const int n = static_cast<int>(lens.size());
      std::vector<int32_t> cu(1, 0);
      for (int l : lens) cu.push_back(cu.back() + l);
      const int T = cu.back();
      std::vector<int32_t> positions(static_cast<size_t>(T), 0);
      std::vector<float> x = rng.normals(static_cast<size_t>(T) * C);
      SeqLayout seqs{n, T, cu.data(), positions.data(),
                     *std::max_element(lens.begin(), lens.end())};
      st.conv = conv.data();
      std::vector<float> want(x.size());
      cpu->conv1d_silu(st, seqs, slots.data(), x.data(), w.data(), want.data());
      GDNStateView dst = st;
      dst.conv = dconv;
      SeqLayout dseqs = seqs;
      dseqs.cu_seqlens = up(cu);
      dseqs.positions = up(positions);
      float* dout = poisoned(x.size());
      gpu->conv1d_silu(dst, dseqs, up(slots), up(x), up(w), dout);
      expect_close(down(dout, x.size()), want, 1e-5, "conv1d_silu K=" + std::to_string(K));
      expect_close(down(dconv, conv.size()), conv, 0.0, "conv state K=" + std::to_string(K));
    }
  }
}

void normalize_heads(std::vector<float>& x, int dim) {
  for (size_t r = 0; r < x.size() / static_cast<size_t>(dim); ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double{x[r * dim + i]} * x[r * dim + i];
    for (int i = 0; i < dim; ++i)
      x[r * dim + i] = static_cast<float>(x[r * dim + i] / std::sqrt(ss + 1e-6));
  }
}

TEST_F(CudaGdn, DeltaRuleContinuesStateWithStepStates) {
  Rng rng(23);
  cpu->set_gdn_chunk_threshold(1 << 30);  // the recurrent form on both sides
  struct Dims {
    int Dk, Dv;
  };
  // Dk <= 128 keeps state columns in registers; 160 takes the in-memory path. A call of at most
  // one token per sequence at Dk = 128 takes the decode kernel (Dv 48: a partial column block;
  // the last call: a sequence with no token, whose state stays as it is).
  for (Dims dm : {Dims{16, 32}, Dims{128, 128}, Dims{128, 48}, Dims{160, 48}}) {
    const int Hk = 2, Hv = 4, slots_n = 4;
    GDNStateView st{};
    st.k_heads = Hk;
    st.v_heads = Hv;
    st.k_dim = dm.Dk;
    st.v_dim = dm.Dv;
    const int64_t ssz = int64_t{dm.Dk} * dm.Dv;
    std::vector<float> ssm = rng.normals(static_cast<size_t>(slots_n * Hv * ssz), 0.1f);
    const std::vector<int32_t> slots = {1, 3, 0};
    float* dssm = up(ssm);
    int call = 0;
    for (const std::vector<int>& lens : {std::vector<int>{1, 9, 70}, std::vector<int>{2, 1, 5},
                                         std::vector<int>{1, 1, 1}, std::vector<int>{1, 0, 1}}) {
      std::vector<int32_t> cu = {0};
      for (int l : lens) cu.push_back(cu.back() + l);
      const int T = cu.back();
      std::vector<int32_t> positions(static_cast<size_t>(T), 0);
      std::vector<float> q = rng.normals(static_cast<size_t>(T) * Hk * dm.Dk);
      std::vector<float> k = rng.normals(q.size());
      normalize_heads(q, dm.Dk);
      normalize_heads(k, dm.Dk);
      std::vector<float> v = rng.normals(static_cast<size_t>(T) * Hv * dm.Dv);
      std::vector<float> g(static_cast<size_t>(T) * Hv), beta(g.size());
      for (auto& x : g) x = -rng.uniform(0.01f, 0.5f);
      for (auto& x : beta) x = rng.uniform(0.0f, 1.0f);
      const bool steps = call == 1;
      std::vector<float> step_want(steps ? static_cast<size_t>(T) * Hv * ssz : 0);
      SeqLayout seqs{3, T, cu.data(), positions.data(),
                     *std::max_element(lens.begin(), lens.end())};
      st.ssm = ssm.data();
      std::vector<float> want(v.size());
      cpu->gated_delta_rule(st, seqs, slots.data(), q.data(), k.data(), v.data(), g.data(),
                            beta.data(), want.data(), steps ? step_want.data() : nullptr);
      GDNStateView dst = st;
      dst.ssm = dssm;
      SeqLayout dseqs = seqs;
      dseqs.cu_seqlens = up(cu);
      dseqs.positions = up(positions);
      float* dout = poisoned(v.size());
      float* dsteps = steps ? poisoned(step_want.size()) : nullptr;
      gpu->gated_delta_rule(dst, dseqs, up(slots), up(q), up(k), up(v), up(g), up(beta), dout,
                            dsteps);
      const std::string d = " Dk=" + std::to_string(dm.Dk) + " call " + std::to_string(call);
      expect_close(down(dout, v.size()), want, 1e-4, "delta rule out" + d);
      expect_close(down(dssm, ssm.size()), ssm, 1e-4, "delta rule state" + d);
      if (steps) expect_close(down(dsteps, step_want.size()), step_want, 1e-4, "step states" + d);
      ++call;
    }
  }
}

// Prefill-length sequences: the chunked delta rule on both sides (the CPU's for sequences of 64
// rows and more; CUDA's for the whole call), with partial chunks, a one-token sequence in the
// same call, a partial column block (Dv 48) and two calls continuing the state. The same with
// PrefillPrecision::kFast (one TF32 pass for the walk's products), on a state of its own, within
// TF32's error.
TEST_F(CudaGdn, DeltaRuleChunkedMatchesCpu) {
  Rng rng(28);
  std::unique_ptr<Backend> fast = make_cuda_backend(0, PrefillPrecision::kFast);
  struct Dims {
    int Dk, Dv;
  };
  for (Dims dm : {Dims{16, 32}, Dims{128, 128}, Dims{128, 48}}) {
    const int Hk = 2, Hv = 4, slots_n = 4;
    GDNStateView st{};
    st.k_heads = Hk;
    st.v_heads = Hv;
    st.k_dim = dm.Dk;
    st.v_dim = dm.Dv;
    const int64_t ssz = int64_t{dm.Dk} * dm.Dv;
    std::vector<float> ssm = rng.normals(static_cast<size_t>(slots_n * Hv * ssz), 0.1f);
    const std::vector<int32_t> slots = {2, 0, 3, 1};
    float* dssm = up(ssm);
    float* fssm = up(ssm);
    int call = 0;
    for (const std::vector<int>& lens :
         {std::vector<int>{130, 64, 1, 200}, std::vector<int>{65, 3, 128, 70}}) {
      std::vector<int32_t> cu = {0};
      for (int l : lens) cu.push_back(cu.back() + l);
      const int T = cu.back();
      std::vector<int32_t> positions(static_cast<size_t>(T), 0);
      std::vector<float> q = rng.normals(static_cast<size_t>(T) * Hk * dm.Dk);
      std::vector<float> k = rng.normals(q.size());
      normalize_heads(q, dm.Dk);
      normalize_heads(k, dm.Dk);
      std::vector<float> v = rng.normals(static_cast<size_t>(T) * Hv * dm.Dv);
      std::vector<float> g(static_cast<size_t>(T) * Hv), beta(g.size());
      for (auto& x : g) x = -rng.uniform(0.01f, 0.5f);
      for (auto& x : beta) x = rng.uniform(0.0f, 1.0f);
      SeqLayout seqs{4, T, cu.data(), positions.data(),
                     *std::max_element(lens.begin(), lens.end())};
      st.ssm = ssm.data();
      std::vector<float> want(v.size());
      cpu->gated_delta_rule(st, seqs, slots.data(), q.data(), k.data(), v.data(), g.data(),
                            beta.data(), want.data(), nullptr);
      GDNStateView dst = st;
      dst.ssm = dssm;
      SeqLayout dseqs = seqs;
      dseqs.cu_seqlens = up(cu);
      dseqs.positions = up(positions);
      float* dout = poisoned(v.size());
      int32_t* dslots = up(slots);
      float *dq = up(q), *dk = up(k), *dv = up(v), *dg = up(g), *dbeta = up(beta);
      gpu->gated_delta_rule(dst, dseqs, dslots, dq, dk, dv, dg, dbeta, dout, nullptr);
      const std::string d = " Dk=" + std::to_string(dm.Dk) + " Dv=" + std::to_string(dm.Dv) +
                            " call " + std::to_string(call);
      const double exact_err =
          1e-4 * expect_close(down(dout, v.size()), want, 1e-4, "chunked delta rule out" + d);
      expect_close(down(dssm, ssm.size()), ssm, 1e-4, "chunked delta rule state" + d);
      GDNStateView fst = dst;
      fst.ssm = fssm;
      float* fout = poisoned(v.size());
      gpu->synchronize();
      fast->gated_delta_rule(fst, dseqs, dslots, dq, dk, dv, dg, dbeta, fout, nullptr);
      fast->synchronize();
      const double fast_err =
          2e-2 * expect_close(down(fout, v.size()), want, 2e-2, "fast chunked delta rule out" + d);
      expect_close(down(fssm, ssm.size()), ssm, 2e-2, "fast chunked delta rule state" + d);
      // One TF32 pass errs about 2^-12 a product, the split passes 2^-21.
      EXPECT_GT(fast_err, 8 * exact_err) << "fast" << d << ": as exact, so the split walk ran";
      ++call;
    }
  }
}

// gdn_front: fused on CUDA for decode and verify steps (kernel 4, <= 16 rows per sequence), a
// pass over the rows for longer ones (kernel 4), op by op otherwise; each against the CPU's
// op-by-op form, including the conv state.
TEST_F(CudaGdn, FrontMatchesCpu) {
  Rng rng(24);
  struct Geo {
    int Hk, Hv, Dk, Dv, K;
  };
  // Head dims up to 128 and (64/256) up to 256: the prefill form's one and two float4s a lane.
  for (Geo geo : {Geo{2, 4, 16, 32, 4}, Geo{2, 6, 128, 128, 4}, Geo{1, 2, 64, 256, 4},
                  Geo{2, 4, 16, 32, 2}}) {
    const int slots_n = 3;
    GDNStateView st{};
    st.k_heads = geo.Hk;
    st.v_heads = geo.Hv;
    st.k_dim = geo.Dk;
    st.v_dim = geo.Dv;
    st.kernel = geo.K;
    st.channels = 2 * geo.Hk * geo.Dk + geo.Hv * geo.Dv;
    const int64_t C = st.channels;
    std::vector<float> conv = rng.normals(static_cast<size_t>(slots_n * C * (geo.K - 1)));
    std::vector<float> w = rng.normals(static_cast<size_t>(C * geo.K), 0.5f);
    std::vector<float> a_log = rng.normals(static_cast<size_t>(geo.Hv), 0.5f);
    std::vector<float> dt_bias = rng.normals(static_cast<size_t>(geo.Hv), 0.5f);
    const std::vector<int32_t> slots = {2, 0};
    float* dconv = up(conv);
    // {1, 20}, {5, 43} and {37, 70}: the prefill form (a warp per 4 rows of a head segment, 32
    // rows a block), sequences starting inside a warp's rows, rows that reach into the conv
    // state, many blocks.
    for (const std::vector<int>& lens : {std::vector<int>{1, 2}, std::vector<int>{1, 20},
                                         std::vector<int>{5, 43}, std::vector<int>{37, 70}}) {
      const std::vector<int32_t> cu = {0, lens[0], lens[0] + lens[1]};
      const int T = cu[2];
      std::vector<int32_t> positions(static_cast<size_t>(T), 0);
      std::vector<float> qkv = rng.normals(static_cast<size_t>(T * C));
      std::vector<float> a = rng.normals(static_cast<size_t>(T * geo.Hv), 2.0f);
      std::vector<float> b = rng.normals(a.size(), 2.0f);
      const size_t nq = static_cast<size_t>(T) * geo.Hk * geo.Dk;
      const size_t nv = static_cast<size_t>(T) * geo.Hv * geo.Dv;
      std::vector<float> co(static_cast<size_t>(T * C)), q(nq), k(nq), v(nv), g(a.size()),
          beta(a.size());
      SeqLayout seqs{2, T, cu.data(), positions.data(), std::max(lens[0], lens[1])};
      st.conv = conv.data();
      cpu->gdn_front(st, seqs, slots.data(), qkv.data(), w.data(), a.data(), b.data(), a_log.data(),
                     dt_bias.data(), co.data(), q.data(), k.data(), v.data(), g.data(),
                     beta.data());
      GDNStateView dst = st;
      dst.conv = dconv;
      SeqLayout dseqs = seqs;
      dseqs.cu_seqlens = up(cu);
      dseqs.positions = up(positions);
      float *dq = poisoned(nq), *dk = poisoned(nq), *dv = poisoned(nv);
      float *dg = poisoned(a.size()), *db = poisoned(a.size());
      gpu->gdn_front(dst, dseqs, up(slots), up(qkv), up(w), up(a), up(b), up(a_log), up(dt_bias),
                     poisoned(co.size()), dq, dk, dv, dg, db);
      const std::string d = " Dk=" + std::to_string(geo.Dk) + " K=" + std::to_string(geo.K) +
                            " rows " + std::to_string(lens[1]);
      expect_close(down(dq, nq), q, 1e-5, "front q" + d);
      expect_close(down(dk, nq), k, 1e-5, "front k" + d);
      expect_close(down(dv, nv), v, 1e-5, "front v" + d);
      expect_close(down(dg, g.size()), g, 1e-5, "front g" + d);
      expect_close(down(db, beta.size()), beta, 1e-5, "front beta" + d);
      expect_close(down(dconv, conv.size()), conv, 0.0, "front conv state" + d);
    }
  }
}

}  // namespace
}  // namespace tokenmill::cudatest
