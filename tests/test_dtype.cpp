// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/error.h"

namespace protokv {
namespace {

TEST(DType, F16RoundTripsExactlyRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(DType, F16ConversionMatchesAllHalfBitPatterns) {
  // Every finite half converts to f32 and back to itself.
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00u) == 0x7c00u) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(h)), h) << bits;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: rounds to even (1).
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
}

TEST(DType, Bf16KeepsUpperBitsWithRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.0f)), -3.0f);
  EXPECT_NEAR(bf16_to_f32(f32_to_bf16(3.14159f)), 3.14159f, 0.01f);
}

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(DType, F16KnownBitPatterns) {
  // IEEE 754 binary16: sign 1, exponent 5 (bias 15), mantissa 10.
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(0.5f), 0x3800);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);               // largest finite half
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);               // below the midpoint to 2^16: stays finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);               // the midpoint rounds to even: infinity
  EXPECT_EQ(f32_to_f16(1e9f), 0x7C00);                   // overflow
  EXPECT_EQ(f32_to_f16(-1e9f), 0xFC00);                  //
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);     // half of it: tie to even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -26)), 0x0001);     // 0.75 of it: rounds up
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 of it: tie to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(5.0f, -25)), 0x0002);     // 2.5 of it: tie to even (2)
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7C00);
  const uint16_t nan = f32_to_f16(NAN);
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x8400), -std::ldexp(1.0f, -14));
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_f32(0xFC00), -INFINITY);
}

TEST(DType, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  // 0x3F80'8000 lies exactly between 0x3F80 and 0x3F81: the tie goes to the even 0x3F80.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);
  // 0x3F81'8000 lies exactly between 0x3F81 and 0x3F82: the tie goes to the even 0x3F82
  // (truncation would give 0x3F81).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // just above the tie: up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F80FFFFu)), 0x3F81);  // truncation would give 0x3F80
  EXPECT_EQ(f32_to_bf16(from_bits(0xBF80FFFFu)), 0xBF81);  // same magnitude, negative
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);  // just below the tie: down
  // The largest float rounds up to infinity; infinity stays infinity.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7FFFFFu)), 0x7F80);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xFF80);
  // NaN stays NaN, also one whose payload lies only in the low 16 bits (truncating or rounding
  // it naively would make infinity or carry into the sign).
  for (uint32_t bits : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    const uint16_t h = f32_to_bf16(from_bits(bits));
    EXPECT_EQ(h & 0x7F80, 0x7F80) << std::hex << bits;
    EXPECT_NE(h & 0x007F, 0) << std::hex << bits;
    EXPECT_EQ(h & 0x8000, (bits >> 16) & 0x8000) << std::hex << bits;
    EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << bits;
  }
}

TEST(DType, Q8RowRoundTripIsWithinHalfAStep) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  std::vector<float> x(128), y(128);
  for (auto& v : x) v = dist(rng);
  std::vector<BlockQ8_0> blocks(4);
  quantize_row(DType::Q8_0, x.data(), blocks.data(), 128);
  dequantize_row(DType::Q8_0, blocks.data(), y.data(), 128);
  for (int b = 0; b < 4; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    // Half a quantisation step, plus the f16 rounding of the scale (relative 2^-11).
    for (int j = 0; j < 32; ++j)
      EXPECT_NEAR(y[b * 32 + j], x[b * 32 + j], amax / 127 * 0.5f + amax * 1e-3f);
  }
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 64), 68u);
}

TEST(DType, NamesParseAndUnknownNamesFail) {
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  EXPECT_EQ(dtype_name(DType::Q8_0), "q8_0");
  EXPECT_EQ(dtype_from_name("q4_k"), DType::Q4_K);
  EXPECT_EQ(dtype_from_name("q4_K"), DType::Q4_K);
  EXPECT_EQ(dtype_name(DType::Q6_K), "q6_K");
  EXPECT_THROW(dtype_from_name("iq2_xxs"), Error);
  EXPECT_TRUE(dtype_supported(2));    // Q4_0
  EXPECT_FALSE(dtype_supported(16));  // IQ2_XXS
}

}  // namespace
}  // namespace protokv
