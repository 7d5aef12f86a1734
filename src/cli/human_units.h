// SPDX-License-Identifier: Apache-2.0
#pragma once
// Human-readable counts for subcommand output (sizes: core/units.h).
#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace protokv::cli {

// 260096 -> "260.1K"; decimal units, one decimal.
inline std::string human_count(int64_t n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  return u == 0 ? fmt::format("{}", n) : fmt::format("{:.1f}{}", v, units[u]);
}

}  // namespace protokv::cli
