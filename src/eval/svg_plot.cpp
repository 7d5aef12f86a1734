// SPDX-License-Identifier: Apache-2.0
#include "eval/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace protokv::eval {
namespace {

// Colour-blind-friendly palette (Okabe–Ito), cycled.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00",
                                    "#56B4E9", "#000000", "#882255", "#999999"};

// "Nice" tick positions from at or below lo to at or above hi: steps of 1, 2 or 5 times a power
// of ten, so the axis ends on a labelled tick.
std::vector<double> nice_ticks(double lo, double hi, int target) {
  const double span = hi - lo;
  const double raw = span / std::max(target, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (raw <= step) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  for (double i = first; i <= last; i += 1.0) {
    const double t = i * step;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string format_tick(double v) {
  if (v == 0.0) return "0";
  const double a = std::abs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.1e}", v);
  std::string s = fmt::format("{:.4f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_svg(const LinePlot& plot) {
  // The legend sits right of the plot area and widens the picture for long press specs.
  size_t longest_name = 0;
  for (const auto& s : plot.series) longest_name = std::max(longest_name, s.name.size());
  const double left = 70, top = 40, bottom = 55;
  const double right = std::max(150.0, 50.0 + 7.0 * static_cast<double>(longest_name));
  const double plot_w = plot.width - 220.0, plot_h = plot.height - top - bottom;
  const double width = left + plot_w + right, height = plot.height;

  const auto tx = [&](double x) { return plot.log2_x ? std::log2(x) : x; };
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  std::set<double> x_values;
  for (const auto& s : plot.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y) || !std::isfinite(x) || (plot.log2_x && x <= 0)) continue;
      x_values.insert(x);
      x_lo = std::min(x_lo, tx(x));
      x_hi = std::max(x_hi, tx(x));
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  if (x_values.empty()) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  if (x_hi == x_lo) x_lo -= 0.5, x_hi += 0.5;
  // A little room so the end points do not sit on the axes.
  const double x_pad = 0.04 * (x_hi - x_lo);
  x_lo -= x_pad;
  x_hi += x_pad;
  // Metrics are non-negative: start the y axis at 0 unless the data go below.
  y_lo = std::min(y_lo, 0.0);
  if (y_hi == y_lo) y_hi = y_lo + 1.0;
  const auto y_ticks = nice_ticks(y_lo, y_hi, 5);
  y_lo = std::min(y_lo, y_ticks.front());
  y_hi = std::max(y_hi, y_ticks.back());

  const auto px = [&](double x) { return left + (tx(x) - x_lo) / (x_hi - x_lo) * plot_w; };
  const auto py = [&](double y) { return top + (1.0 - (y - y_lo) / (y_hi - y_lo)) * plot_h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      static_cast<int>(width), static_cast<int>(height));
  svg +=
      fmt::format("<text x=\"{:.1f}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                  left + plot_w / 2, xml_escape(plot.title));

  // Grid and ticks.
  svg += "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (double y : y_ticks) {
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", left,
                       py(y), left + plot_w, py(y));
  }
  svg += "</g>\n<g fill=\"#333\">\n";
  for (double y : y_ticks) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6,
                       py(y) + 4, format_tick(y));
  }
  std::vector<double> x_ticks;
  if (plot.log2_x || (plot.x_ticks_at_data && x_values.size() <= 8)) {
    x_ticks.assign(x_values.begin(), x_values.end());
  } else {
    for (double x : nice_ticks(x_lo, x_hi, 6)) {
      if (x >= x_lo && x <= x_hi) x_ticks.push_back(x);
    }
  }
  for (double x : x_ticks) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(x),
                       top + plot_h + 18, format_tick(x));
  }
  svg += "</g>\n<g stroke=\"#333\" stroke-width=\"1\">\n";
  for (double x : x_ticks) {
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n",
                       px(x), top + plot_h, top + plot_h + 5);
  }
  // Axes.
  svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", left,
                     top, top + plot_h);
  svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\"/>\n", left,
                     top + plot_h, left + plot_w);
  svg += "</g>\n";
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                     left + plot_w / 2, height - 12,
                     xml_escape(plot.x_label + (plot.log2_x ? " (log2 scale)" : "")));
  svg += fmt::format(
      "<text transform=\"translate(16 {:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
      top + plot_h / 2, xml_escape(plot.y_label));

  // Series and legend.
  constexpr size_t kColours = sizeof(kPalette) / sizeof(kPalette[0]);
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const auto& s = plot.series[i];
    const char* colour = kPalette[i % kColours];
    // Dashes tell series apart once the palette repeats.
    const std::string dash = i >= kColours ? " stroke-dasharray=\"6 3\"" : "";
    std::vector<std::pair<double, double>> pts;
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(x) && std::isfinite(y) && (!plot.log2_x || x > 0)) pts.emplace_back(x, y);
    }
    std::sort(pts.begin(), pts.end());
    std::string coords;
    for (const auto& [x, y] : pts) coords += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    if (!coords.empty()) coords.pop_back();
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"><title>{}</title>"
        "</polyline>\n",
        colour, dash, coords, xml_escape(s.name));
    for (const auto& [x, y] : pts) {
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(x),
                         py(y), colour);
    }
    const double ly = top + 10 + 18.0 * static_cast<double>(i);
    const double lx = left + plot_w + 14;
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        lx, ly, lx + 22, ly, colour, dash);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 28, ly + 4,
                       xml_escape(s.name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace protokv::eval
