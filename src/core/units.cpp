// SPDX-License-Identifier: Apache-2.0
#include "core/units.h"

#include <fmt/format.h>

#include <cmath>

namespace protokv {

std::string format_bytes(double bytes, int decimals) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (std::abs(bytes) >= 1024.0 && unit < 5) {
    bytes /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.{}f} {}", bytes, decimals, kUnits[unit]);
}

}  // namespace protokv
