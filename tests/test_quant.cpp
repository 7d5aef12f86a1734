// SPDX-License-Identifier: Apache-2.0
// The GGML quantised weight types Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (and Q8_0's
// int8 mat-vec): dequantisation of hand-made blocks against values worked out here from ggml's
// documented layouts, every mat-vec variant against dequantise-then-dot, matmul against matvec,
// and GGUF files holding these types.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernel_reference.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/quant_matvec.h"
#include "model/loaders.h"
#include "model/random_model.h"
#include "protokv/dtype.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using kernels::Isa;

const DType kQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                             DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// The types whose decode takes ggml's Q8_0 / Q8_1 activation blocks (FP16 scales).
const DType kLegacyTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1};

bool is_legacy(DType type) {
  return std::find(std::begin(kLegacyTypes), std::end(kLegacyTypes), type) !=
         std::end(kLegacyTypes);
}

// The types whose decode takes ggml's own activation blocks (FP16 scales): the legacy types and
// Q8_0.
bool takes_ggml_q8_blocks(DType type) {
  return is_legacy(type) || type == DType::Q8_0;
}

bool takes_q8_1(DType type) {
  return type == DType::Q4_1 || type == DType::Q5_1;
}

template <class Block>
std::vector<float> dequantize(DType type, const Block& block) {
  std::vector<float> out(static_cast<size_t>(dtype_block_size(type)));
  dequantize_row(type, &block, out.data(), dtype_block_size(type));
  return out;
}

TEST(QuantBlocks, SizesAndNames) {
  EXPECT_EQ(dtype_row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_1, 64), 40u);
  EXPECT_EQ(dtype_row_bytes(DType::Q5_0, 64), 44u);
  EXPECT_EQ(dtype_row_bytes(DType::Q5_1, 64), 48u);
  EXPECT_EQ(dtype_row_bytes(DType::Q2_K, 512), 168u);
  EXPECT_EQ(dtype_row_bytes(DType::Q3_K, 512), 220u);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_EQ(dtype_row_bytes(DType::Q5_K, 512), 352u);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 512), 420u);
  for (DType t : kQuantTypes) {
    EXPECT_TRUE(dtype_supported(static_cast<uint32_t>(t)));
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
    EXPECT_EQ(dtype_block_size(t), t >= DType::Q2_K && t <= DType::Q6_K ? 256 : 32);
  }
  EXPECT_EQ(dtype_name(DType::Q3_K), "q3_K");  // llama.cpp's spelling
  for (uint32_t id : {4u, 5u, 9u, 15u, 16u, 20u, 23u, 29u, 34u, 35u, 39u})
    EXPECT_FALSE(dtype_supported(id)) << id;
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_THROW(quantize_row(DType::Q6_K, x.data(), out.data(), 256), Error);
}

TEST(QuantBlocks, Q4_0) {
  BlockQ4_0 b{};
  b.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequantize(DType::Q4_0, b);
  EXPECT_EQ(y[0], -4.0f);   // (0 - 8) / 2
  EXPECT_EQ(y[16], 3.5f);   // high nibble of qs[0] = 15
  EXPECT_EQ(y[15], 3.5f);   // low nibble of qs[15] = 15
  EXPECT_EQ(y[31], -4.0f);  // high nibble of qs[15] = 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8));
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j - 8));
  }
}

TEST(QuantBlocks, Q4_1) {
  BlockQ4_1 b{};
  b.d = f32_to_f16(0.25f);
  b.m = f32_to_f16(-1.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((j * 5 % 16) | (j << 4));
  const auto y = dequantize(DType::Q4_1, b);
  EXPECT_EQ(y[0], -1.5f);
  EXPECT_EQ(y[31], 0.25f * 15 - 1.5f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * (j * 5 % 16) - 1.5f);
    EXPECT_EQ(y[j + 16], 0.25f * j - 1.5f);
  }
}

// Fifth bits: bit j of the little-endian uint32 qh for value j.
TEST(QuantBlocks, Q5_0AndQ5_1) {
  const uint32_t qh = 0xA5C3F00Fu;
  BlockQ5_0 b{};
  b.d = f32_to_f16(0.5f);
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((15 - j) | (j << 4));
  const auto y = dequantize(DType::Q5_0, b);
  EXPECT_EQ(y[0], 0.5f * ((15 | 16) - 16));   // bit 0 set
  EXPECT_EQ(y[4], 0.5f * (11 - 16));          // bit 4 clear
  EXPECT_EQ(y[31], 0.5f * ((15 | 16) - 16));  // bit 31 set
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (static_cast<int>((15 - j) | (((qh >> j) & 1) << 4)) - 16)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (static_cast<int>(j | (((qh >> (j + 16)) & 1) << 4)) - 16)) << j;
  }
  BlockQ5_1 c{};
  c.d = f32_to_f16(0.125f);
  c.m = f32_to_f16(2.0f);
  std::memcpy(c.qh, &qh, 4);
  std::memcpy(c.qs, b.qs, 16);
  const auto z = dequantize(DType::Q5_1, c);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(z[j], 0.125f * ((15 - j) | (((qh >> j) & 1) << 4)) + 2.0f) << j;
    EXPECT_EQ(z[j + 16], 0.125f * (j | (((qh >> (j + 16)) & 1) << 4)) + 2.0f) << j;
  }
}

// The 2-bit layout of Q2_K/Q3_K: value 128 h + 32 j + l is bits 2j..2j+1 of qs[32 h + l].
int two_bits(const uint8_t* qs, int i) {
  const int h = i / 128, j = (i % 128) / 32, l = i % 32;
  return (qs[32 * h + l] >> (2 * j)) & 3;
}

TEST(QuantBlocks, Q2_K) {
  BlockQ2_K b{};
  b.d = f32_to_f16(0.5f);
  b.dmin = f32_to_f16(0.25f);
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>((g + 1) % 16 | ((15 - g) << 4));
  for (int i = 0; i < 64; ++i) b.qs[i] = static_cast<uint8_t>(i * 37 + 11);
  b.qs[0] = 0xE4;  // values 0, 32, 64, 96 are 0, 1, 2, 3
  const auto y = dequantize(DType::Q2_K, b);
  // Group 0: scale 1, min 15; group 2: scale 3, min 13; group 4: scale 5, min 11; group 6:
  // scale 7, min 9.
  EXPECT_EQ(y[0], 0.5f * 1 * 0 - 0.25f * 15);
  EXPECT_EQ(y[32], 0.5f * 3 * 1 - 0.25f * 13);
  EXPECT_EQ(y[64], 0.5f * 5 * 2 - 0.25f * 11);
  EXPECT_EQ(y[96], 0.5f * 7 * 3 - 0.25f * 9);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 16;
    EXPECT_EQ(y[i], 0.5f * (b.scales[g] & 15) * two_bits(b.qs, i) - 0.25f * (b.scales[g] >> 4))
        << i;
  }
}

