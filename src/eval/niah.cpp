// SPDX-License-Identifier: Apache-2.0
#include "eval/niah.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/text.h"
#include "eval/longctx_words.h"
#include "eval/svg_plot.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {
namespace {

// Repeats `unit` (joined by `separator` tokens) until at least `min_tokens` tokens.
std::vector<int32_t> repeat_tokens(const std::vector<int32_t>& unit,
                                   const std::vector<int32_t>& separator, int64_t min_tokens) {
  std::vector<int32_t> out = unit;
  while (static_cast<int64_t>(out.size()) < min_tokens) {
    out.insert(out.end(), separator.begin(), separator.end());
    out.insert(out.end(), unit.begin(), unit.end());
  }
  return out;
}

}  // namespace

std::string fill_niah_template(const std::string& templ, const std::string& key,
                               const std::string& value) {
  return text::replace_all(text::replace_all(templ, "{key}", key), "{value}", value);
}

std::vector<int64_t> default_niah_lengths(int64_t context_length, int max_new_tokens) {
  const int64_t hi = context_length - max_new_tokens;
  PROTOKV_CHECK(hi >= 64, "the model's context ({} tokens) is too short for a haystack",
                context_length);
  const int64_t lo = std::min<int64_t>(512, hi / 4);
  const int doublings = static_cast<int>(std::floor(std::log2(static_cast<double>(hi) / lo)));
  const int steps = std::clamp(doublings + 1, 4, 8);
  std::vector<int64_t> lengths;
  for (int s = 0; s < steps; ++s) {
    const double t = static_cast<double>(s) / (steps - 1);
    const auto len = static_cast<int64_t>(std::llround(lo * std::pow(double(hi) / lo, t)));
    if (lengths.empty() || len > lengths.back()) lengths.push_back(len);
  }
  lengths.back() = hi;
  return lengths;
}

std::vector<double> default_niah_depths() {
  std::vector<double> d;
  for (int i = 0; i <= 10; ++i) d.push_back(10.0 * i);
  return d;
}

std::vector<int32_t> haystack_from_text(const Tokenizer& tokenizer, const std::string& text,
                                        int64_t min_tokens, const std::string& what) {
  PROTOKV_CHECK(text.find_first_not_of(" \t\r\n") != std::string::npos,
                "haystack {} is empty: give a text file with some content", what);
  PROTOKV_CHECK(text::is_valid_utf8(text), "haystack {} is not valid UTF-8 text", what);
  // Tokenizing a huge file is wasted work: a prefix of ~8 bytes per token needed is plenty.
  const size_t max_bytes = static_cast<size_t>(std::max<int64_t>(min_tokens, 64)) * 8;
  std::string prefix = text.substr(0, std::min(text.size(), max_bytes));
  // Do not cut inside a UTF-8 sequence.
  while (!prefix.empty() && (static_cast<unsigned char>(prefix.back()) & 0xC0) == 0x80)
    prefix.pop_back();
  if (!prefix.empty() && static_cast<unsigned char>(prefix.back()) >= 0xC0) prefix.pop_back();
  const std::vector<int32_t> unit = tokenizer.encode(prefix, /*add_bos=*/false);
  PROTOKV_CHECK(!unit.empty(), "haystack {} has no tokens", what);
  return repeat_tokens(unit, {}, min_tokens);
}

std::vector<int32_t> haystack_noise(const Tokenizer& tokenizer, int64_t min_tokens) {
  const std::vector<int32_t> unit = tokenizer.encode(kRulerNoise, /*add_bos=*/false);
  const std::vector<int32_t> newline = tokenizer.encode("\n", false);
  // encode("\n") carries the dummy-prefix space first; keep only the newline itself.
  const std::vector<int32_t> separator(newline.end() - 1, newline.end());
  return repeat_tokens(unit, separator, min_tokens);
}

