#pragma once
// Human-readable sizes and counts for subcommand output.
#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace protokv::cli {

// 1536 -> "1.5 KiB"; binary units, one decimal.
inline std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

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
