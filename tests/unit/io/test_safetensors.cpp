#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "tiny_checkpoint.h"

namespace tokenmill {
namespace {

using testing::expect_error;
using testing::TempDir;

// A raw file: 8-byte LE length (of `header` unless overridden), header, buffer.
std::string raw_file(const std::string& header, const std::string& buffer, int64_t len = -1) {
  uint64_t n = len < 0 ? header.size() : static_cast<uint64_t>(len);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + buffer;
}

SafetensorsHeader parse_string(const std::string& bytes,
                               const std::string& name = "x.safetensors") {
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
}

void expect_parse_error(const std::string& bytes, const std::vector<std::string>& parts) {
  std::vector<std::string> all = parts;
  all.push_back("bad.safetensors");
  expect_error([&] { parse_string(bytes, "bad.safetensors"); }, all);
}

TEST(Safetensors, WriterRoundTripsNamesDtypesShapesBytesAndMetadata) {
  TempDir tmp;
  std::vector<float> a = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  std::vector<uint16_t> b = {1, 2, 3};
  std::vector<uint8_t> c = {7};
  int64_t scalar = -5;
  std::vector<TensorToWrite> ts = {
      {"b16", DType::BF16, {3}, b.data(), 6}, {"a", DType::F32, {2, 3}, a.data(), 24},
      {"byte", DType::U8, {1}, c.data(), 1},  {"empty", DType::F32, {0, 4}, nullptr, 0},
      {"scalar", DType::I64, {}, &scalar, 8},
  };
  const std::string path = tmp.file("t.safetensors");
  write_safetensors(path, ts, {{"format", "pt"}, {"note", "hi"}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "hi");
  ASSERT_EQ(f.tensors().size(), ts.size());
  for (const auto& t : ts) {
    const SafetensorsTensor* r = f.find(t.name);
    ASSERT_NE(r, nullptr) << t.name;
    EXPECT_EQ(r->dtype, t.dtype);
    EXPECT_EQ(r->shape, t.shape);
    ASSERT_EQ(r->nbytes(), t.nbytes);
    if (t.nbytes) {
      EXPECT_EQ(std::memcmp(r->data, t.data, t.nbytes), 0) << t.name;
    }
    // Every tensor is aligned to its element size in the file.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->data) % dtype_size(r->dtype), 0u) << t.name;
  }
  EXPECT_EQ(f.find("scalar")->numel(), 1);
  EXPECT_EQ(f.find("empty")->numel(), 0);
  EXPECT_EQ(f.find("missing"), nullptr);

  // Header: 8-byte aligned, space padded, a JSON object.
  const std::string bytes = testing::read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["a"]["dtype"], "F32");
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
}

TEST(Safetensors, WriterGeneratesTensorsPieceByPiece) {
  // A generated tensor larger than the writer's 64 MB piece: every piece is asked for in order,
  // at element boundaries, and lands where its offset says.
  TempDir tmp;
  constexpr size_t kWords = size_t{20} << 20;  // 80 MB
  std::vector<std::pair<size_t, size_t>> calls;
  TensorToWrite g{"gen", DType::U32, {static_cast<int64_t>(kWords)}, nullptr, kWords * 4, {}};
  g.generate = [&](uint8_t* dst, size_t off, size_t n) {
    calls.emplace_back(off, n);
    auto* w = reinterpret_cast<uint32_t*>(dst);
    for (size_t i = 0; i < n / 4; ++i) w[i] = static_cast<uint32_t>(off / 4 + i) ^ 0x5bd1e995u;
  };
  const uint16_t small[2] = {9, 10};
  const std::string path = tmp.file("g.safetensors");
  write_safetensors(path, {g, {"small", DType::BF16, {2}, small, 4, {}}});
  ASSERT_GE(calls.size(), 2u);
  size_t next = 0;
  for (const auto& [off, n] : calls) {
    EXPECT_EQ(off, next);
    EXPECT_EQ(n % 4, 0u);
    next = off + n;
  }
  EXPECT_EQ(next, kWords * 4);
  SafetensorsFile f = SafetensorsFile::open(path);
  const auto* w = reinterpret_cast<const uint32_t*>(f.find("gen")->data);
  size_t wrong = 0;
  for (size_t i = 0; i < kWords; ++i) wrong += w[i] != (static_cast<uint32_t>(i) ^ 0x5bd1e995u);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(std::memcmp(f.find("small")->data, small, 4), 0);
}

TEST(Safetensors, ParsesAHandWrittenFile) {
  // As the reference writes it: offsets relative to the buffer, zero-size and rank-0 allowed.
  std::string h = R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                  R"("z":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]},)"
                  R"("s":{"dtype":"U8","shape":[],"data_offsets":[4,5]}})";
  SafetensorsHeader hd = parse_string(raw_file(h + "   ", "abcde"));
  ASSERT_EQ(hd.tensors.size(), 3u);
  EXPECT_EQ(hd.data_start, 8 + h.size() + 3);
  EXPECT_EQ(hd.tensors[0].name, "w");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(hd.tensors[0].data), 4), "abcd");
  EXPECT_EQ(*hd.tensors.back().data, 'e');
  EXPECT_TRUE(hd.metadata.empty());
}

