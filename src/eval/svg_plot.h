// SPDX-License-Identifier: Apache-2.0
#pragma once
// Minimal SVG line charts for reports: one polyline per series, axes with ticks, a legend.
#include <string>
#include <utility>
#include <vector>

namespace protokv::eval {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite y values are skipped
};

struct LinePlot {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;  // budgets: ticks at the data's x values, spaced by log2
  // Linear x: ticks at the data's x values when there are at most 8 of them (budgets, lengths),
  // else evenly spaced round values; false: always the round values (measured shares).
  bool x_ticks_at_data = true;
  std::vector<PlotSeries> series;
  int width = 640;
  int height = 400;
};

// A complete, standalone SVG document.
std::string render_svg(const LinePlot& plot);

// Escapes &, <, >, " for SVG text and attributes.
std::string xml_escape(const std::string& text);

}  // namespace protokv::eval
