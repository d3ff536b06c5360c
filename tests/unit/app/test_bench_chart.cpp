// The bench chart is an SVG tokenmill draws itself: well-formed, escaped, one point per
// measurement at the measured values, and a clear placeholder for a series that was not run.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "app/bench_report.h"

namespace tokenmill::app {
namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// Every element opened is closed (or self-closing), in order: a small XML well-formedness check
// that is enough for the writer's flat output.
bool balanced(const std::string& svg) {
  std::vector<std::string> open;
  size_t i = svg.find("<svg");
  while ((i = svg.find('<', i)) != std::string::npos) {
    const size_t end = svg.find('>', i);
    if (end == std::string::npos) return false;
    const std::string tag = svg.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty() || tag[0] == '?') continue;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find(' ')));
    }
  }
  return open.empty();
}

BenchReport sample() {
  BenchReport r;
  r.device = "cuda:0 (Test <GPU> & co)";
  r.model = "qwen3.5-27b q4g64";
  r.read_gbps = 4500;
  r.weight_bytes_per_token = 14'412'000'000;
  r.decode = {{1024, 66.4, 0.1}, {8192, 55.8, 0.5}, {32768, 50.1, 2.0}};
  r.batch = {{1, 66.6, 66.6}, {4, 226.3, 56.6}, {16, 437.8, 27.4}};
  return r;
}

TEST(BenchChart, WellFormedSvgWithEveryMeasurement) {
  const std::string svg = report_chart_svg(sample());
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_TRUE(balanced(svg)) << svg;
  EXPECT_EQ(count(svg, "<polyline"), 2);
  EXPECT_EQ(count(svg, "<circle"), 6);
  for (const char* v : {">66.4<", ">55.8<", ">50.1<", ">226.3<", ">437.8<"}) {
    EXPECT_NE(svg.find(v), std::string::npos) << v;
  }
  for (const char* tick : {">1024<", ">8192<", ">32768<", ">16<"}) {
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  }
  // The device name is escaped, never raw markup.
  EXPECT_NE(svg.find("Test &lt;GPU&gt; &amp; co"), std::string::npos);
  EXPECT_EQ(svg.find("<GPU>"), std::string::npos);
}

TEST(BenchChart, XAxisIsLogarithmicAndYStartsAtZero) {
  const std::string svg = report_chart_svg(sample());
  // Decode points at contexts 1k, 8k, 32k: equal log2 steps (3 and 2) give x gaps in ratio 3:2.
  const size_t at = svg.find("points=\"");
  ASSERT_NE(at, std::string::npos);
  double x[3], y[3];
  ASSERT_EQ(std::sscanf(svg.c_str() + at, "points=\"%lf,%lf %lf,%lf %lf,%lf", &x[0], &y[0], &x[1],
                        &y[1], &x[2], &y[2]),
            6);
  EXPECT_NEAR((x[1] - x[0]) / (x[2] - x[1]), 1.5, 0.02);
  EXPECT_LT(y[0], y[1]);                          // a faster rate is drawn higher (smaller y)
  EXPECT_NE(svg.find(">0<"), std::string::npos);  // the y axis starts at zero
}

TEST(BenchChart, MissingSeriesSaysSo) {
  BenchReport r = sample();
  r.batch.clear();
  const std::string svg = report_chart_svg(r);
  EXPECT_TRUE(balanced(svg));
  EXPECT_EQ(count(svg, "<polyline"), 1);
  EXPECT_NE(svg.find("not measured"), std::string::npos);
}

TEST(BenchChart, SinglePointIsCentred) {
  BenchReport r = sample();
  r.decode = {{1024, 10.0, 0.1}};
  const std::string svg = report_chart_svg(r);
  EXPECT_TRUE(balanced(svg));
  EXPECT_NE(svg.find("<circle cx=\"263.0\""), std::string::npos) << svg;  // (70 + 456) / 2
}

}  // namespace
}  // namespace tokenmill::app
