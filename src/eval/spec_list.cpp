// SPDX-License-Identifier: Apache-2.0
#include "eval/spec_list.h"

#include <charconv>

#include "protokv/error.h"

namespace protokv::eval {
namespace {

std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return parts;
}

// Every piece of `text` a number accepted by `in_range`; Error naming the list otherwise.
template <class InRange>
std::vector<double> parse_number_list(std::string_view text, std::string_view what,
                                      std::string_view expected, InRange in_range) {
  std::vector<double> values;
  for (std::string_view piece : split_commas(text)) {
    double v = 0.0;
    const auto [end, ec] = std::from_chars(piece.data(), piece.data() + piece.size(), v);
    PROTOKV_CHECK(ec == std::errc() && end == piece.data() + piece.size() && in_range(v),
                  "{}: '{}' is not {} (in '{}')", what, piece, expected, text);
    values.push_back(v);
  }
  return values;
}

}  // namespace

std::vector<std::string> split_press_specs(const std::vector<std::string>& values) {
  std::vector<std::string> specs;
  for (const auto& value : values) {
    bool first_of_value = true;
    for (std::string_view piece : split_commas(value)) {
      PROTOKV_CHECK(!piece.empty(), "empty item in press list '{}'", value);
      const bool is_option =
          piece.find('=') != std::string_view::npos && piece.find(':') == std::string_view::npos;
      if (is_option) {
        PROTOKV_CHECK(!first_of_value && specs.back().find(':') != std::string::npos,
                      "press option '{}' in '{}' does not follow a press with options "
                      "(write NAME:key=value,key=value)",
                      piece, value);
        specs.back() += ',';
        specs.back() += piece;
      } else {
        specs.emplace_back(piece);
      }
      first_of_value = false;
    }
  }
  return specs;
}

std::vector<int64_t> parse_positive_list(std::string_view text, std::string_view what) {
  std::vector<int64_t> values;
  for (std::string_view piece : split_commas(text)) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(piece.data(), piece.data() + piece.size(), v);
    PROTOKV_CHECK(ec == std::errc() && end == piece.data() + piece.size() && v > 0,
                  "{}: '{}' is not a positive integer (in '{}')", what, piece, text);
    values.push_back(v);
  }
  return values;
}

std::vector<double> parse_ratio_list(std::string_view text, std::string_view what) {
  return parse_number_list(text, what, "a number in (0, 1]",
                           [](double r) { return r > 0.0 && r <= 1.0; });
}

std::vector<double> parse_percent_list(std::string_view text, std::string_view what) {
  return parse_number_list(text, what, "a percentage in [0, 100]",
                           [](double p) { return p >= 0.0 && p <= 100.0; });
}

std::vector<std::string> split_names(std::string_view text) {
  std::vector<std::string> names;
  for (std::string_view piece : split_commas(text)) {
    PROTOKV_CHECK(!piece.empty(), "empty name in list '{}'", text);
    names.emplace_back(piece);
  }
  return names;
}

}  // namespace protokv::eval
