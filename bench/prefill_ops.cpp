// One layer's prefill sequence mixers on any backend, at a model preset's shape: causal
// attention over a BF16 paged cache (Backend::attention), the gated delta rule
// (Backend::gated_delta_rule) and the GDN front before it (Backend::gdn_front), for sequences of
// `--tokens` new rows after `--prefix` cached positions each. Prints milliseconds per call (the
// best of `--reps`) and, for attention, the rate of its causal products (4 x heads x head_dim
// FLOP per query row and key it sees); for the front, its channel rows' bytes in and out. The
// kernels a backend picks follow its precision (`--prefill-precision fast` on CUDA), so the two
// runs of one build compare the forms. Inputs are random (cache and queries filled on the
// device; the delta rule's gates drawn on the host inside their ranges). With --tokens 1 the
// delta rule is a decode step's (`--tokens 1 --seqs 64`: the 64-sequence step's state traffic,
// docs/PERFORMANCE.md S53). Not a test.
//
//   tm_bench_prefill_ops [--device cpu|cuda|auto] [--prefill-precision exact|fast]
//                        [--preset NAME] [--tokens N] [--prefix P] [--seqs S] [--reps R]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "app/backend_select.h"
#include "app/bench_presets.h"

namespace {

using namespace tokenmill;
using Clock = std::chrono::steady_clock;

// Backend memory freed with the object.
struct Buffers {
  Backend& be;
  std::vector<void*> owned;
  explicit Buffers(Backend& b) : be(b) {}
  ~Buffers() {
    be.synchronize();
    for (void* p : owned) be.free(p);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  template <class T>
  T* random(int64_t n, DType dt, float stddev, uint64_t seed) {
    void* p = be.alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(dt));
    owned.push_back(p);
    be.fill_random(p, dt, n, stddev, seed);
    return static_cast<T*>(p);
  }
  template <class T>
  T* copy(const std::vector<T>& v) {
    void* p = be.alloc(std::max<size_t>(v.size(), 1) * sizeof(T));
    owned.push_back(p);
    if (!v.empty()) be.upload(p, v.data(), v.size() * sizeof(T));
    return static_cast<T*>(p);
  }
};

// Best milliseconds of `reps` timed calls of f, after one untimed call (workspaces grow, modules
// load, the library picks its kernels).
template <class F>
double best_ms(Backend& be, int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    be.synchronize();
    const auto t0 = Clock::now();
    f();
    be.synchronize();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One layer's prefill attention, GDN front and delta rule on a backend"};
  app::DeviceOptions dev;
  std::string preset = "qwen3.5-27b";
  int tokens = 8192, prefix = 0, seqs = 1, reps = 5;
  app::add_device_options(app, dev);
  app.add_option("--preset", preset, "Model shape (tokenmill bench --help lists them)")
      ->capture_default_str();
  app.add_option("--tokens", tokens, "New rows per sequence")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--prefix", prefix, "Cached positions before them")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 22));
  app.add_option("--seqs", seqs, "Sequences in the call")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--reps", reps, "Timed calls (best is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  const SyntheticSpec spec = app::find_preset(preset).spec;
  app::BackendHandle h = app::make_backend(dev);
  Backend& be = *h.backend;
  std::printf("%s, %s shape, prefill precision %s: %d sequence(s) of %d rows after %d cached\n",
              be.name().c_str(), preset.c_str(), dev.prefill_precision.c_str(), seqs, tokens,
              prefix);

  // The call's layout: sequence s holds positions prefix .. prefix + tokens - 1.
  const int ctx = prefix + tokens, T = seqs * tokens;
  std::vector<int32_t> cu = {0}, positions, ctx_lens(static_cast<size_t>(seqs), ctx);
  for (int s = 0; s < seqs; ++s) {
    for (int i = 0; i < tokens; ++i) positions.push_back(prefix + i);
    cu.push_back(cu.back() + tokens);
  }
  Buffers buf(be);
  SeqLayout layout{seqs, T, buf.copy(cu), buf.copy(positions), tokens};

  if (spec.heads > 0 && spec.kv_heads > 0) {
    // The cache as GPU engines keep it (BF16), F32 where the backend takes only that.
    const DType kv_dtype = be.supports_kv_dtype(DType::BF16) ? DType::BF16 : DType::F32;
    const int block = 16, max_blocks = (ctx + block - 1) / block;
    std::vector<int32_t> tables(static_cast<size_t>(seqs) * max_blocks);
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
    const int64_t cache_rows = int64_t{seqs} * max_blocks * block;
    const int64_t row = int64_t{spec.kv_heads} * spec.head_dim;
    KVLayerView kv{buf.random<void>(cache_rows * row, kv_dtype, 1.0f, 1),
                   buf.random<void>(cache_rows * row, kv_dtype, 1.0f, 2),
                   block,
                   spec.kv_heads,
                   spec.head_dim,
                   kv_dtype};
    KVPaging paging{buf.copy(tables), max_blocks, buf.copy(ctx_lens), ctx};
    const int64_t qn = int64_t{T} * spec.heads * spec.head_dim;
    const float* q = buf.random<float>(qn, DType::F32, 1.0f, 3);
    float* out = buf.random<float>(qn, DType::F32, 0.0f, 4);
    const size_t ws =
        be.attention_workspace_floats(T, spec.heads, spec.head_dim, max_blocks * block);
    if (ws > 0) be.set_attention_workspace(buf.random<float>(ws, DType::F32, 0.0f, 5), ws);
    const float scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
    const double ms =
        best_ms(be, reps, [&] { be.attention(kv, paging, layout, q, spec.heads, scale, out); });
    // Row at position p sees p + 1 keys: QK^T and PV, 2 FLOP a multiply-add each.
    const double keys =
        static_cast<double>(seqs) *
        (static_cast<double>(ctx) * (ctx + 1) / 2 - static_cast<double>(prefix) * (prefix + 1) / 2);
    const double flop = 4.0 * spec.heads * spec.head_dim * keys;
    std::printf(
        "attention   %2d/%d heads of %d (%s cache): %9.3f ms  %8.1f TFLOP/s of causal products\n",
        spec.heads, spec.kv_heads, spec.head_dim, kv_dtype == DType::BF16 ? "bf16" : "f32", ms,
        flop / ms / 1e9);
  }

  if (spec.k_heads > 0 && spec.v_heads > 0) {
    GDNStateView st{};
    st.k_heads = spec.k_heads;
    st.v_heads = spec.v_heads;
    st.k_dim = spec.k_dim;
    st.v_dim = spec.v_dim;
    const int64_t state = int64_t{st.v_heads} * st.k_dim * st.v_dim;
    st.ssm = buf.random<float>(seqs * state, DType::F32, 0.01f, 6);
    std::vector<int32_t> slots(static_cast<size_t>(seqs));
    for (int s = 0; s < seqs; ++s) slots[static_cast<size_t>(s)] = s;
    // Unit-norm-sized q and k rows, decays in (0.5, 1) and write strengths in (0, 1), as after
    // the layer's front.
    const float kq_sd = 1.0f / std::sqrt(static_cast<float>(st.k_dim));
    const int64_t qk_n = int64_t{T} * st.k_heads * st.k_dim;
    const float* q = buf.random<float>(qk_n, DType::F32, kq_sd, 7);
    const float* k = buf.random<float>(qk_n, DType::F32, kq_sd, 8);
    const float* v = buf.random<float>(int64_t{T} * st.v_heads * st.v_dim, DType::F32, 1.0f, 9);
    std::mt19937 gen(10);
    std::uniform_real_distribution<float> decay(-0.7f, -0.01f), strength(0.0f, 1.0f);
    std::vector<float> g(static_cast<size_t>(T) * st.v_heads), beta(g.size());
    for (float& x : g) x = decay(gen);
    for (float& x : beta) x = strength(gen);
    const float* dg = buf.copy(g);
    const float* dbeta = buf.copy(beta);
    float* out = buf.random<float>(int64_t{T} * st.v_heads * st.v_dim, DType::F32, 0.0f, 11);
    const int32_t* dslots = buf.copy(slots);
    const double ms = best_ms(be, reps, [&] {
      be.gated_delta_rule(st, layout, dslots, q, k, v, dg, dbeta, out, nullptr);
    });
    // The F32 state of every (sequence, head) is read and written once per call: at one token a
    // sequence (--tokens 1, the decode kernel on CUDA) those bytes are the call's cost.
    const double state_bytes = 2.0 * static_cast<double>(seqs) * state * sizeof(float);
    std::printf("delta rule  %2d/%d heads of %d: %9.3f ms  %8.1f k rows/s  %7.1f GB/s of state\n",
                st.v_heads, st.k_heads, st.k_dim, ms, T / ms, state_bytes / ms / 1e6);

    // The front before it: the conv over the input projection's q, k and v channels, SiLU, the
    // q/k l2norms and the gates; it moves the channels' rows in and out once (F32).
    st.kernel = 4;
    st.channels = 2 * int64_t{st.k_heads} * st.k_dim + int64_t{st.v_heads} * st.v_dim;
    const int64_t C = st.channels;
    st.conv = buf.random<float>(seqs * C * (st.kernel - 1), DType::F32, 1.0f, 12);
    const float* qkv = buf.random<float>(int64_t{T} * C, DType::F32, 1.0f, 13);
    const float* conv_w = buf.random<float>(C * st.kernel, DType::F32, 0.5f, 14);
    const float* a = buf.random<float>(int64_t{T} * st.v_heads, DType::F32, 1.0f, 15);
    const float* b = buf.random<float>(int64_t{T} * st.v_heads, DType::F32, 1.0f, 16);
    const float* a_log = buf.random<float>(st.v_heads, DType::F32, 0.5f, 17);
    const float* dt_bias = buf.random<float>(st.v_heads, DType::F32, 0.5f, 18);
    float* conv_out = buf.random<float>(int64_t{T} * C, DType::F32, 0.0f, 19);
    float* fq = buf.random<float>(qk_n, DType::F32, 0.0f, 20);
    float* fk = buf.random<float>(qk_n, DType::F32, 0.0f, 21);
    float* fv = buf.random<float>(int64_t{T} * st.v_heads * st.v_dim, DType::F32, 0.0f, 22);
    float* fg = buf.random<float>(int64_t{T} * st.v_heads, DType::F32, 0.0f, 23);
    float* fbeta = buf.random<float>(int64_t{T} * st.v_heads, DType::F32, 0.0f, 24);
    const double front_ms = best_ms(be, reps, [&] {
      be.gdn_front(st, layout, dslots, qkv, conv_w, a, b, a_log, dt_bias, conv_out, fq, fk, fv, fg,
                   fbeta);
    });
    const double bytes = 2.0 * static_cast<double>(T) * C * sizeof(float);
    std::printf("gdn front   %2d/%d heads of %d: %9.3f ms  %8.1f GB/s of channel rows in and out\n",
                st.v_heads, st.k_heads, st.k_dim, front_ms, bytes / front_ms / 1e6);
  }
  return 0;
}