// Q3_K's 6-bit scales (stored + 32) packed into 12 bytes: low nibble of scale g < 8 in byte g,
// of scale g >= 8 in the high nibble of byte g - 8; top two bits of scale g in byte 8 + g % 4 at
// bits 2 (g / 4).
void pack_q3k_scales(const int (&scales)[16], uint8_t* out) {
  std::memset(out, 0, 12);
  for (int g = 0; g < 16; ++g) {
    const int v = scales[g] + 32;
    if (g < 8)
      out[g] |= static_cast<uint8_t>(v & 15);
    else
      out[g - 8] |= static_cast<uint8_t>((v & 15) << 4);
    out[8 + g % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (g / 4)));
  }
}

TEST(QuantBlocks, Q3_KScalePacking) {
  BlockQ3_K b{};
  b.d = f32_to_f16(0.25f);
  // Hand-packed: byte 0 = 0x21, byte 8 = 0x02 -> scale 0 = (1 | 2 << 4) - 32 = 1, scale 8 =
  // (2 | 0 << 4) - 32 = -30; every other byte 0 -> scale -32.
  b.scales[0] = 0x21;
  b.scales[8] = 0x02;
  std::memset(b.qs, 0xff, 64);  // low bits 3
  std::memset(b.hmask, 0, 32);  // high bit clear: q = 3 - 4 = -1
  b.hmask[0] = 0x01;            // value 0: high bit set, q = 3
  const auto y = dequantize(DType::Q3_K, b);
  EXPECT_EQ(y[0], 0.25f * 1 * 3);
  EXPECT_EQ(y[1], 0.25f * 1 * -1);
  EXPECT_EQ(y[128], 0.25f * -30 * -1);  // group 8
  EXPECT_EQ(y[16], 0.25f * -32 * -1);   // group 1

  const int scales[16] = {-32, -31, -17, -1, 0, 1, 2, 5, 7, 12, 16, 20, 25, 29, 30, 31};
  pack_q3k_scales(scales, b.scales);
  for (int i = 0; i < 64; ++i) b.qs[i] = static_cast<uint8_t>(i * 53 + 7);
  for (int i = 0; i < 32; ++i) b.hmask[i] = static_cast<uint8_t>(i * 29 + 3);
  const auto z = dequantize(DType::Q3_K, b);
  for (int i = 0; i < 256; ++i) {
    // High bit of value 128 h + 32 j + l is bit 4 h + j of hmask[l]; clear means -4.
    const int h = i / 128, j = (i % 128) / 32, l = i % 32;
    const int q = two_bits(b.qs, i) - (((b.hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
    EXPECT_EQ(z[i], 0.25f * scales[i / 16] * q) << i;
  }
}

// Q4_K/Q5_K: 8 scales and 8 mins of 6 bits in 12 bytes (ggml's get_scale_min_k4).
void pack_k4_scales(const int (&scales)[8], const int (&mins)[8], uint8_t* out) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] |= static_cast<uint8_t>(scales[j]);
      out[j + 4] |= static_cast<uint8_t>(mins[j]);
    } else {
      out[j + 4] = static_cast<uint8_t>((scales[j] & 15) | ((mins[j] & 15) << 4));
      out[j - 4] |= static_cast<uint8_t>((scales[j] >> 4) << 6);
      out[j] |= static_cast<uint8_t>((mins[j] >> 4) << 6);
    }
  }
}

TEST(QuantBlocks, Q4_KScaleMinPacking) {
  BlockQ4_K b{};
  b.d = f32_to_f16(0.5f);
  b.dmin = f32_to_f16(0.125f);
  // Hand-packed: byte 0 = 0xC5 -> scale 0 = 5, top bits 3 of scale 4; byte 4 = 0x83 -> min 0 =
  // 3, top bits 2 of min 4; byte 8 = 0x97 -> scale 4 = 7 | 3 << 4 = 55, min 4 = 9 | 2 << 4 = 41.
  b.scales[0] = 0xC5;
  b.scales[4] = 0x83;
  b.scales[8] = 0x97;
  std::memset(b.qs, 0x3A, 128);  // low nibble 10, high nibble 3
  const auto y = dequantize(DType::Q4_K, b);
  EXPECT_EQ(y[0], 0.5f * 5 * 10 - 0.125f * 3);      // sub-block 0, low nibble
  EXPECT_EQ(y[32], 0.5f * 0 * 3 - 0.125f * 0);      // sub-block 1, high nibble
  EXPECT_EQ(y[128], 0.5f * 55 * 10 - 0.125f * 41);  // sub-block 4

  const int scales[8] = {1, 63, 17, 40, 33, 2, 48, 60};
  const int mins[8] = {0, 5, 63, 31, 16, 47, 9, 62};
  pack_k4_scales(scales, mins, b.scales);
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>(i * 91 + 5);
  const auto z = dequantize(DType::Q4_K, b);
  for (int i = 0; i < 256; ++i) {
    // Value 64 j + 32 k + l: nibble k of qs[32 j + l], sub-block 2 j + k.
    const int j = i / 64, k = (i % 64) / 32, l = i % 32;
    const int q = k == 0 ? b.qs[32 * j + l] & 15 : b.qs[32 * j + l] >> 4;
    EXPECT_EQ(z[i], 0.5f * scales[i / 32] * q - 0.125f * mins[i / 32]) << i;
  }

  BlockQ5_K c{};
  c.d = b.d;
  c.dmin = b.dmin;
  std::memcpy(c.scales, b.scales, 12);
  std::memcpy(c.qs, b.qs, 128);
  for (int i = 0; i < 32; ++i) c.qh[i] = static_cast<uint8_t>(i * 71 + 13);
  const auto w = dequantize(DType::Q5_K, c);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 64, k = (i % 64) / 32, l = i % 32;
    const int low = k == 0 ? c.qs[32 * j + l] & 15 : c.qs[32 * j + l] >> 4;
    const int q = low | (((c.qh[l] >> (2 * j + k)) & 1) << 4);  // fifth bit: bit 2j+k of qh[l]
    EXPECT_EQ(w[i], 0.5f * scales[i / 32] * q - 0.125f * mins[i / 32]) << i;
  }
}

