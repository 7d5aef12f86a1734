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

}  // namespace protokv::eval
