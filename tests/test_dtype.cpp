// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/error.h"

namespace protokv {
namespace {

// The registry against ggml's own type table (ggml.c type_traits: blck_size, type_size), written
// out here independently: id, name, values per block, bytes per block.
TEST(DType, RegistryMatchesGgmlsTypeTable) {
  struct Ggml {
    uint32_t id;
    const char* name;
    int64_t block_values;
    size_t block_bytes;
  };
  const Ggml ggml[] = {{0, "f32", 1, 4},       {1, "f16", 1, 2},       {30, "bf16", 1, 2},
                       {8, "q8_0", 32, 34},    {2, "q4_0", 32, 18},    {3, "q4_1", 32, 20},
                       {6, "q5_0", 32, 22},    {7, "q5_1", 32, 24},    {10, "q2_K", 256, 84},
                       {11, "q3_K", 256, 110}, {12, "q4_K", 256, 144}, {13, "q5_K", 256, 176},
                       {14, "q6_K", 256, 210}};
  ASSERT_EQ(dtype_registry().size(), std::size(ggml));
  for (const Ggml& g : ggml) {
    SCOPED_TRACE(g.name);
    const DTypeTraits* t = find_dtype_traits(g.id);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, g.name);
    EXPECT_EQ(t->block_values, g.block_values);
    EXPECT_EQ(t->block_bytes, g.block_bytes);
    EXPECT_EQ(t->k_quant, g.block_values == 256);
    EXPECT_EQ(dtype_from_name(g.name), t->type);
    EXPECT_EQ(dtype_row_bytes(t->type, 2 * g.block_values), 2 * g.block_bytes);
  }
  EXPECT_FALSE(dtype_supported(9));  // q8_1: ggml's, not a weight type protokv reads
  EXPECT_EQ(find_dtype_traits(9), nullptr);
  EXPECT_EQ(dtype_names(/*writable_only=*/true), "f32, f16, bf16, q8_0, q4_0, q4_K");
  EXPECT_THROW(dtype_from_name("iq2_xxs"), Error);
  // llama_ftype ids of the writable types (llama.h: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2,
  // MOSTLY_Q8_0 7, MOSTLY_Q4_K_S 14, MOSTLY_BF16 32).
  const std::pair<DType, uint32_t> file_types[] = {{DType::F32, 0},   {DType::F16, 1},
                                                   {DType::Q4_0, 2},  {DType::Q8_0, 7},
                                                   {DType::Q4_K, 14}, {DType::BF16, 32}};
  for (const auto& [type, file_type] : file_types)
    EXPECT_EQ(dtype_traits(type).file_type, file_type);
}

// Every writable type quantises and dequantises back within its own resolution.
TEST(DType, WritableTypesRoundTripThroughTheRegistry) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(512), back(512);
  for (float& v : x) v = normal(rng);
  for (const DTypeTraits& t : dtype_registry()) {
    if (!t.writable()) {
      EXPECT_THROW(quantize_row(t.type, x.data(), back.data(), 0), Error) << t.name;
      continue;
    }
    SCOPED_TRACE(std::string(t.name));
    std::vector<uint8_t> bytes(dtype_row_bytes(t.type, 512));
    quantize_row(t.type, x.data(), bytes.data(), 512);
    dequantize_row(t.type, bytes.data(), back.data(), 512);
    double err = 0.0;
    for (size_t i = 0; i < x.size(); ++i) err = std::max(err, double{std::fabs(x[i] - back[i])});
    EXPECT_LT(err, t.block_values == 1 ? 0.02 : 0.6);
  }
}

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