TEST(QuantBlocks, Q6_K) {
  BlockQ6_K b{};
  b.d = f32_to_f16(0.0625f);
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g * 17 - 128);
  for (int i = 0; i < 128; ++i) b.ql[i] = static_cast<uint8_t>(i * 45 + 9);
  for (int i = 0; i < 64; ++i) b.qh[i] = static_cast<uint8_t>(i * 101 + 77);
  const auto y = dequantize(DType::Q6_K, b);
  for (int i = 0; i < 256; ++i) {
    // Value 128 h + 32 k + l: low nibble (k < 2) or high nibble of ql[64 h + 32 (k % 2) + l],
    // top bits 2k..2k+1 of qh[32 h + l]; stored + 32.
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    const uint8_t low_byte = b.ql[64 * h + 32 * (k % 2) + l];
    const int low = k < 2 ? low_byte & 15 : low_byte >> 4;
    const int q = (low | (((b.qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
    EXPECT_EQ(y[i], 0.0625f * b.scales[i / 16] * q) << i;
  }
  b.ql[0] = 0x0F;
  b.qh[0] = 0x03;  // value 0 = 63 - 32 = 31
  b.scales[0] = -3;
  EXPECT_EQ(dequantize(DType::Q6_K, b)[0], 0.0625f * -3 * 31);
}

// Writes the f16 scale fields of one block of `type` at p: d, and the min (legacy Q4_1/Q5_1,
// signed) or dmin (K-quants) where the type has one.
void put_scales(DType type, uint8_t* p, float d, float min) {
  auto put = [&](size_t offset, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(p + offset, &h, 2);
  };
  switch (type) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:
      put(0, d);
      return;
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
      put(0, d);
      put(2, min);
      return;
    case DType::Q2_K:
      put(80, d);
      put(82, min);
      return;
    case DType::Q3_K:
      put(108, d);
      return;
    case DType::Q6_K:
      put(208, d);
      return;
    default:
      ADD_FAILURE() << "no scale layout for " << dtype_name(type);
  }
}

// Random bytes are valid blocks for every type; only the f16 scales are set to sane values.
std::vector<uint8_t> random_blocks(std::mt19937& rng, DType type, int64_t rows, int64_t cols) {
  std::vector<uint8_t> bytes(dtype_row_bytes(type, cols) * static_cast<size_t>(rows));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  const size_t block_bytes = dtype_row_bytes(type, dtype_block_size(type));
  const bool k_quant = dtype_block_size(type) == 256;
  for (size_t b = 0; b < bytes.size(); b += block_bytes) {
    const float d = type == DType::Q6_K ? scale(rng) * 0.1f : scale(rng);
    // Legacy mins are an offset of either sign; K-quant dmins a positive multiplier.
    const float min = k_quant ? scale(rng) : scale(rng) * (rng() % 2 ? 4.0f : -4.0f);
    put_scales(type, bytes.data() + b, d, min);
  }
  return bytes;
}

int64_t activation_block(DType type) {
  return dtype_block_size(type);  // per 32 values for legacy types, 256 for K-quants
}

std::vector<int64_t> widths_for(DType type) {
  if (dtype_block_size(type) == 32) return {32, 64, 320, 4096};
  return {256, 512, 2816, 4096};
}

// matvec_rows (decode_batch): every row's result is matvec's for that row, bit for bit, for every
// weight type (each takes its own activation quantisation path).
TEST(QuantKernels, MatvecRowsEqualsMatvecPerRowBitForBit) {
  std::mt19937 rng(93);
  std::vector<DType> types = {DType::F32, DType::F16, DType::BF16};
  types.insert(types.end(), std::begin(kQuantTypes), std::end(kQuantTypes));
  for (DType type : types) {
    for (int64_t n : {1, 2, 5}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(type) << " n=" << n);
      const int64_t rows = 37, cols = 512;
      WeightMatrix w;
      std::vector<uint8_t> bytes;
      testing::TestWeight plain;
      if (dtype_block_size(type) > 1) {
        bytes = random_blocks(rng, type, rows, cols);
        w = {type, bytes.data(), rows, cols};
      } else {
        plain = testing::random_weight(rng, type, rows, cols);
        w = plain.matrix;
      }
      const auto x = testing::random_vector(rng, n * cols);
      std::vector<float> batched(static_cast<size_t>(n * rows), NAN);
      kernels::matvec_rows(w, x.data(), n, batched.data());
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> one(static_cast<size_t>(rows), NAN);
        kernels::matvec(w, x.data() + i * cols, one.data());
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(batched[static_cast<size_t>(i * rows + r)], one[static_cast<size_t>(r)])
              << "row " << i << ", output " << r;
      }
    }
  }
}

TEST(QuantKernels, MatvecEveryIsaMatchesDequantisedReference) {
  std::mt19937 rng(91);
  for (DType type : kQuantTypes) {
    for (int64_t cols : widths_for(type)) {
      for (int64_t rows : {1, 7, 40}) {
        const auto bytes = random_blocks(rng, type, rows, cols);
        const WeightMatrix w{type, bytes.data(), rows, cols};
        std::vector<float> dense(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r) dequantize_row(type, w.row(r), &dense[r * cols], cols);
        auto x = testing::random_vector(rng, cols);
        x[0] = 8.0f;  // an outlier: coarse activation steps in its block
        std::vector<float> scalar(static_cast<size_t>(rows));
        kernels::matvec(Isa::kScalar, w, x.data(), scalar.data());
        for (Isa isa : kernels::available_isas()) {
          SCOPED_TRACE(::testing::Message() << kernels::isa_name(isa) << " " << dtype_name(type)
                                            << " " << rows << "x" << cols);
          std::vector<float> y(static_cast<size_t>(rows), NAN);
          kernels::matvec(isa, w, x.data(), y.data());
          for (int64_t r = 0; r < rows; ++r) {
            const float* wr = &dense[r * cols];
            const double exact = testing::ref_dot(wr, x.data(), cols);
            ASSERT_NEAR(y[r], exact,
                        testing::int8_activation_bound(wr, x.data(), cols, activation_block(type),
                                                       takes_ggml_q8_blocks(type)))
                << "row " << r;
            // The integer part is exact in every variant: they differ by F32 summation order only.
            ASSERT_NEAR(y[r], scalar[r], 2e-6 * testing::ref_abs_dot(wr, x.data(), cols) + 1e-6)
                << "row " << r;
          }
        }
      }
    }
  }
}

