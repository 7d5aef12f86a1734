// SPDX-License-Identifier: Apache-2.0
#pragma once
// Press options: `NAME:key=value,key=value`. Every press declares its options once, as a schema
// (one OptionSpec row each: key, type, default, range or choices, help, paper reference); the
// OptionReader parses the values against it (its getters take the default and the range from the
// row), `--help`, the docs tables (docs/methods.md) and the Python classes are generated from the
// same rows, and finish() rejects every option that no getter asked for, so a misspelt or
// inapplicable option is an error, never silently ignored.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace protokv::press {

enum class OptionKind { Int, Seed, Double, Bool, Choice, Text };

// One option of one press (or allocator).
struct OptionSpec {
  std::string_view key;
  OptionKind kind = OptionKind::Int;
  // The default: a number (Int, Seed, Double; Bool as 0 or 1) or a word (Choice, Text). A default
  // the press computes from other values (h2o's recent = B/2) says how in `derived` instead; the
  // press then passes the computed value to the getter.
  double number = 0;
  std::string word = {};
  std::string derived = {};
  double min = 0, max = 0;  // Int, Double: the accepted range, inclusive
  std::vector<std::string_view> choices = {};
  std::string help = {};
  std::string_view reference = {};  // the paper and equation it comes from, when it has one
};

// Rows, written as tables beside each press: int_option("window", 8, 1, 4096, "...").
OptionSpec int_option(std::string_view key, int64_t fallback, int64_t min, int64_t max,
                      std::string help, std::string_view reference = {});
OptionSpec seed_option(std::string_view key, uint64_t fallback, std::string help);
OptionSpec double_option(std::string_view key, double fallback, double min, double max,
                         std::string help, std::string_view reference = {});
OptionSpec bool_option(std::string_view key, bool fallback, std::string help,
                       std::string_view reference = {});
OptionSpec choice_option(std::string_view key, std::string fallback,
                         std::vector<std::string_view> choices, std::string help,
                         std::string_view reference = {});
OptionSpec text_option(std::string_view key, std::string help);
// The row with a computed default, described by `how` ("B/2", "auto", "off").
OptionSpec derived(OptionSpec spec, std::string how);
// a then b (shared groups of rows: the window-score options, an allocator's).
std::vector<OptionSpec> concat(std::vector<OptionSpec> a, const std::vector<OptionSpec>& b);

// How a row's default, range and type read in help and docs: "8", "B/2"; "1..4096",
// "max|avg", "0|1".
std::string default_text(const OptionSpec& spec);
std::string range_text(const OptionSpec& spec);

// "snapkv:window=8,pool=7" -> {"snapkv", "window=8,pool=7"}.
std::pair<std::string, std::string> split_press_spec(std::string_view spec);

class OptionReader {
 public:
  // Parses "key=value,key=value". Throws Error for an empty key or value, a missing '=', or a
  // key given twice. `press` names the method in messages; `schema` holds every option a getter
  // may read.
  OptionReader(std::string press, std::string_view options, std::vector<OptionSpec> schema);

  // Each getter returns the given value, checked against the row's type and range, or the row's
  // default. The two-argument forms are for rows with a derived default: `fallback` is the value
  // the press computed.
  int64_t get_int(std::string_view key);
  int64_t get_int(std::string_view key, int64_t fallback);
  uint64_t get_seed(std::string_view key);
  double get_double(std::string_view key);
  double get_double(std::string_view key, double fallback);
  bool get_bool(std::string_view key);
  // The value as given (e.g. a file path; it cannot contain ',').
  std::string get_text(std::string_view key);
  std::string get_choice(std::string_view key);
  std::string get_choice(std::string_view key, std::string_view fallback);

  const std::string& press() const { return press_; }
  const std::vector<OptionSpec>& schema() const { return schema_; }
  bool given(std::string_view key) const { return values_.count(std::string(key)) != 0; }
  // Throws Error when `key` was given although `reason` makes it meaningless.
  void reject_if_given(std::string_view key, std::string_view reason) const;
  // Throws Error naming the first given option that no getter read, listing the known ones.
  void finish() const;

 private:
  // The row of `key`, which must be of `kind` (a press reading an undeclared option is a bug).
  const OptionSpec& row(std::string_view key, OptionKind kind) const;
  // The same row, whose default must be fixed (not derived()).
  const OptionSpec& fixed_row(std::string_view key, OptionKind kind) const;
  const std::string* raw(std::string_view key);
  // The text given for `key` (a row of `kind`) as parse(row, text) reads it, or `fallback` when
  // it was not given: every getter's "row, raw, parse or default" (defined in options.cpp).
  template <class T, class Parse>
  T read(std::string_view key, OptionKind kind, T fallback, Parse parse);
  int64_t parse_int(const OptionSpec& spec, const std::string& text) const;
  double parse_double(const OptionSpec& spec, const std::string& text) const;

  std::string press_;
  std::vector<OptionSpec> schema_;
  std::map<std::string, std::string> values_;
  std::set<std::string> known_;
  std::vector<std::string> known_order_;
};

}  // namespace protokv::press