std::vector<LongctxSample> make_niah_samples(const Tokenizer& tokenizer,
                                             const std::vector<int32_t>& haystack,
                                             const NiahOptions& options) {
  PROTOKV_CHECK(!options.lengths.empty() && !options.depths.empty(),
                "NIAH needs at least one length and one depth");
  PROTOKV_CHECK(options.needle.find("{value}") != std::string::npos,
                "the needle must contain {{value}} (the answer), got '{}'", options.needle);
  for (double d : options.depths)
    PROTOKV_CHECK(d >= 0.0 && d <= 100.0, "depth {} is outside [0, 100]", d);
  const auto& keys = adjective_noun_keys();
  std::vector<LongctxSample> samples;
  for (size_t li = 0; li < options.lengths.size(); ++li) {
    const int64_t length = options.lengths[li];
    for (size_t di = 0; di < options.depths.size(); ++di) {
      const double depth = options.depths[di];
      for (int s = 0; s < options.samples_per_cell; ++s) {
        // Key and value depend on the sample index only, so every cell asks the same facts and
        // cells differ only in length and depth.
        std::mt19937_64 rng(options.seed * 1000003ULL + static_cast<uint64_t>(s));
        const std::string& key =
            keys[static_cast<size_t>(uniform_int(rng, 0, static_cast<int64_t>(keys.size()) - 1))];
        const std::string value = random_number_text(rng);
        LongctxSample sample;
        sample.id = fmt::format("L{}_D{:g}_S{}", length, depth, s);
        sample.answers = {value};
        sample.max_new_tokens = options.max_new_tokens;
        sample.meta = {{"length", length},  {"depth", depth}, {"sample", s},   {"length_index", li},
                       {"depth_index", di}, {"key", key},     {"value", value}};
        const std::vector<int32_t> needle =
            tokenizer.encode(fill_niah_template(options.needle, key, value), false);
        sample.question = tokenizer.encode(fill_niah_template(options.question, key, value), false);
        const int64_t n = length - 1 - static_cast<int64_t>(needle.size() + sample.question.size());
        if (n < 1) {
          sample.error = fmt::format(
              "length {} leaves no room for a haystack (needle {} + question {} tokens)", length,
              needle.size(), sample.question.size());
          samples.push_back(std::move(sample));
          continue;
        }
        PROTOKV_CHECK(static_cast<int64_t>(haystack.size()) >= n,
                      "haystack has {} tokens, {} needed", haystack.size(), n);
        auto at = static_cast<int64_t>(std::floor(static_cast<double>(n) * depth / 100.0));
        if (at < n) {
          // Back to a sentence boundary, as the original inserts after the previous period.
          while (at > 0 && tokenizer.decode(-1, haystack[static_cast<size_t>(at - 1)]).find('.') ==
                               std::string::npos)
            --at;
        }
        sample.meta["needle_token"] = 1 + at;
        sample.context.reserve(static_cast<size_t>(1 + n) + needle.size());
        sample.context.push_back(tokenizer.bos_id());
        sample.context.insert(sample.context.end(), haystack.begin(), haystack.begin() + at);
        sample.context.insert(sample.context.end(), needle.begin(), needle.end());
        sample.context.insert(sample.context.end(), haystack.begin() + at, haystack.begin() + n);
        samples.push_back(std::move(sample));
      }
    }
  }
  return samples;
}

double niah_score(const LongctxSample& sample, const std::string& prediction) {
  return !sample.answers.empty() && prediction.find(sample.answers[0]) != std::string::npos ? 1.0
                                                                                            : 0.0;
}

std::vector<std::vector<double>> niah_grid(const std::vector<LongctxRecord>& records,
                                           const std::string& run, const NiahOptions& options) {
  const size_t nl = options.lengths.size(), nd = options.depths.size();
  std::vector<std::vector<double>> sum(nl, std::vector<double>(nd, 0.0));
  std::vector<std::vector<int>> count(nl, std::vector<int>(nd, 0));
  for (const auto& r : records) {
    if (r.run != run || !r.error.empty()) continue;
    const auto li = r.meta.value("length_index", size_t{0});
    const auto di = r.meta.value("depth_index", size_t{0});
    if (li >= nl || di >= nd) continue;
    sum[li][di] += r.score;
    ++count[li][di];
  }
  for (size_t l = 0; l < nl; ++l)
    for (size_t d = 0; d < nd; ++d)
      sum[l][d] =
          count[l][d] > 0 ? sum[l][d] / count[l][d] : std::numeric_limits<double>::quiet_NaN();
  return sum;
}

