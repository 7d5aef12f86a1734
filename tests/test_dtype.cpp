#include <gtest/gtest.h>

#include <cmath>
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
  EXPECT_THROW(dtype_from_name("q4_k"), Error);
  EXPECT_FALSE(dtype_supported(2));  // Q4_0
}

}  // namespace
}  // namespace protokv
