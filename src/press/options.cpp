// SPDX-License-Identifier: Apache-2.0
#include "protokv/press/options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "protokv/error.h"

namespace protokv::press {

std::pair<std::string, std::string> split_press_spec(std::string_view spec) {
  const auto colon = spec.find(':');
  if (colon == std::string_view::npos) return {std::string(spec), ""};
  return {std::string(spec.substr(0, colon)), std::string(spec.substr(colon + 1))};
}

OptionReader::OptionReader(std::string press, std::string_view options) : press_(std::move(press)) {
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

const std::string* OptionReader::raw(const std::string& key) {
  if (known_.insert(key).second) known_order_.push_back(key);
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

int64_t OptionReader::get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  const std::string* text = raw(key);
  if (text == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0')
    fail("press '{}': option {}={} is not an integer", press_, key, *text);
  if (value < min || value > max)
    fail("press '{}': option {}={} is out of range [{}, {}]", press_, key, *text, min, max);
  return value;
}

uint64_t OptionReader::get_seed(const std::string& key, uint64_t fallback) {
  const std::string* text = raw(key);
  if (text == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0' || (*text)[0] == '-')
    fail("press '{}': option {}={} is not a non-negative integer", press_, key, *text);
  return value;
}

double OptionReader::get_double(const std::string& key, double fallback, double min, double max) {
  const std::string* text = raw(key);
  if (text == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text->c_str(), &end);
  if (errno != 0 || end == text->c_str() || *end != '\0' || !std::isfinite(value))
    fail("press '{}': option {}={} is not a number", press_, key, *text);
  if (value < min || value > max)
    fail("press '{}': option {}={} is out of range [{}, {}]", press_, key, *text, min, max);
  return value;
}

bool OptionReader::get_bool(const std::string& key, bool fallback) {
  const std::string* text = raw(key);
  if (text == nullptr) return fallback;
  if (*text == "1" || *text == "true") return true;
  if (*text == "0" || *text == "false") return false;
  fail("press '{}': option {}={} is not a boolean (0, 1, true, false)", press_, key, *text);
}

std::string OptionReader::get_string(const std::string& key, const std::string& fallback) {
  const std::string* text = raw(key);
  return text == nullptr ? fallback : *text;
}

std::string OptionReader::get_choice(const std::string& key, const std::string& fallback,
                                     const std::vector<std::string>& choices) {
  const std::string* text = raw(key);
  if (text == nullptr) return fallback;
  for (const auto& choice : choices)
    if (*text == choice) return choice;
  fail("press '{}': option {}={} is not one of {}", press_, key, *text, fmt::join(choices, "|"));
}

void OptionReader::reject_if_given(const std::string& key, std::string_view reason) const {
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
