// SPDX-License-Identifier: Apache-2.0
// Reports: aligned tables, SVG plots, command-line lists.
#include <gtest/gtest.h>

#include <sstream>

#include "eval/report/table.h"
#include "eval/spec_list.h"
#include "eval/svg_plot.h"
#include "protokv/error.h"

namespace protokv::eval {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Table, AlignsColumns) {
  Table table;
  table.add_column("press", Table::Align::kLeft);
  table.add_column("KL");
  table.add_row({"snapkv", "0.5"});
  table.add_row({"h2o", "12.25"});
  EXPECT_EQ(table.render(),
            "press      KL\n"
            "------  -----\n"
            "snapkv    0.5\n"
            "h2o     12.25\n");
  EXPECT_THROW(table.add_row({"one"}), Error);
}

TEST(Table, CountsUtf8CodePointsAsOneColumn) {
  EXPECT_EQ(display_width("±std"), 4u);
  Table table;
  table.add_column("±std");
  table.add_row({"1"});
  EXPECT_EQ(table.render(), "±std\n----\n   1\n");
}

LinePlot example_plot() {
  LinePlot plot;
  plot.title = "KL <mean> & more";
  plot.x_label = "budget";
  plot.y_label = "KL";
  plot.log2_x = true;
  plot.series.push_back({"snapkv", {{16, 0.5}, {32, 0.25}, {64, 0.1}}});
  plot.series.push_back({"protokv:prototypes=lsh", {{16, 0.4}, {32, NAN}, {64, 0.05}}});
  return plot;
}

TEST(SvgPlot, IsAWellFormedDocumentWithOnePolylinePerSeries) {
  const std::string svg = render_svg(example_plot());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(svg.find("</svg>") + 7, svg.size());  // "</svg>\n" closes the document
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "</polyline>"), 2u);
  // Legend names, escaped title.
  EXPECT_NE(svg.find(">snapkv</text>"), std::string::npos);
  EXPECT_NE(svg.find(">protokv:prototypes=lsh</text>"), std::string::npos);
  EXPECT_NE(svg.find("KL &lt;mean&gt; &amp; more"), std::string::npos);
  // Every opened <g> is closed, no raw '&' outside entities.
  EXPECT_EQ(count(svg, "<g "), count(svg, "</g>"));
  for (size_t at = svg.find('&'); at != std::string::npos; at = svg.find('&', at + 1)) {
    const std::string rest = svg.substr(at, 6);
    EXPECT_TRUE(rest.rfind("&amp;", 0) == 0 || rest.rfind("&lt;", 0) == 0 ||
                rest.rfind("&gt;", 0) == 0 || rest.rfind("&quot;", 0) == 0)
        << rest;
  }
}

// The values of every points="..." attribute, as (x, y) pairs.
std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  const std::string key = "points=\"";
  for (size_t at = svg.find(key); at != std::string::npos; at = svg.find(key, at + 1)) {
    const size_t begin = at + key.size();
    std::stringstream ss(svg.substr(begin, svg.find('"', begin) - begin));
    std::vector<std::pair<double, double>> points;
    double x = 0, y = 0;
    char comma = 0;
    while (ss >> x >> comma >> y) points.emplace_back(x, y);
    lines.push_back(points);
  }
  return lines;
}

TEST(SvgPlot, SkipsNonFiniteValuesAndPlacesBudgetsOnALog2Axis) {
  const std::string svg = render_svg(example_plot());
  // The NaN point of the second series is dropped: 2 points, 3 for the first series.
  const auto lines = polylines(svg);
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_EQ(lines[0].size(), 3u);
  EXPECT_EQ(lines[1].size(), 2u);
  // Ticks at the budgets themselves; 16 → 32 → 64 equally spaced on a log2 axis.
  for (const char* tick : {">16</text>", ">32</text>", ">64</text>"}) {
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  }
  const double x16 = lines[0][0].first, x32 = lines[0][1].first, x64 = lines[0][2].first;
  EXPECT_NEAR(x32 - x16, x64 - x32, 0.2);
  EXPECT_GT(x32, x16);
  // Larger values are drawn higher (smaller SVG y).
  EXPECT_LT(lines[0][0].second, lines[0][2].second);
}

TEST(SvgPlot, EmptyPlotStillRenders) {
  LinePlot plot;
  plot.title = "nothing";
  const std::string svg = render_svg(plot);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 0u);
}

TEST(SpecList, SplitsPressesButKeepsOptionsTogether) {
  EXPECT_EQ(split_press_specs({"full,snapkv,protokv:chunks=64,lsh_bits=2,h2o"}),
            (std::vector<std::string>{"full", "snapkv", "protokv:chunks=64,lsh_bits=2", "h2o"}));
  EXPECT_EQ(
      split_press_specs({"protokv:prototypes=chunk,protokv:prototypes=lsh", "adakv"}),
      (std::vector<std::string>{"protokv:prototypes=chunk", "protokv:prototypes=lsh", "adakv"}));
  EXPECT_THROW(split_press_specs({"snapkv,,h2o"}), Error);
  EXPECT_THROW(split_press_specs({"window=8,snapkv"}), Error);
  EXPECT_THROW(split_press_specs({"snapkv,window=8"}), Error);  // snapkv has no ':'
}

TEST(SpecList, ParsesPositiveIntegerLists) {
  EXPECT_EQ(parse_positive_list("16,32,64", "--budget"), (std::vector<int64_t>{16, 32, 64}));
  EXPECT_THROW(parse_positive_list("16,x", "--budget"), Error);
  EXPECT_THROW(parse_positive_list("0", "--budget"), Error);
  EXPECT_THROW(parse_positive_list("-4", "--budget"), Error);
  EXPECT_THROW(parse_positive_list("", "--budget"), Error);
  EXPECT_THROW(parse_positive_list("8,", "--budget"), Error);
}

}  // namespace
}  // namespace protokv::eval
