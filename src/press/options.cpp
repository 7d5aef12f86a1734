// SPDX-License-Identifier: Apache-2.0
#include "protokv/press/options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "protokv/error.h"

namespace protokv::press {

OptionSpec int_option(std::string_view key, int64_t fallback, int64_t min, int64_t max,
                      std::string help, std::string_view reference) {
  return {.key = key,
          .kind = OptionKind::Int,
          .number = static_cast<double>(fallback),
          .min = static_cast<double>(min),
          .max = static_cast<double>(max),
          .help = std::move(help),
          .reference = reference};
}

OptionSpec seed_option(std::string_view key, uint64_t fallback, std::string help) {
  return {.key = key,
          .kind = OptionKind::Seed,
          .number = static_cast<double>(fallback),
          .help = std::move(help)};
}

OptionSpec double_option(std::string_view key, double fallback, double min, double max,
                         std::string help, std::string_view reference) {
  return {.key = key,
          .kind = OptionKind::Double,
          .number = fallback,
          .min = min,
          .max = max,
          .help = std::move(help),
          .reference = reference};
}

OptionSpec bool_option(std::string_view key, bool fallback, std::string help,
                       std::string_view reference) {
  return {.key = key,
          .kind = OptionKind::Bool,
          .number = fallback ? 1.0 : 0.0,
          .help = std::move(help),
          .reference = reference};
}

OptionSpec choice_option(std::string_view key, std::string fallback,
                         std::vector<std::string_view> choices, std::string help,
                         std::string_view reference) {
  return {.key = key,
          .kind = OptionKind::Choice,
          .word = std::move(fallback),
          .choices = std::move(choices),
          .help = std::move(help),
          .reference = reference};
}

OptionSpec text_option(std::string_view key, std::string help) {
  return {.key = key, .kind = OptionKind::Text, .help = std::move(help)};
}

OptionSpec derived(OptionSpec spec, std::string how) {
  spec.derived = std::move(how);
  return spec;
}

std::vector<OptionSpec> concat(std::vector<OptionSpec> a, const std::vector<OptionSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string default_text(const OptionSpec& spec) {
  if (!spec.derived.empty()) return spec.derived;
  switch (spec.kind) {
    case OptionKind::Int:
    case OptionKind::Seed:
      return fmt::format("{}", static_cast<int64_t>(spec.number));
    case OptionKind::Double:
      return fmt::format("{}", spec.number);
    case OptionKind::Bool:
      return spec.number != 0.0 ? "1" : "0";
    case OptionKind::Choice:
      return std::string(spec.word);
    case OptionKind::Text:
      break;
  }
  return spec.word.empty() ? "none" : spec.word;
}

namespace {

// 1073741824 as "2^30": the "no practical limit" bounds read as such.
std::string bound_text(double bound) {
  const auto value = static_cast<int64_t>(bound);
  if (value >= (int64_t{1} << 20) && (value & (value - 1)) == 0)
    return fmt::format("2^{}", std::countr_zero(static_cast<uint64_t>(value)));
  return fmt::format("{}", value);
}

}  // namespace

std::string range_text(const OptionSpec& spec) {
  switch (spec.kind) {
    case OptionKind::Int:
      return fmt::format("{}..{}", bound_text(spec.min), bound_text(spec.max));
    case OptionKind::Double:
      return fmt::format("{}..{}", spec.min, spec.max);
    case OptionKind::Seed:
      return "0..2^64-1";
    case OptionKind::Bool:
      return "0|1";
    case OptionKind::Choice:
      return fmt::format("{}", fmt::join(spec.choices, "|"));
    case OptionKind::Text:
      break;
  }
  return "path";
}

std::pair<std::string, std::string> split_press_spec(std::string_view spec) {
  const auto colon = spec.find(':');
  if (colon == std::string_view::npos) return {std::string(spec), ""};
  return {std::string(spec.substr(0, colon)), std::string(spec.substr(colon + 1))};
}

OptionReader::OptionReader(std::string press, std::string_view options,
                           std::vector<OptionSpec> schema)
    : press_(std::move(press)), schema_(std::move(schema)) {
  size_t start = 0;
  while (start <= options.size() && !options.empty()) {
    const size_t comma = options.find(',', start);
    const std::string_view item = options.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      fail("press '{}': malformed option '{}' (expected key=value)", press_, item);
    const std::string key(item.substr(0, eq));
    if (values_.count(key) != 0) fail("press '{}': option '{}' given twice", press_, key);
    values_[key] = std::string(item.substr(eq + 1));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
}

const OptionSpec& OptionReader::row(std::string_view key, OptionKind kind) const {
  const auto it = std::find_if(schema_.begin(), schema_.end(),
                               [&](const OptionSpec& spec) { return spec.key == key; });
  PROTOKV_CHECK(it != schema_.end() && it->kind == kind,
                "press '{}' reads option '{}', which its schema does not declare as this type",
                press_, key);
  return *it;
}

const std::string* OptionReader::raw(std::string_view key) {
  std::string name(key);
  if (known_.insert(name).second) known_order_.push_back(name);
  const auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

int64_t OptionReader::parse_int(const OptionSpec& spec, const std::string& text) const {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0')
    fail("press '{}': option {}={} is not an integer", press_, spec.key, text);
  if (static_cast<double>(value) < spec.min || static_cast<double>(value) > spec.max)
    fail("press '{}': option {}={} is out of range [{}, {}]", press_, spec.key, text,
         static_cast<int64_t>(spec.min), static_cast<int64_t>(spec.max));
  return value;
}

double OptionReader::parse_double(const OptionSpec& spec, const std::string& text) const {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || *end != '\0' || !std::isfinite(value))
    fail("press '{}': option {}={} is not a number", press_, spec.key, text);
  if (value < spec.min || value > spec.max)
    fail("press '{}': option {}={} is out of range [{}, {}]", press_, spec.key, text, spec.min,
         spec.max);
  return value;
}

const OptionSpec& OptionReader::fixed_row(std::string_view key, OptionKind kind) const {
  const OptionSpec& spec = row(key, kind);
  PROTOKV_CHECK(spec.derived.empty(), "press '{}': option '{}' has a derived default", press_, key);
  return spec;
}

template <class T, class Parse>
T OptionReader::read(std::string_view key, OptionKind kind, T fallback, Parse parse) {
  const OptionSpec& spec = row(key, kind);
  const std::string* text = raw(key);
  return text == nullptr ? fallback : parse(spec, *text);
}

int64_t OptionReader::get_int(std::string_view key) {
  return get_int(key, static_cast<int64_t>(fixed_row(key, OptionKind::Int).number));
}

int64_t OptionReader::get_int(std::string_view key, int64_t fallback) {
  return read(
      key, OptionKind::Int, fallback,
      [this](const OptionSpec& spec, const std::string& text) { return parse_int(spec, text); });
}

uint64_t OptionReader::get_seed(std::string_view key) {
  const auto fallback = static_cast<uint64_t>(row(key, OptionKind::Seed).number);
  return read(
      key, OptionKind::Seed, fallback, [this](const OptionSpec& spec, const std::string& text) {
        errno = 0;
        char* end = nullptr;
        const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
        if (errno != 0 || end == text.c_str() || *end != '\0' || text[0] == '-')
          fail("press '{}': option {}={} is not a non-negative integer", press_, spec.key, text);
        return static_cast<uint64_t>(value);
      });
}

double OptionReader::get_double(std::string_view key) {
  return get_double(key, fixed_row(key, OptionKind::Double).number);
}

double OptionReader::get_double(std::string_view key, double fallback) {
  return read(
      key, OptionKind::Double, fallback,
      [this](const OptionSpec& spec, const std::string& text) { return parse_double(spec, text); });
}

bool OptionReader::get_bool(std::string_view key) {
  const bool fallback = row(key, OptionKind::Bool).number != 0.0;
  return read(key, OptionKind::Bool, fallback,
              [this](const OptionSpec& spec, const std::string& text) {
                if (text == "1" || text == "true") return true;
                if (text == "0" || text == "false") return false;
                fail("press '{}': option {}={} is not a boolean (0, 1, true, false)", press_,
                     spec.key, text);
              });
}

std::string OptionReader::get_text(std::string_view key) {
  std::string fallback = row(key, OptionKind::Text).word;
  return read(key, OptionKind::Text, std::move(fallback),
              [](const OptionSpec&, const std::string& text) { return text; });
}

std::string OptionReader::get_choice(std::string_view key) {
  return get_choice(key, fixed_row(key, OptionKind::Choice).word);
}

std::string OptionReader::get_choice(std::string_view key, std::string_view fallback) {
  return read(key, OptionKind::Choice, std::string(fallback),
              [this](const OptionSpec& spec, const std::string& text) {
                for (std::string_view choice : spec.choices)
                  if (text == choice) return text;
                fail("press '{}': option {}={} is not one of {}", press_, spec.key, text,
                     fmt::join(spec.choices, "|"));
              });
}

void OptionReader::reject_if_given(std::string_view key, std::string_view reason) const {
  if (given(key)) fail("press '{}': option '{}' contradicts {}", press_, key, reason);
}

void OptionReader::finish() const {
  for (const auto& [key, value] : values_) {
    if (known_.count(key) != 0) continue;
    if (known_order_.empty()) fail("press '{}' takes no options (got '{}')", press_, key);
    fail("press '{}': unknown option '{}' (options: {})", press_, key,
         fmt::join(known_order_, ", "));
  }
}

}  // namespace protokv::press
