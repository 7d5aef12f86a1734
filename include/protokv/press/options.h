// SPDX-License-Identifier: Apache-2.0
#pragma once
// Press options from the CLI: `NAME:key=value,key=value`. Each press reads its options through an
// OptionReader with typed getters (default, range); finish() then rejects every option that no
// getter asked for, so a misspelt or inapplicable option is an error, never silently ignored.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace protokv::press {

// "snapkv:window=8,pool=7" -> {"snapkv", "window=8,pool=7"}.
std::pair<std::string, std::string> split_press_spec(std::string_view spec);

class OptionReader {
 public:
  // Parses "key=value,key=value". Throws Error for an empty key or value, a missing '=', or a
  // key given twice. `press` names the method in messages.
  OptionReader(std::string press, std::string_view options);

  int64_t get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max);
  uint64_t get_seed(const std::string& key, uint64_t fallback);
  double get_double(const std::string& key, double fallback, double min, double max);
  bool get_bool(const std::string& key, bool fallback);
  // The value as given (e.g. a file path; it cannot contain ',').
  std::string get_string(const std::string& key, const std::string& fallback);
  // One of `choices` (the first is not implicitly the default: `fallback` is).
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& choices);

  const std::string& press() const { return press_; }
  bool given(const std::string& key) const { return values_.count(key) != 0; }
  // Throws Error when `key` was given although `reason` makes it meaningless.
  void reject_if_given(const std::string& key, std::string_view reason) const;
  // Throws Error naming the first given option that no getter read, listing the known ones.
  void finish() const;

 private:
  const std::string* raw(const std::string& key);

  std::string press_;
  std::map<std::string, std::string> values_;
  std::set<std::string> known_;
  std::vector<std::string> known_order_;
};

}  // namespace protokv::press
