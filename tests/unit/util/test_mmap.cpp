// MappedFile: a read-only mapping of a file; release() drops this process's resident pages of a
// range (the loader's copy of the weights is then the only one held) and the bytes read back
// unchanged from the file afterwards.
#include "util/mmap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tokenmill {
namespace {

// Resident kB of the mapping that contains p, from /proc/self/smaps.
int64_t resident_kb(const void* p) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') != 8) {
      inside = addr >= lo && addr < hi;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) {
      std::istringstream f(line.substr(4));
      int64_t kb = 0;
      f >> kb;
      return kb;
    }
  }
  return -1;
}

TEST(MappedFile, ReleaseDropsResidentPagesAndKeepsTheBytes) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tokenmill-mmap-" + std::to_string(::getpid()) + ".bin");
  constexpr size_t kBytes = size_t{8} << 20;
  std::vector<uint8_t> bytes(kBytes);
  for (size_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), kBytes);
  {
    MappedFile f(path.string());
    ASSERT_EQ(f.size(), kBytes);
    uint64_t sum = 0;
    for (size_t i = 0; i < kBytes; i += 512) sum += f.data()[i];  // touch every page
    EXPECT_GT(sum, 0u);
    const int64_t before = resident_kb(f.data());
    ASSERT_GE(before, 8 * 1024 - 64) << "the touched pages are resident";
    // A range that starts and ends inside pages: only the pages wholly inside it go.
    f.release(f.data() + 1000, (size_t{4} << 20) + 100);
    const int64_t after = resident_kb(f.data());
    EXPECT_LE(after, before - 4 * 1024 + 8);
    EXPECT_GE(after, before - 4 * 1024 - 8);
    EXPECT_TRUE(f.contains(f.data() + kBytes - 1));
    EXPECT_FALSE(f.contains(f.data() + kBytes));
    EXPECT_FALSE(f.contains(bytes.data()));
    f.release(bytes.data(), 4096);  // not this mapping's: nothing happens
    EXPECT_EQ(std::memcmp(f.data(), bytes.data(), kBytes), 0) << "released pages read back";
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tokenmill
