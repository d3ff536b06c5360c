// The bench chart: an SVG written directly (no plotting program needed on the machine being
// measured): decode tok/s against context length, and aggregate tok/s against concurrent
// sequences, each on a log2 x axis with the measured values labelled.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "app/bench_report.h"
#include "util/error.h"
#include "util/escape.h"

namespace tokenmill::app {

namespace {

constexpr double kWidth = 960, kHeight = 420, kPanelWidth = kWidth / 2;
constexpr double kLeft = 70, kRight = 24, kTop = 76, kBottom = 56;

std::string num(double v, int decimals = 1) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// The smallest 1, 2 or 5 times a power of ten that is >= v (v > 0).
double nice_ceiling(double v) {
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= v) return m * p;
  }
  return 10 * p;
}

// One panel: points (x > 0, y >= 0) on a log2 x axis and a linear y axis from 0.
void panel(std::ostringstream& svg, double x0, const std::string& xlabel, const std::string& ylabel,
           std::vector<std::pair<double, double>> pts, const char* color) {
  const double left = x0 + kLeft, right = x0 + kPanelWidth - kRight;
  const double top = kTop, bottom = kHeight - kBottom;
  svg << "<g>\n";
  svg << "<rect x=\"" << num(left) << "\" y=\"" << num(top) << "\" width=\"" << num(right - left)
      << "\" height=\"" << num(bottom - top) << "\" fill=\"none\" stroke=\"#444\"/>\n";
  svg << "<text x=\"" << num((left + right) / 2) << "\" y=\"" << num(kHeight - 14)
      << "\" text-anchor=\"middle\">" << html_escape(xlabel) << "</text>\n";
  svg << "<text x=\"" << num(left) << "\" y=\"" << num(top - 8) << "\">" << html_escape(ylabel)
      << "</text>\n";
  std::erase_if(pts, [](const auto& p) { return !(p.first > 0) || !std::isfinite(p.second); });
  if (pts.empty()) {
    svg << "<text x=\"" << num((left + right) / 2) << "\" y=\"" << num((top + bottom) / 2)
        << "\" text-anchor=\"middle\" fill=\"#888\">not measured</text>\n</g>\n";
    return;
  }
  std::sort(pts.begin(), pts.end());
  const double lx0 = std::log2(pts.front().first), lx1 = std::log2(pts.back().first);
  double ymax = 0;
  for (const auto& p : pts) ymax = std::max(ymax, p.second);
  ymax = ymax > 0 ? nice_ceiling(ymax * 1.1) : 1.0;
  const double pad = 24;
  auto px = [&](double x) {
    if (lx1 == lx0) return (left + right) / 2;
    return left + pad + (std::log2(x) - lx0) / (lx1 - lx0) * (right - left - 2 * pad);
  };
  auto py = [&](double y) { return bottom - y / ymax * (bottom - top); };
  for (int i = 0; i <= 5; ++i) {  // y grid and ticks
    const double v = ymax * i / 5, y = py(v);
    svg << "<line x1=\"" << num(left) << "\" y1=\"" << num(y) << "\" x2=\"" << num(right)
        << "\" y2=\"" << num(y) << "\" stroke=\"#ddd\"/>\n";
    svg << "<text x=\"" << num(left - 6) << "\" y=\"" << num(y + 4)
        << "\" text-anchor=\"end\" font-size=\"11\">" << num(v, ymax >= 10 ? 0 : 1) << "</text>\n";
  }
  for (const auto& p : pts) {  // x ticks at the measured points
    svg << "<text x=\"" << num(px(p.first)) << "\" y=\"" << num(bottom + 16)
        << "\" text-anchor=\"middle\" font-size=\"11\">" << static_cast<long long>(p.first)
        << "</text>\n";
  }
  svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
  for (size_t i = 0; i < pts.size(); ++i) {
    svg << (i ? " " : "") << num(px(pts[i].first)) << "," << num(py(pts[i].second));
  }
  svg << "\"/>\n";
  for (const auto& p : pts) {
    svg << "<circle cx=\"" << num(px(p.first)) << "\" cy=\"" << num(py(p.second))
        << "\" r=\"3.5\" fill=\"" << color << "\"/>\n";
    svg << "<text x=\"" << num(px(p.first)) << "\" y=\"" << num(py(p.second) - 8)
        << "\" text-anchor=\"middle\" font-size=\"11\">" << num(p.second) << "</text>\n";
  }
  svg << "</g>\n";
}

}  // namespace

std::string report_chart_svg(const BenchReport& r) {
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
      << html_escape(r.model + " on " + r.device) << "</text>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"44\" text-anchor=\"middle\" fill=\"#555\">"
      << html_escape("read bandwidth " + num(r.read_gbps) + " GB/s, " +
                     num(r.weight_bytes_per_token / 1e9, 3) + " GB of weights read per token")
      << "</text>\n";
  std::vector<std::pair<double, double>> decode, batch;
  for (const auto& d : r.decode) decode.emplace_back(d.context, d.tok_s);
  for (const auto& b : r.batch) batch.emplace_back(b.seqs, b.aggregate_tok_s);
  panel(svg, 0, "context (tokens)", "decode tok/s (one sequence)", decode, "#1f77b4");
  panel(svg, kPanelWidth, "concurrent sequences", "aggregate tok/s", batch, "#d62728");
  svg << "</svg>\n";
  return svg.str();
}

void write_report_chart(const BenchReport& r, const std::string& path) {
  std::ofstream f(path);
  if (!f) fail("{}: cannot write the chart; check the directory exists and is writable", path);
  f << report_chart_svg(r);
  if (!f) fail("{}: writing the chart failed (disk full?)", path);
  std::fprintf(stderr, "wrote %s\n", path.c_str());
}

}  // namespace tokenmill::app