namespace {

// Accuracy 0 -> red, 0.5 -> yellow, 1 -> green (the papers' colour scale).
std::string accuracy_colour(double a) {
  if (!std::isfinite(a)) return "#dddddd";
  a = std::clamp(a, 0.0, 1.0);
  struct Rgb {
    double r, g, b;
  };
  const Rgb red{215, 48, 39}, yellow{254, 224, 139}, green{26, 152, 80};
  const Rgb& from = a < 0.5 ? red : yellow;
  const Rgb& to = a < 0.5 ? yellow : green;
  const double t = a < 0.5 ? a / 0.5 : (a - 0.5) / 0.5;
  auto mix = [t](double x, double y) { return static_cast<int>(std::lround(x + (y - x) * t)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(from.r, to.r), mix(from.g, to.g),
                     mix(from.b, to.b));
}

}  // namespace

std::string render_niah_heatmap(const std::vector<std::vector<double>>& grid,
                                const NiahOptions& options, const std::string& title) {
  const int nl = static_cast<int>(options.lengths.size());
  const int nd = static_cast<int>(options.depths.size());
  const int cell_w = std::max(36, 560 / std::max(nl, 1)), cell_h = 28;
  const int left = 70, top = 40, bottom = 50, legend_w = 80;
  const int width = left + nl * cell_w + legend_w, height = top + nd * cell_h + bottom;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n",
      width, height);
  svg += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"14\" text-anchor=\"middle\">{}</text>\n",
                     left + nl * cell_w / 2, xml_escape(title));
  for (int l = 0; l < nl; ++l) {
    for (int d = 0; d < nd; ++d) {
      const double a = grid[static_cast<size_t>(l)][static_cast<size_t>(d)];
      const int x = left + l * cell_w, y = top + d * cell_h;
      svg += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"white\"/>\n", x,
          y, cell_w, cell_h, accuracy_colour(a));
      svg +=
          fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>\n",
                      x + cell_w / 2, y + cell_h / 2 + 4,
                      std::isfinite(a) ? fmt::format("{:.0f}", 100.0 * a) : std::string("-"));
    }
  }
  for (int d = 0; d < nd; ++d)
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:g}%</text>\n", left - 6,
                       top + d * cell_h + cell_h / 2 + 4, options.depths[static_cast<size_t>(d)]);
  for (int l = 0; l < nl; ++l)
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       left + l * cell_w + cell_w / 2, top + nd * cell_h + 16,
                       options.lengths[static_cast<size_t>(l)]);
  svg +=
      fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">context length (tokens)</text>\n",
                  left + nl * cell_w / 2, top + nd * cell_h + 38);
  svg += fmt::format(
      "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">needle "
      "depth (%)</text>\n",
      top + nd * cell_h / 2, top + nd * cell_h / 2);
  // Colour legend: 0% .. 100% accuracy.
  const int lx = left + nl * cell_w + 24, steps = 10, lh = nd * cell_h / steps;
  for (int i = 0; i < steps; ++i) {
    const double a = 1.0 - (i + 0.5) / steps;
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"16\" height=\"{}\" fill=\"{}\"/>\n", lx,
                       top + i * lh, lh, accuracy_colour(a));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\">100%</text>\n", lx + 20, top + 8);
  svg += fmt::format("<text x=\"{}\" y=\"{}\">0%</text>\n", lx + 20, top + steps * lh);
  svg += fmt::format("<text x=\"{}\" y=\"{}\">accuracy</text>\n", lx - 4, top + steps * lh + 16);
  svg += "</svg>\n";
  return svg;
}

}  // namespace protokv::eval
