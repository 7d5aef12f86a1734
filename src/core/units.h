// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sizes as people read them, for every message, table and log line (one rule in one place).
#include <string>

namespace protokv {

// Binary units with `decimals` digits after the point: 1536 -> "1.5 KiB", 47185920 -> "45.0 MiB"
// (decimals 2: "45.00 MiB"); below 1 KiB whole bytes, "512 B".
std::string format_bytes(double bytes, int decimals = 1);

}  // namespace protokv
