#include "dplan/planner/scaling_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

namespace dplan::planner {
namespace {

std::string number(double v) {
  char buf[32];
  if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.3gk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

// One panel: x = GPUs (log2 scale when they double, else linear), y from 0 to the largest value.
std::string panel(const std::vector<ScalingPoint>& pts, double x0, const std::string& label,
                  const std::function<double(const ScalingPoint&)>& predicted,
                  const std::function<double(const ScalingPoint&)>& measured, bool percent) {
  const double w = 400, h = 280, left = 60, top = 40, pw = w - left - 20, ph = h - top - 50;
  double ymax = 0;
  for (const auto& p : pts) ymax = std::max({ymax, predicted(p), measured(p)});
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  const double g0 = std::log2(pts.front().gpus), g1 = std::log2(pts.back().gpus);
  auto x = [&](int gpus) { return x0 + left + (g1 > g0 ? (std::log2(gpus) - g0) / (g1 - g0) : 0.5) * pw; };
  auto y = [&](double v) { return top + ph - v / ymax * ph; };
  std::string svg;
  char buf[512];
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"24\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n",
                x0 + left + pw / 2, escape(label).c_str());
  svg += buf;
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n"
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                x0 + left, top, x0 + left, top + ph, x0 + left, top + ph, x0 + left + pw, top + ph);
  svg += buf;
  for (int i = 0; i <= 4; ++i) {  // y ticks
    const double v = ymax * i / 4;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                  x0 + left, y(v), x0 + left + pw, y(v), x0 + left - 6, y(v) + 4,
                  percent ? (number(100 * v) + "%").c_str() : number(v).c_str());
    svg += buf;
  }
  for (const auto& p : pts) {  // x ticks
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%d</text>\n",
                  x(p.gpus), top + ph + 16, p.gpus);
    svg += buf;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">GPUs (ranks)</text>\n",
                x0 + left + pw / 2, top + ph + 36);
  svg += buf;
  for (auto [series, dash, color, name] :
       {std::tuple{&predicted, "stroke-dasharray=\"6 4\" ", "#1f77b4", "predicted"},
        std::tuple{&measured, "", "#d62728", "measured"}}) {
    std::string line = "<polyline class=\"" + std::string(name) + "\" fill=\"none\" stroke=\"" + color +
                       "\" stroke-width=\"2\" " + dash + "points=\"";
    for (const auto& p : pts) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x(p.gpus), y((*series)(p)));
      line += buf;
    }
    svg += line + "\"/>\n";
    for (const auto& p : pts) {
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x(p.gpus),
                    y((*series)(p)), color);
      svg += buf;
    }
  }
  return svg;
}

}  // namespace

void fill_efficiencies(std::vector<ScalingPoint>& points) {
  if (points.empty()) return;
  const ScalingPoint first = points.front();
  for (auto& p : points) {
    const double scale = double(p.gpus) / first.gpus;
    p.predicted_efficiency = p.predicted_tokens_per_s / first.predicted_tokens_per_s / scale;
    p.measured_efficiency = p.measured_tokens_per_s / first.measured_tokens_per_s / scale;
  }
}

// Marks a chart dplan scale drew, so a rerun may replace it (scaling_svg_output).
const std::string kChartMark = "<desc>dplan scale: predicted against measured scaling</desc>";

const OutputKind& scaling_svg_output() {
  static const OutputKind kind{"scaling chart", [](const std::string& text) {
                                 return text.starts_with("<svg ") && text.find(kChartMark) != std::string::npos;
                               }};
  return kind;
}

std::string scaling_svg(const std::vector<ScalingPoint>& points, const std::string& title) {
  std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"330\" font-family=\"sans-serif\">\n"
      "<rect width=\"820\" height=\"330\" fill=\"white\"/>\n<title>" + escape(title) + "</title>\n" +
      kChartMark + "\n";
  svg += panel(points, 0, "throughput (tokens/s)", [](const ScalingPoint& p) { return p.predicted_tokens_per_s; },
               [](const ScalingPoint& p) { return p.measured_tokens_per_s; }, false);
  svg += panel(points, 410, "scaling efficiency", [](const ScalingPoint& p) { return p.predicted_efficiency; },
               [](const ScalingPoint& p) { return p.measured_efficiency; }, true);
  svg += "<g font-size=\"12\">\n"
         "<line x1=\"250\" y1=\"318\" x2=\"280\" y2=\"318\" stroke=\"#1f77b4\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/>"
         "<text x=\"285\" y=\"322\">predicted</text>\n"
         "<line x1=\"370\" y1=\"318\" x2=\"400\" y2=\"318\" stroke=\"#d62728\" stroke-width=\"2\"/>"
         "<text x=\"405\" y=\"322\">measured</text>\n"
         "<text x=\"500\" y=\"322\">" + escape(title) + "</text>\n</g>\n</svg>\n";
  return svg;
}

}  // namespace dplan::planner