TEST(SafetensorsErrors, TruncatedFileAtSeveralPoints) {
  TempDir tmp;
  std::vector<float> a(64, 1.f);
  std::vector<TensorToWrite> ts = {{"a", DType::F32, {8, 8}, a.data(), 256},
                                   {"b", DType::F32, {64}, a.data(), 256}};
  const std::string path = tmp.file("full.safetensors");
  write_safetensors(path, ts);
  const std::string full = testing::read_bytes(path);
  const size_t header_end = full.size() - 512;
  for (size_t cut : {size_t{0}, size_t{5}, size_t{8}, size_t{20}, header_end - 1, header_end,
                     header_end + 100, full.size() - 1}) {
    SCOPED_TRACE(cut);
    const std::string p = tmp.file("cut.safetensors");
    testing::write_bytes(p, full.substr(0, cut));
    if (cut == 0) {
      expect_error([&] { SafetensorsFile::open(p); }, {p, "too short"});
    } else if (cut < 8) {
      expect_error([&] { SafetensorsFile::open(p); }, {p, "too short", "truncated"});
    } else if (cut < header_end) {
      expect_error([&] { SafetensorsFile::open(p); }, {p, "past the end of the file", "truncated"});
    } else {
      expect_error([&] { SafetensorsFile::open(p); }, {p, "truncated"});
    }
  }
}

TEST(SafetensorsErrors, MissingFile) {
  expect_error([] { SafetensorsFile::open("/nonexistent/dir/m.safetensors"); },
               {"/nonexistent/dir/m.safetensors", "cannot open"});
}

TEST(SafetensorsErrors, HeaderLengthTooLarge) {
  expect_parse_error(raw_file("{}", "", 100'000'001), {"header length 100000001", "limit"});
  expect_parse_error(raw_file("{}", "", int64_t{1} << 62), {"exceeds the limit"});
  expect_parse_error(raw_file("{}", "", 50), {"header length 50", "past the end"});
}

TEST(SafetensorsErrors, BadJson) {
  expect_parse_error(raw_file(R"({"a": {"dtype": "F32",)", ""), {"not valid JSON"});
  expect_parse_error(raw_file("{\"a\": 1} xyz", ""), {"not valid JSON"});
  expect_parse_error(raw_file("[1, 2]", ""), {"does not start with '{'"});
  expect_parse_error(raw_file("{\"a\": \"\xff\"}", ""), {"not valid JSON"});
  expect_parse_error(raw_file(R"({"a": 5})", ""), {"tensor 'a'", "not a JSON object"});
}

TEST(SafetensorsErrors, OverlappingOffsets) {
  std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_parse_error(raw_file(h, std::string(12, 'x')), {"'a' [0, 8)", "'b' [4, 12)", "overlap"});
}

TEST(SafetensorsErrors, GapsAndTrailingBytes) {
  std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  expect_parse_error(raw_file(h, std::string(12, 'x')), {"bytes [4, 8)", "gap before 'b'"});
  std::string h2 = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_parse_error(raw_file(h2, std::string(6, 'x')), {"last 2 bytes", "belong to no tensor"});
}

TEST(SafetensorsErrors, WrongSizeForDtype) {
  std::string h = R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})";
  expect_parse_error(raw_file(h, std::string(8, 'x')),
                     {"tensor 'w'", "BF16 [2,3] needs 12 bytes", "hold 8"});
}

TEST(SafetensorsErrors, UnknownDtype) {
  std::string h = R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})";
  expect_parse_error(raw_file(h, "x"), {"tensor 'w'", "unknown dtype 'F4'"});
  std::string h2 = R"({"w":{"shape":[2],"data_offsets":[0,1]}})";
  expect_parse_error(raw_file(h2, "x"), {"tensor 'w'", "missing string 'dtype'"});
}

TEST(SafetensorsErrors, DuplicateNames) {
  std::string h = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_parse_error(raw_file(h, "xy"), {"names 'w' twice"});
}

TEST(SafetensorsErrors, BadShapesAndOffsets) {
  auto one = [](const std::string& shape, const std::string& offsets) {
    return raw_file(
        R"({"w":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}", "xxxx");
  };
  expect_parse_error(one("[-1]", "[0,4]"), {"tensor 'w'", "shape entry -1 is negative"});
  expect_parse_error(one("[1.5]", "[0,4]"), {"tensor 'w'", "not an integer"});
  expect_parse_error(one("4", "[0,4]"), {"tensor 'w'", "'shape' is not an array"});
  expect_parse_error(one("[4]", "[0]"), {"tensor 'w'", "data_offsets"});
  expect_parse_error(one("[4]", "[2,1]"), {"tensor 'w'", "end before they begin"});
  expect_parse_error(one("[8]", "[0,8]"), {"tensor 'w'", "past the data buffer (4 bytes)"});
  expect_parse_error(one("[4294967296,4294967296,4294967296]", "[0,4]"),
                     {"tensor 'w'", "overflows"});
}

TEST(SafetensorsErrors, MetadataMustBeAStringMap) {
  expect_parse_error(raw_file(R"({"__metadata__":{"format":1}})", ""),
                     {"'__metadata__' entry 'format' is not a string"});
  expect_parse_error(raw_file(R"({"__metadata__":[]})", ""), {"'__metadata__' is not"});
}

TEST(SafetensorsErrors, WriterRejectsWrongSizes) {
  TempDir tmp;
  float x = 0;
  expect_error(
      [&] {
        write_safetensors(tmp.file("w.safetensors"), {{"x", DType::F32, {2}, &x, 4}});
      },
      {"w.safetensors", "tensor 'x'", "needs 8 bytes, got 4"});
  expect_error(
      [&] {
        write_safetensors(tmp.file("n.safetensors"), {{"y", DType::F32, {2}, nullptr, 8, {}}});
      },
      {"n.safetensors", "tensor 'y'", "neither data nor a generator"});
}

}  // namespace
}  // namespace tokenmill
