// SPDX-License-Identifier: Apache-2.0
// core/units.h: the one byte formatter every message, table and log line uses.
#include "core/units.h"

#include <gtest/gtest.h>

namespace protokv {
namespace {

TEST(FormatBytes, BinaryUnitsWithTheAskedDecimals) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(47185920), "45.0 MiB");
  EXPECT_EQ(format_bytes(47185920, 2), "45.00 MiB");
  EXPECT_EQ(format_bytes(3.0 * (1 << 30)), "3.0 GiB");
  EXPECT_EQ(format_bytes(1025.0 * (1 << 30)), "1.0 TiB");
  EXPECT_EQ(format_bytes(1100.0 * (uint64_t{1} << 30), 2), "1.07 TiB");
  EXPECT_EQ(format_bytes(2.0 * 1024 * 1024 * 1024 * 1024 * 1024 * 1024), "2048.0 PiB");
}

}  // namespace
}  // namespace protokv
