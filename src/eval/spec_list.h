// SPDX-License-Identifier: Apache-2.0
#pragma once
// Parsing of comma-separated lists on the command line.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace protokv::eval {

// Splits "full,snapkv,protokv:chunks=64,lsh_bits=2,h2o" into press specs. A piece with '=' but
// no ':' is another option of the previous spec (press names never contain '='), so
// "protokv:chunks=64,lsh_bits=2" stays one spec. Several --press flags may be given: each value
// is split and the results are concatenated. Throws Error on an empty item or a stray option.
std::vector<std::string> split_press_specs(const std::vector<std::string>& values);

// "16,32,64" -> {16, 32, 64}; every value a positive integer. Throws Error otherwise.
std::vector<int64_t> parse_positive_list(std::string_view text, std::string_view what);
// "0.1,0.25" -> {0.1, 0.25}; each in (0, 1]. Throws Error otherwise, naming the list `what` (the
// CLI passes its flag).
std::vector<double> parse_ratio_list(std::string_view text, std::string_view what = "ratio");
// "0,10,50" -> {0, 10, 50}; each a percentage in [0, 100].
std::vector<double> parse_percent_list(std::string_view text, std::string_view what);
// "a,b" -> {"a", "b"}; an empty name is an error.
std::vector<std::string> split_names(std::string_view text);

}  // namespace protokv::eval