// The kernels' integer ranges at their extremes: every quant bit and small scale set (all 0xff
// bytes) and activations at +-127 after quantisation. Not the legacy types and Q8_0: their
// activation has an FP16 scale, so +-1 comes back as +-127 * FP16(1 / 127);
// LegacyKernelsExtremeBlocks and Q8_0RowsRoundAsGgmlVecDot check them against ggml's formula.
TEST(QuantKernels, ExtremeBlocksStayExact) {
  for (DType type : kQuantTypes) {
    if (takes_ggml_q8_blocks(type)) continue;
    const int64_t cols = 512, rows = 2;
    std::vector<uint8_t> bytes(dtype_row_bytes(type, cols) * rows, 0xff);
    const size_t block_bytes = dtype_row_bytes(type, dtype_block_size(type));
    for (size_t b = 0; b < bytes.size(); b += block_bytes)
      put_scales(type, bytes.data() + b, 0.01f, 0.02f);
    const WeightMatrix w{type, bytes.data(), rows, cols};
    std::vector<float> dense(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(type, w.row(r), &dense[r * cols], cols);
    std::vector<float> x(cols);
    for (int64_t i = 0; i < cols; ++i) x[i] = i % 3 == 0 ? -1.0f : 1.0f;  // exact in int8
    for (Isa isa : kernels::available_isas()) {
      std::vector<float> y(rows);
      kernels::matvec(isa, w, x.data(), y.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float* wr = &dense[r * cols];
        EXPECT_NEAR(y[r], testing::ref_dot(wr, x.data(), cols),
                    1e-5 * testing::ref_abs_dot(wr, x.data(), cols) + 1e-6)
            << kernels::isa_name(isa) << " " << dtype_name(type);
      }
    }
  }
}

// ---- Q4_0 / Q4_1 / Q5_0 / Q5_1 decode: ggml's Q8_0 / Q8_1 activation and vec_dot ----

// Hand-made blocks with answers worked out from ggml's x86 quantize_row_q8_0 / q8_1.
TEST(QuantActivation, GgmlQ8BlocksRoundAsLlamaCpp) {
  std::vector<float> x(128, 0.0f);
  // Block 0: d = 1 / 127, not an FP16 value: stored as FP16 0x2008 = 0.00787353515625. s uses
  // the unrounded d: FP16(17 / 127) = 0.1339111328125, where the FP16 d would give 0.1337890625.
  x[0] = 1.0f;
  x[1] = -110.0f / 127.0f;
  // Block 1: max 127 (d = 1): ties round half to even (ggml's roundf-based reference would round
  // 2.5 to 3); +-max both present give +-127.
  const float ties[] = {127.0f, 2.5f, -2.5f, 3.5f, -0.5f, 0.5f, 1.5f, -127.0f};
  for (int j = 0; j < 8; ++j) x[32 + j] = ties[j];
  // Block 2: 127 / max|x| times x is exactly -126.5 (to even: -126), where 1 / (max|x| / 127)
  // times x is -126.50001 (-127).
  x[64] = 0.3f;
  x[65] = -0x1.31fd96p-2f;
  // Block 3: all zero.
  kernels::QuantizedActivation q8_0, q8_1;
  kernels::quantize_activation_ggml_q8(x.data(), 128, false, q8_0);
  kernels::quantize_activation_ggml_q8(x.data(), 128, true, q8_1);
  EXPECT_TRUE(q8_0.s.empty());
  ASSERT_EQ(q8_1.s.size(), 4u);
  for (const auto* a : {&q8_0, &q8_1}) {
    ASSERT_EQ(a->q.size(), 128u);
    ASSERT_EQ(a->scale.size(), 4u);
    EXPECT_EQ(f32_to_f16(a->scale[0]), 0x2008);
    EXPECT_EQ(a->scale[0], 0.00787353515625f);
    EXPECT_EQ(a->q[0], 127);
    EXPECT_EQ(a->q[1], -110);
    EXPECT_EQ(a->scale[1], 1.0f);
    const int expected_ties[] = {127, 2, -2, 4, 0, 0, 2, -127};
    for (int j = 0; j < 8; ++j) EXPECT_EQ(a->q[static_cast<size_t>(32 + j)], expected_ties[j]) << j;
    EXPECT_EQ(a->q[64], 127);
    EXPECT_EQ(a->q[65], -126);
    EXPECT_EQ(a->scale[3], 0.0f);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(a->q[static_cast<size_t>(96 + j)], 0);
    for (size_t j = 2; j < 32; ++j) EXPECT_EQ(a->q[j], 0) << j;
  }
  EXPECT_EQ(q8_1.s[0], 0.1339111328125f);
  EXPECT_EQ(q8_1.s[1], 6.0f);  // 127 + 2 - 2 + 4 + 0 + 0 + 2 - 127
  EXPECT_EQ(q8_1.s[3], 0.0f);
}

// A NaN, an infinity or a subnormal block in the activation (a corrupt model's weights produce
// them) quantises to -128, as the x86 conversion does, instead of an undefined float -> int8 cast
// (found by the gguf_model fuzz target; clang's UBSan reports the cast).
TEST(QuantActivation, NanInfinityAndSubnormalBlocksBecomeMinus128) {
  std::vector<float> x(96, 0.5f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();  // its block's scale inf: values x 0, inf x 0
  kernels::QuantizedActivation q;
  // Block 2: subnormal values only: 127 / amax overflows to infinity (as in ggml).
  for (int j = 64; j < 96; ++j) x[static_cast<size_t>(j)] = (j % 2 ? 1 : -1) * 1e-44f;
  kernels::quantize_activation_ggml_q8(x.data(), 96, true, q);
  ASSERT_EQ(q.q.size(), 96u);
  EXPECT_EQ(q.q[3], -128);
  EXPECT_EQ(q.q[0], 127);  // the block's finite values keep their scale (0.5 -> 127)
  EXPECT_EQ(q.q[40], -128);
  EXPECT_EQ(q.q[41], 0);
  for (int j = 64; j < 96; ++j) EXPECT_EQ(q.q[static_cast<size_t>(j)], -128) << j;
}

// ggml's formula for one row in double from the unpacked blocks and the Q8_0 / Q8_1 activation:
// per block d_w d_x sum (q_w - offset) q_x, plus m_w s_x for the min types. abs_sum gets the same
// sum over the absolute products (the scale of the F32 rounding, cancellation included).
double ggml_legacy_reference(DType type, const void* row, int64_t cols,
                             const kernels::QuantizedActivation& x, double* abs_sum) {
  double total = 0.0;
  *abs_sum = 0.0;
  quant::with_unpacker(type, [&](auto unpack) {
    using Unpack = decltype(unpack);
    const auto* blocks = static_cast<const typename Unpack::Block*>(row);
    quant::UnpackedBlock u;
    for (int64_t b = 0; b < cols / 32; ++b) {
      Unpack::unpack(blocks[b], u);
      int64_t dot = 0, abs_dot = 0;
      for (int j = 0; j < 32; ++j) {
        const int64_t p =
            (u.q[j] - u.offset) * static_cast<int64_t>(x.q[static_cast<size_t>(32 * b + j)]);
        dot += p;
        abs_dot += p < 0 ? -p : p;
      }
      const double d = static_cast<double>(u.d) * x.scale[static_cast<size_t>(b)];
      // UnpackedBlock's m is minus the weight's min for Q4_1 / Q5_1 (value = d q - m).
      const double min_term =
          takes_q8_1(type) ? -static_cast<double>(u.m) * x.s[static_cast<size_t>(b)] : 0.0;
      total += d * static_cast<double>(dot) + min_term;
      *abs_sum += std::fabs(d) * static_cast<double>(abs_dot) + std::fabs(min_term);
    }
  });
  return total;
}

// ggml's x86 vec_dot to the bit, emulated here: 8 F32 lanes, lane l accumulating by FMA
// (d_w * d_x) * (the int32 dot of values 4l..4l+3) block after block, summed at the end as
// hsum_float_8 does ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), plus the FMA-accumulated
// m_w * s_x of the min types.
float ggml_x86_emulation(DType type, const void* row, int64_t cols,
                         const kernels::QuantizedActivation& x) {
  float lanes[8] = {};
  float mins = 0.0f;
  quant::with_unpacker(type, [&](auto unpack) {
    using Unpack = decltype(unpack);
    const auto* blocks = static_cast<const typename Unpack::Block*>(row);
    quant::UnpackedBlock u;
    for (int64_t b = 0; b < cols / 32; ++b) {
      Unpack::unpack(blocks[b], u);
      const float d = u.d * x.scale[static_cast<size_t>(b)];
      if (takes_q8_1(type)) mins = std::fma(-u.m, x.s[static_cast<size_t>(b)], mins);
      for (int l = 0; l < 8; ++l) {
        int32_t dot = 0;
        for (int k = 0; k < 4; ++k)
          dot += (u.q[4 * l + k] - u.offset) * x.q[static_cast<size_t>(32 * b + 4 * l + k)];
        lanes[l] = std::fma(d, static_cast<float>(dot), lanes[l]);
      }
    }
  });
  float t[4];
  for (int k = 0; k < 4; ++k) t[k] = lanes[k] + lanes[k + 4];
  return ((t[0] + t[2]) + (t[1] + t[3])) + mins;
}

// Every legacy kernel of every instruction set against ggml's formula in double (F32 rounding
// only: the integer part is exact), the vector variants bit for bit against the emulation of
// ggml's x86 arithmetic, and matvec against the kernel of its instruction set. Random bytes are
// valid blocks; one activation block is all zero, one has a large outlier.
TEST(QuantKernels, LegacyKernelsMatchGgmlFormula) {
  std::mt19937 rng(23);
  for (DType type : kLegacyTypes) {
    for (int64_t cols : {32, 96, 1024, 4096}) {
      const int64_t rows = 9;
      const auto bytes = random_blocks(rng, type, rows, cols);
      const WeightMatrix w{type, bytes.data(), rows, cols};
      auto x = testing::random_vector(rng, cols);
      x[0] = 8.0f;
      if (cols >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
      kernels::QuantizedActivation xq;
      kernels::quantize_activation_ggml_q8(x.data(), cols, takes_q8_1(type), xq);
      if (cols >= 64) {
        EXPECT_EQ(xq.scale[1], 0.0f);
      }
      for (Isa isa : kernels::available_isas()) {
        SCOPED_TRACE(::testing::Message()
                     << kernels::isa_name(isa) << " " << dtype_name(type) << " x" << cols);
        std::vector<float> y(static_cast<size_t>(rows), NAN);
        kernels::matvec(isa, w, x.data(), y.data());
        for (int64_t r = 0; r < rows; ++r) {
          double abs_sum = 0.0;
          const double expected = ggml_legacy_reference(type, w.row(r), cols, xq, &abs_sum);
          const float got = kernels::legacy_quant_dot(isa, type, w.row(r), xq, cols);
          // Per block: d_w * d_x, its product with the dot and the sum round once each (and m_w
          // s_x, its sum): at most (cols / 32 + 3) half-ulps of the absolute terms' sum.
          const double tolerance = (static_cast<double>(cols) / 32 + 3) * 0x1p-24 * abs_sum;
          EXPECT_NEAR(got, expected, tolerance + 1e-30) << "row " << r;
          EXPECT_EQ(y[r], got) << "row " << r;  // matvec is this kernel on each row
          if (isa != Isa::kScalar) {
            EXPECT_EQ(got, ggml_x86_emulation(type, w.row(r), cols, xq)) << "row " << r;
          }
        }
      }
    }
  }
}

// Weights with every quant bit set (all 0xff bytes) against activations at +-max: the largest
// products the int8 paths see, exact in int32.
TEST(QuantKernels, LegacyKernelsExtremeBlocks) {
  for (DType type : kLegacyTypes) {
    const int64_t cols = 256, rows = 2;
    std::vector<uint8_t> bytes(dtype_row_bytes(type, cols) * rows, 0xff);
    const size_t block_bytes = dtype_row_bytes(type, 32);
    for (size_t b = 0; b < bytes.size(); b += block_bytes)
      put_scales(type, bytes.data() + b, 0.01f, -0.02f);
    std::vector<float> x(cols);
    for (int64_t i = 0; i < cols; ++i) x[i] = i % 3 == 0 ? -1.0f : 1.0f;
    kernels::QuantizedActivation xq;
    kernels::quantize_activation_ggml_q8(x.data(), cols, takes_q8_1(type), xq);
    for (Isa isa : kernels::available_isas()) {
      for (int64_t r = 0; r < rows; ++r) {
        const void* row = bytes.data() + r * dtype_row_bytes(type, cols);
        double abs_sum = 0.0;
        const double expected = ggml_legacy_reference(type, row, cols, xq, &abs_sum);
        EXPECT_NEAR(kernels::legacy_quant_dot(isa, type, row, xq, cols), expected, 1e-6 * abs_sum)
            << kernels::isa_name(isa) << " " << dtype_name(type);
      }
    }
  }
}

// Q8_0 rows against ggml's Q8_0 activation blocks: ggml's x86 ggml_vec_dot_q8_0_q8_0 (8 F32
// lanes, lane l accumulating fma(d_w * d_x, int32 dot of values 4l..4l+3), hsum_float_8) to the
// bit in the vector variants, its formula within F32 rounding in all. Blocks at the extremes
// (every weight -128 or 127, activations +-max) included.
TEST(QuantKernels, Q8_0RowsRoundAsGgmlVecDot) {
  std::mt19937 rng(29);
  for (int64_t cols : {32, 96, 1024}) {
    const int64_t rows = 5;
    auto bytes = random_blocks(rng, DType::Q8_0, rows, cols);
    auto* first = reinterpret_cast<BlockQ8_0*>(bytes.data());
    for (int j = 0; j < 32; ++j) first->quants[j] = static_cast<int8_t>(j % 2 ? -128 : 127);
    const WeightMatrix w{DType::Q8_0, bytes.data(), rows, cols};
    auto x = testing::random_vector(rng, cols);
    for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = j % 3 ? 2.0f : -2.0f;
    kernels::QuantizedActivation xq;
    kernels::quantize_activation_ggml_q8(x.data(), cols, false, xq);
    for (Isa isa : kernels::available_isas()) {
      SCOPED_TRACE(::testing::Message() << kernels::isa_name(isa) << " x" << cols);
      std::vector<float> y(static_cast<size_t>(rows), NAN);
      kernels::matvec(isa, w, x.data(), y.data());
      for (int64_t r = 0; r < rows; ++r) {
        const auto* blocks = static_cast<const BlockQ8_0*>(w.row(r));
        float lanes[8] = {};
        double formula = 0.0, abs_sum = 0.0;
        for (int64_t b = 0; b < cols / 32; ++b) {
          const float d = f16_to_f32(blocks[b].scale) * xq.scale[static_cast<size_t>(b)];
          int64_t block_dot = 0, block_abs = 0;
          for (int l = 0; l < 8; ++l) {
            int32_t dot = 0;
            for (int k = 0; k < 4; ++k) {
              const int32_t p =
                  blocks[b].quants[4 * l + k] * xq.q[static_cast<size_t>(32 * b + 4 * l + k)];
              dot += p;
              block_abs += p < 0 ? -p : p;
            }
            block_dot += dot;
            lanes[l] = std::fma(d, static_cast<float>(dot), lanes[l]);
          }
          formula += static_cast<double>(d) * static_cast<double>(block_dot);
          abs_sum += std::fabs(d) * static_cast<double>(block_abs);
        }
        EXPECT_NEAR(y[r], formula, (static_cast<double>(cols) / 32 + 3) * 0x1p-24 * abs_sum + 1e-30)
            << "row " << r;
        if (isa == Isa::kScalar) continue;
        float t[4];
        for (int k = 0; k < 4; ++k) t[k] = lanes[k] + lanes[k + 4];
        EXPECT_EQ(y[r], (t[0] + t[2]) + (t[1] + t[3])) << "row " << r;
      }
    }
  }
}

// llama.cpp's arithmetic for a Q4_0 row of a matrix it repacks into 8-row blocks (AVX2 CPUs, rows a
// multiple of 8; ggml_gemv_q4_0_8x8_q8_0): one F32 accumulator per row, block after block
// acc = fma(float(exact int32 dot of q - 8 with q_x), d_w * d_x, acc).
float llama_cpp_q4_0_gemv_emulation(const void* row, int64_t cols,
                                    const kernels::QuantizedActivation& x) {
  const auto* blocks = static_cast<const BlockQ4_0*>(row);
  quant::UnpackedBlock u;
  float acc = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    quant::UnpackQ4_0::unpack(blocks[b], u);
    int32_t dot = 0;
    for (int j = 0; j < 32; ++j) dot += (u.q[j] - 8) * x.q[static_cast<size_t>(32 * b + j)];
    const float scale = u.d * x.scale[static_cast<size_t>(b)];
    acc = std::fma(static_cast<float>(dot), scale, acc);
  }
  return acc;
}

// Q4_0 matrices of a multiple of 8 rows: the vector variants compute llama.cpp's 8-row gemv to the
// bit (dot8_q4_0_q8_0), the portable one ggml's generic vec_dot (legacy_quant_dot); both within
// the F32 rounding of ggml's formula. One activation block is all zero, one has an outlier, and
// one weight block has every nibble 15 (the largest unsigned products). 64 x 4096 (147 KB) splits
// its row groups over the threads; three activations at once (matvec_rows, batched decode) give
// each its own row of results, bit for bit as one at a time.
TEST(QuantKernels, Q4_0MatricesOfEightRowsRoundAsLlamaCppsGemv) {
  std::mt19937 rng(31);
  for (int64_t cols : {32, 96, 1024, 4096}) {
    for (int64_t rows : {8, 24, 64}) {
      auto bytes = random_blocks(rng, DType::Q4_0, rows, cols);
      std::memset(reinterpret_cast<BlockQ4_0*>(bytes.data())->qs, 0xff, 16);
      const WeightMatrix w{DType::Q4_0, bytes.data(), rows, cols};
      auto x = testing::random_vector(rng, cols);
      x[1] = -9.0f;
      if (cols >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
      kernels::QuantizedActivation xq;
      kernels::quantize_activation_ggml_q8(x.data(), cols, false, xq);
      for (Isa isa : kernels::available_isas()) {
        SCOPED_TRACE(::testing::Message() << kernels::isa_name(isa) << " " << rows << "x" << cols);
        std::vector<float> y(static_cast<size_t>(rows), NAN);
        kernels::matvec(isa, w, x.data(), y.data());
        for (int64_t r = 0; r < rows; ++r) {
          double abs_sum = 0.0;
          const double expected = ggml_legacy_reference(DType::Q4_0, w.row(r), cols, xq, &abs_sum);
          EXPECT_NEAR(y[r], expected, (static_cast<double>(cols) / 32 + 3) * 0x1p-24 * abs_sum)
              << "row " << r;
          const float exact = isa == Isa::kScalar
                                  ? kernels::legacy_quant_dot(isa, DType::Q4_0, w.row(r), xq, cols)
                                  : llama_cpp_q4_0_gemv_emulation(w.row(r), cols, xq);
          EXPECT_EQ(y[r], exact) << "row " << r;
        }
        if (isa != kernels::active_isa()) continue;
        const auto x3 = testing::random_vector(rng, 3 * cols);
        std::vector<float> y3(static_cast<size_t>(3 * rows), NAN);
        kernels::matvec_rows(w, x3.data(), 3, y3.data());
        for (int64_t i = 0; i < 3; ++i) {
          kernels::matvec(isa, w, x3.data() + i * cols, y.data());
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(y3[static_cast<size_t>(i * rows + r)], y[r])
                << "activation " << i << " row " << r;
        }
      }
    }
  }
}

// Several rows at once (prompt rows multiplied as decode, sequences' decode rows) of the legacy
// types round each (row, token) as one mat-vec does: matvec_rows equals matvec token by token, bit
// for bit, in every instruction set. Row counts: Q4_0's 8-row tiles (8, 24) and the lane-form
// tiles with and without a remainder (5, 37); token counts that fill the tiles and leave a
// remainder; one weight block of 0x7f bytes (Q8_0's values at +127, the nibbles at 15 and 7).
TEST(QuantKernels, LegacyRowsRoundAsOneMatvecEach) {
  std::mt19937 rng(37);
  for (DType type : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    for (int64_t cols : {32, 96, 1024}) {
      for (int64_t rows : {5, 8, 24, 37}) {
        auto bytes = random_blocks(rng, type, rows, cols);
        const size_t block_bytes = dtype_row_bytes(type, 32);
        const size_t scales = takes_q8_1(type) ? 4 : 2;  // d (and m) lead each block
        std::memset(bytes.data() + scales, 0x7f, block_bytes - scales);
        const WeightMatrix w{type, bytes.data(), rows, cols};
        for (int64_t n : {2, 3, 9, 17}) {
          auto x = testing::random_vector(rng, n * cols);
          x[1] = -9.0f;
          for (Isa isa : kernels::available_isas()) {
            SCOPED_TRACE(::testing::Message() << kernels::isa_name(isa) << " " << dtype_name(type)
                                              << " " << rows << "x" << cols << " n=" << n);
            std::vector<float> y(static_cast<size_t>(n * rows), NAN),
                one(static_cast<size_t>(rows));
            kernels::matvec_rows(isa, w, x.data(), n, y.data());
            for (int64_t t = 0; t < n; ++t) {
              kernels::matvec(isa, w, x.data() + t * cols, one.data());
              for (int64_t r = 0; r < rows; ++r)
                ASSERT_EQ(y[static_cast<size_t>(t * rows + r)], one[static_cast<size_t>(r)])
                    << "token " << t << " row " << r;
            }
          }
        }
      }
    }
  }
}

// Prefill's matmul (dequantised tiles through sgemm, F32 activations) against the dequantised
// reference, and against decode's matvec within the int8-activation bound.
TEST(QuantKernels, MatmulMatchesReferenceAndMatvec) {
  std::mt19937 rng(17);
  for (DType type : kQuantTypes) {
    const int64_t cols = dtype_block_size(type) == 32 ? 96 : 512;
    const int64_t rows = 37, n = 6;
    const auto bytes = random_blocks(rng, type, rows, cols);
    const WeightMatrix w{type, bytes.data(), rows, cols};
    std::vector<float> dense(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(type, w.row(r), &dense[r * cols], cols);
    const auto x = testing::random_vector(rng, n * cols);
    for (Isa isa : kernels::available_isas()) {
      SCOPED_TRACE(::testing::Message() << kernels::isa_name(isa) << " " << dtype_name(type));
      std::vector<float> y(static_cast<size_t>(n * rows), NAN);
      kernels::matmul(isa, w, x.data(), n, y.data());
      std::vector<float> row_out(static_cast<size_t>(rows));
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x.data() + t * cols;
        kernels::matvec(isa, w, xt, row_out.data());
        for (int64_t r = 0; r < rows; ++r) {
          const float* wr = &dense[r * cols];
          ASSERT_NEAR(y[t * rows + r], testing::ref_dot(wr, xt, cols),
                      1e-5 * testing::ref_abs_dot(wr, xt, cols) + 1e-6);
          ASSERT_NEAR(y[t * rows + r], row_out[r],
                      testing::int8_activation_bound(wr, xt, cols, activation_block(type),
                                                     takes_ggml_q8_blocks(type)));
        }
      }
    }
  }
}

// Prefill converts weight panels with its variant's to_f32: bit for bit the portable
// dequantize_row for every quantised type (the vector code must round d * q, then subtract the
// min, as dequantize_blocks does, and not fuse the two into an FMA).
TEST(QuantKernels, WeightRowToF32EqualsDequantizeRowBitForBit) {
  std::mt19937 rng(29);
  for (DType type : kQuantTypes) {
    const int64_t cols = 4 * dtype_block_size(type);
    const auto bytes = random_blocks(rng, type, 1, cols);
    std::vector<float> expected(static_cast<size_t>(cols));
    dequantize_row(type, bytes.data(), expected.data(), cols);
    for (Isa isa : kernels::available_isas()) {
      SCOPED_TRACE(::testing::Message() << kernels::isa_name(isa) << " " << dtype_name(type));
      std::vector<float> got(static_cast<size_t>(cols), NAN);
      kernels::weight_row_to_f32(isa, type, bytes.data(), got.data(), cols);
      for (int64_t i = 0; i < cols; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(expected[i]))
            << "value " << i << ": " << got[i] << " vs " << expected[i];
    }
  }
}

// A GGUF holding every type loads with the right sizes and bytes; malformed shapes fail.
TEST(QuantGguf, FilesWithEveryTypeLoad) {
  testing::TempDir dir;
  std::mt19937 rng(3);
  GgufWriter writer;
  writer.set_string("general.architecture", "test");
  std::vector<std::vector<uint8_t>> data;
  for (DType type : kQuantTypes) {
    const int64_t cols = dtype_block_size(type) * 2, rows = 3;
    data.push_back(random_blocks(rng, type, rows, cols));
    writer.add_tensor(std::string(dtype_name(type)), {cols, rows}, type, data.back().data(),
                      data.back().size());
  }
  const std::string path = (dir.path() / "quant.gguf").string();
  writer.write(path);
  const GgufFile file = GgufFile::open(path);
  size_t i = 0;
  for (DType type : kQuantTypes) {
    const auto* t = file.find_tensor(std::string(dtype_name(type)));
    ASSERT_NE(t, nullptr) << dtype_name(type);
    EXPECT_EQ(t->type, type);
    EXPECT_EQ(t->nbytes, data[i].size());
    EXPECT_EQ(std::memcmp(t->data, data[i].data(), t->nbytes), 0);
    ++i;
  }
}

TEST(QuantGguf, RowsNotWholeBlocksAreRejectedWhenWriting) {
  GgufWriter writer;
  std::vector<uint8_t> data(4096);
  EXPECT_THROW(writer.add_tensor("w", {300, 1}, DType::Q4_K, data.data(), 144), Error);
  EXPECT_THROW(writer.add_tensor("w", {48, 1}, DType::Q4_0, data.data(), 18), Error);
  // Byte size that does not match the shape.
  EXPECT_THROW(writer.add_tensor("w", {256, 2}, DType::Q6_K, data.data(), 210), Error);
}

// The reference quantisers (not llama-quantize-identical): every value within its block's step.
TEST(QuantReference, Q4_0AndQ4_KRoundTrip) {
  std::mt19937 rng(8);
  const auto x = testing::random_vector(rng, 1024);
  for (DType type : {DType::Q4_0, DType::Q4_K}) {
    std::vector<uint8_t> bytes(dtype_row_bytes(type, 1024));
    std::vector<float> y(1024);
    quantize_row(type, x.data(), bytes.data(), 1024);
    dequantize_row(type, bytes.data(), y.data(), 1024);
    for (int64_t b = 0; b < 1024 / 32; ++b) {
      float lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l)
        lo = std::min(lo, x[32 * b + l]), hi = std::max(hi, x[32 * b + l]);
      // Q4_0 maps the extreme value to -8 steps, so the other sign clips at +7 steps: one
      // step (max|x| / 8) at worst. Q4_K: half a step ((hi - lo) / 15), steps and offsets rounded
      // up by at most one unit of the super-block's d and dmin (~max range / (15 * 63)).
      const float tol = type == DType::Q4_0 ? std::max(hi, -lo) / 8 * 1.01f + 1e-3f
                                            : (hi - lo) / 15 * 0.55f + 0.06f;
      for (int l = 0; l < 32; ++l)
        EXPECT_NEAR(y[32 * b + l], x[32 * b + l], tol) << dtype_name(type) << " " << b;
    }
  }
}

// A whole model in Q4_0 / Q4_K: written, loaded from GGUF, run against the naive reference on the
// dequantised weights. Prefill's projections use F32 activations but its classifier (one row) is
// a mat-vec, so both paths carry int8-activation rounding: measured worst logit error 0.013 /
// 0.019 after prefill and 0.026 / 0.034 after decode (q4_0 / q4_K, 2 layers, dim 256).
TEST(QuantModel, WrittenLoadedAndRun) {
  testing::TempDir dir;
  for (DType type : {DType::Q4_0, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(type));
    RandomModelOptions options;
    options.config.dim = 256;
    options.config.hidden_dim = 512;
    options.config.n_layers = 2;
    options.config.n_heads = 4;
    options.config.n_kv_heads = 2;
    options.config.vocab_size = 300;
    options.config.context_length = 64;
    options.type = type;
    const auto path = (dir / "m.gguf").string();
    write_random_model(options, path);
    const GgufFile file = GgufFile::open(path);
    ASSERT_EQ(file.find_tensor("blk.1.ffn_down.weight")->type, type);
    const ModelWeights weights = weights_from_gguf(file);
    const auto tokens = testing::random_tokens(9, 300, 4);
    const auto expected = testing::reference_logits(weights, tokens);
    Session whole(weights);
    const auto logits = whole.prefill(tokens);
    double worst_prefill = 0, worst_decode = 0;
    Session stepwise(weights);
    stepwise.prefill(std::span<const int32_t>(tokens.data(), 1));
    std::span<const float> last;
    for (size_t i = 1; i < tokens.size(); ++i) last = stepwise.decode(tokens[i]);
    for (size_t i = 0; i < expected.size(); ++i) {
      const double scale = std::max(1.0f, std::fabs(expected[i]));
      worst_prefill = std::max(worst_prefill, std::fabs(logits[i] - expected[i]) / scale);
      worst_decode = std::max(worst_decode, std::fabs(last[i] - expected[i]) / scale);
    }
    EXPECT_LE(worst_prefill, 0.1);
    EXPECT_LE(worst_decode, 0.1);
    std::printf("%s: worst logit error prefill %.2g, int8 decode %.2g\n",
                std::string(dtype_name(type)).c_str(), worst_prefill, worst_decode);
  }
}

// Types without a quantiser are refused before anything is written, with one line.
TEST(QuantModel, WritingTypesWithoutQuantiserFails) {
  testing::TempDir dir;
  RandomModelOptions options;
  options.config.dim = 256;
  options.config.hidden_dim = 512;
  options.config.n_layers = 1;
  options.config.n_heads = 4;
  options.config.n_kv_heads = 2;
  options.config.vocab_size = 300;
  options.config.context_length = 64;
  options.type = DType::Q6_K;
  try {
    write_random_model(options, (dir / "m.gguf").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write q6_K weights"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "m.gguf"));
}

}  // namespace
}  // namespace protokv
