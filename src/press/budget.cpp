// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "protokv/error.h"
#include "protokv/press.h"

namespace protokv {

int64_t Budget::resolve(int64_t n_tokens) const {
  if (entries > 0) return entries;
  return std::max<int64_t>(1,
                           static_cast<int64_t>(std::floor(static_cast<double>(n_tokens) * ratio)));
}

std::string Budget::to_string() const {
  if (entries > 0) return fmt::format("{}", entries);
  return fmt::format("ratio {}", ratio);
}

void Budget::validate() const {
  if (entries > 0 && ratio > 0.0)
    fail("budget and ratio are mutually exclusive: give one, not both");
  if (entries < 0) fail("budget must be a positive number of entries, got {}", entries);
  if (entries == 0 && !(ratio > 0.0 && ratio <= 1.0))
    fail("ratio must be in (0, 1], got {}", ratio);
}

}  // namespace protokv
