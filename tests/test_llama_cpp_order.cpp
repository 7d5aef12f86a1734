// SPDX-License-Identifier: Apache-2.0
// llama.cpp's arithmetic (kernels/llama_cpp_order.h, kernels::matmul_as_llama_cpp, RopeTable::
// ggml_order): hand-made inputs whose result depends on the summation order, each with its known
// answer per instruction set, random inputs against double-precision references, and the SIMD
// kernels (attention_as_llama_cpp, swiglu_as_llama_cpp) against the portable ggml_order ones. The
// orders themselves were read from ggml-cpu and checked against it (docs/DESIGN.md §llama.cpp's
// arithmetic); tests/test_llama_cpp_oracle.cpp checks whole models against llama.cpp's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernel_reference.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/llama_cpp_order.h"
#include "protokv/dtype.h"

namespace protokv {
namespace {

using kernels::Isa;
using testing::random_vector;
using testing::random_weight;
using testing::TestWeight;

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

// x . y where the only non-zero products are -1 at index `minus_one` and (1 + 2^-12)^2 =
// 1 + 2^-11 + 2^-24 at `at`: rounded to float first that product is 1 + 2^-11, so the sum is
// 2^-11 where ggml adds a rounded product and 2^-11 + 2^-24 where it fuses (an FMA).
float order_probe(Isa isa, int64_t n, int64_t minus_one, int64_t at) {
  std::vector<float> x(static_cast<size_t>(n), 0.0f), y(static_cast<size_t>(n), 0.0f);
  x[minus_one] = 1.0f;
  y[minus_one] = -1.0f;
  x[at] = y[at] = 1.0f + 0x1p-12f;
  return kernels::ggml_order::dot_f32(isa, x.data(), y.data(), n);
}

constexpr float kRounded = 0x1p-11f;
constexpr float kFused = 0x1p-11f + 0x1p-24f;

TEST(GgmlDotF32, LeftoversAddRoundedProductsThenFmasAsGccVectorisesThem) {
  // AVX-512: after the whole 64s, the leftovers' first multiple of 8 add rounded products, the
  // last 0-7 fuse. n = 9: index 8 fuses; n = 8: index 7 is rounded; n = 7: all fuse.
  EXPECT_EQ(order_probe(Isa::kAvx512, 9, 0, 8), kFused);
  EXPECT_EQ(order_probe(Isa::kAvx512, 8, 0, 7), kRounded);
  EXPECT_EQ(order_probe(Isa::kAvx512, 7, 0, 6), kFused);
  EXPECT_EQ(order_probe(Isa::kAvx512, 64 + 9, 64, 64 + 8), kFused);
  // AVX2: multiples of 4, then up to 3 FMAs.
  EXPECT_EQ(order_probe(Isa::kAvx2, 7, 0, 3), kRounded);
  EXPECT_EQ(order_probe(Isa::kAvx2, 7, 0, 4), kFused);
  EXPECT_EQ(order_probe(Isa::kAvx2, 4, 0, 3), kRounded);
  // Without SIMD: float products summed in double.
  EXPECT_EQ(order_probe(Isa::kScalar, 9, 0, 8), kRounded);
}

TEST(GgmlDotF32, WholeStepsReduceAccumulatorsPairwise) {
  // Products 2^24, 1, -2^24, 1 in accumulators s0..s3 (lane 0): (s0 + s2) + (s1 + s3) = 2,
  // where a left-to-right sum gives 1 (2^24 + 1 rounds to 2^24).
  for (const auto& [isa, lanes] : {std::pair{Isa::kAvx512, 16}, std::pair{Isa::kAvx2, 8}}) {
    SCOPED_TRACE(kernels::isa_name(isa));
    const int64_t n = 4 * lanes;
    std::vector<float> x(static_cast<size_t>(n), 0.0f), y(static_cast<size_t>(n), 1.0f);
    x[0] = 0x1p24f;
    x[lanes] = 1.0f;
    x[2 * lanes] = -0x1p24f;
    x[3 * lanes] = 1.0f;
    EXPECT_EQ(kernels::ggml_order::dot_f32(isa, x.data(), y.data(), n), 2.0f);
  }
  std::vector<float> x = {0x1p24f, 1.0f, -0x1p24f, 1.0f}, y(4, 1.0f);
  EXPECT_EQ(kernels::ggml_order::dot_f32(Isa::kScalar, x.data(), y.data(), 4), 2.0f);  // in double
}

TEST(GgmlDotF32, LanesReduceInTheInstructionSetsTree) {
  // One accumulator (the others zero), lanes a = 2^24, b = 1, c = -2^24, d = 1. AVX-512 (GCC's
  // _mm512_reduce_add_ps) adds lane l to lane l + 8 first: a, c at lanes 0, 8 and b, d at 1, 9
  // give (a + c) + (b + d) = 2. AVX2 (GGML_F32x8_REDUCE) adds lane l to l + 4, then two hadds:
  // a, c at lanes 0, 4 and b, d at lanes 1, 5 give (a + c) + (b + d) = 2 too.
  std::vector<float> x(64, 0.0f), y(64, 1.0f);
  x[0] = 0x1p24f, x[8] = -0x1p24f, x[1] = 1.0f, x[9] = 1.0f;
  EXPECT_EQ(kernels::ggml_order::dot_f32(Isa::kAvx512, x.data(), y.data(), 64), 2.0f);
  std::vector<float> x2(32, 0.0f), y2(32, 1.0f);
  x2[0] = 0x1p24f, x2[4] = -0x1p24f, x2[1] = 1.0f, x2[5] = 1.0f;
  EXPECT_EQ(kernels::ggml_order::dot_f32(Isa::kAvx2, x2.data(), y2.data(), 32), 2.0f);
  // a, b, c, d at lanes 0-3: AVX2's hadds give (a + b) + (c + d) = 2^24 + (1 - 2^24) = 1, GCC's
  // AVX-512 tree (a + c) + (b + d) = 2.
  x2 = std::vector<float>(32, 0.0f);
  x2[0] = 0x1p24f, x2[1] = 1.0f, x2[2] = -0x1p24f, x2[3] = 1.0f;
  EXPECT_EQ(kernels::ggml_order::dot_f32(Isa::kAvx2, x2.data(), y2.data(), 32), 1.0f);
  x = std::vector<float>(64, 0.0f);
  x[0] = 0x1p24f, x[1] = 1.0f, x[2] = -0x1p24f, x[3] = 1.0f;
  EXPECT_EQ(kernels::ggml_order::dot_f32(Isa::kAvx512, x.data(), y.data(), 64), 2.0f);
}

TEST(GgmlDotF32, CloseToTheExactSum) {
  std::mt19937 rng(3);
  for (Isa isa : kAllIsas)
    for (int64_t n : {1, 7, 8, 9, 63, 64, 65, 100, 256, 1000}) {
      const auto x = random_vector(rng, n), y = random_vector(rng, n);
      const double exact = testing::ref_dot(x.data(), y.data(), n);
      const double scale = testing::ref_abs_dot(x.data(), y.data(), n);
      EXPECT_NEAR(kernels::ggml_order::dot_f32(isa, x.data(), y.data(), n), exact,
                  1e-6 * scale + 1e-30)
          << kernels::isa_name(isa) << " n=" << n;
    }
}

TEST(GgmlExp, WithinTwoUlpsOfExpAndExactWhereItMustBe) {
  for (Isa isa : kAllIsas) {
    SCOPED_TRACE(kernels::isa_name(isa));
    EXPECT_EQ(kernels::ggml_order::exp(isa, 0.0f), 1.0f);
    EXPECT_EQ(kernels::ggml_order::exp(isa, -std::numeric_limits<float>::infinity()), 0.0f);
    EXPECT_EQ(kernels::ggml_order::exp(isa, -200.0f), 0.0f);
    EXPECT_EQ(kernels::ggml_order::exp(isa, 100.0f), std::numeric_limits<float>::infinity());
    EXPECT_EQ(kernels::ggml_order::exp(isa, 200.0f), std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(kernels::ggml_order::exp(isa, std::numeric_limits<float>::quiet_NaN())));
    double worst = 0.0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
      const double want = std::exp(static_cast<double>(x));
      const double got = kernels::ggml_order::exp(isa, x);
      worst = std::max(worst, std::fabs(got - want) / want);
    }
    EXPECT_LT(worst, 2.5e-7);  // two float ulps
  }
  // The SIMD forms are ggml_v_expf's polynomial, not a correctly rounded exp: somewhere they
  // differ from expf (which a build without SIMD calls), and from each other in the subnormals.
  int differ = 0;
  for (float x = -10.0f; x <= 10.0f; x += 0.001f)
    differ += kernels::ggml_order::exp(Isa::kAvx512, x) != std::exp(x) ? 1 : 0;
  EXPECT_GT(differ, 0);
  EXPECT_NE(kernels::ggml_order::exp(Isa::kAvx512, -100.0f),
            0.0f);  // 2^-144: scalef keeps subnormals
}

TEST(GgmlSwiglu, SiluTimesUpWithTheVectorExpOnWholeVectors) {
  std::mt19937 rng(5);
  for (Isa isa : kAllIsas) {
    const int64_t n = 37;  // two vectors of 16 (AVX-512), four of 8 (AVX2), and leftovers
    const auto gate = random_vector(rng, n, 3.0f), up = random_vector(rng, n);
    std::vector<float> out = gate;
    kernels::ggml_order::swiglu(isa, out.data(), up.data(), n);
    const int lanes = isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 0;
    const int64_t whole = lanes == 0 ? 0 : n / lanes * lanes;
    for (int64_t i = 0; i < n; ++i) {
      const float x = gate[i];
      const float e = i < whole ? kernels::ggml_order::exp(isa, -x) : std::exp(-x);
      const float silu = x / (1.0f + e);
      EXPECT_EQ(out[i], silu * up[i]) << kernels::isa_name(isa) << " " << i;
      EXPECT_NEAR(out[i], x / (1.0 + std::exp(-static_cast<double>(x))) * up[i], 1e-5);
    }
  }
}

TEST(AttentionAsLlamaCpp, KnownAnswersAndTheReference) {
  std::mt19937 rng(9);
  for (Isa isa : kAllIsas) {
    SCOPED_TRACE(kernels::isa_name(isa));
    const int d = 8;
    // One entry: its value, exactly.
    const auto q = random_vector(rng, d), k = random_vector(rng, d), v = random_vector(rng, d);
    std::vector<float> out(d);
    kernels::ggml_order::attention(isa, q.data(), k.data(), v.data(), 1, d, 0.35f, false,
                                   out.data());
    EXPECT_EQ(out, v);
    // Two equal keys: half of each value, exactly (halves and one sum of two floats).
    std::vector<float> keys2 = k;
    keys2.insert(keys2.end(), k.begin(), k.end());
    std::vector<float> values2 = {1, 2, 3, 4, 5, 6, 7, 8, 3, 2, 1, 0, -1, -2, -3, -4};
    for (bool batched : {false, true}) {
      kernels::ggml_order::attention(isa, q.data(), keys2.data(), values2.data(), 2, d, 0.35f,
                                     batched, out.data());
      EXPECT_EQ(out, (std::vector<float>{2, 2, 2, 2, 2, 2, 2, 2}));
    }
    // Random entries against double precision.
    for (int64_t n : {3, 17, 100, 300}) {
      for (int width : {8, 64, 72}) {
        const auto query = random_vector(rng, width);
        const auto keys = random_vector(rng, n * width), values = random_vector(rng, n * width);
        const std::vector<double> want = testing::ref_decode_attention(
            query.data(), keys.data(), values.data(), nullptr, n, width, nullptr);
        std::vector<float> got(static_cast<size_t>(width));
        for (bool batched : {false, true}) {
          kernels::ggml_order::attention(isa, query.data(), keys.data(), values.data(), n, width,
                                         1.0f / std::sqrt(static_cast<float>(width)), batched,
                                         got.data());
          for (int i = 0; i < width; ++i)
            EXPECT_NEAR(got[i], want[i], 2e-5) << "n=" << n << " d=" << width << " " << i;
        }
      }
    }
  }
}

TEST(AttentionAsLlamaCpp, BatchedQueriesSumValuesInTinyBlasOrder) {
  // The value sums of a batch (tinyBLAS: one 16- or 8-lane accumulator) and of one query
  // (ggml_vec_dot_f32: four) differ in rounding for some inputs on SIMD builds, and never
  // without SIMD (no tinyBLAS there).
  std::mt19937 rng(12);
  for (Isa isa : kAllIsas) {
    int differ = 0;
    for (int trial = 0; trial < 20; ++trial) {
      const int d = 64, n = 200;
      const auto q = random_vector(rng, d), k = random_vector(rng, n * d);
      const auto v = random_vector(rng, n * d);
      std::vector<float> one(d), batch(d);
      kernels::ggml_order::attention(isa, q.data(), k.data(), v.data(), n, d, 0.125f, false,
                                     one.data());
      kernels::ggml_order::attention(isa, q.data(), k.data(), v.data(), n, d, 0.125f, true,
                                     batch.data());
      differ += one != batch ? 1 : 0;
    }
    if (isa == Isa::kScalar)
      EXPECT_EQ(differ, 0);
    else
      EXPECT_GT(differ, 0) << kernels::isa_name(isa);
  }
}

// `x` rounded to F16 values (as the floats they are): what an F16 cache holds.
std::vector<float> f16_values(std::vector<float> x) {
  for (float& value : x) value = f16_to_f32(f32_to_f16(value));
  return x;
}

kernels::LlamaCppFlashAttention flash_how(int64_t batch_rows, bool f16_keys, bool f16_values) {
  kernels::LlamaCppFlashAttention how;
  how.batch_rows = batch_rows;
  how.f16_keys = f16_keys;
  how.f16_values = f16_values;
  return how;
}

TEST(FlashAttentionAsLlamaCpp, KnownAnswersAndTheReference) {
  std::mt19937 rng(23);
  for (Isa isa : kAllIsas) {
    SCOPED_TRACE(kernels::isa_name(isa));
    for (int64_t batch_rows : {1, 64})
      for (bool f16 : {false, true}) {
        const auto how = flash_how(batch_rows, f16, f16);
        const int d = 16;
        const auto q = random_vector(rng, d);
        const auto k = f16_values(random_vector(rng, d)), v = f16_values(random_vector(rng, d));
        std::vector<float> out(d);
        // One entry: its value, exactly.
        kernels::ggml_order::flash_attention(isa, q.data(), k.data(), v.data(), 1, d, 0.35f, how,
                                             out.data());
        EXPECT_EQ(out, v);
        // Two equal keys: the mean of the values, exactly.
        std::vector<float> keys2 = k;
        keys2.insert(keys2.end(), k.begin(), k.end());
        std::vector<float> values2(2 * d);
        for (int i = 0; i < 2 * d; ++i) values2[i] = static_cast<float>(i % d) - (i < d ? 0 : 4);
        kernels::ggml_order::flash_attention(isa, q.data(), keys2.data(), values2.data(), 2, d,
                                             0.35f, how, out.data());
        for (int i = 0; i < d; ++i) EXPECT_EQ(out[i], static_cast<float>(i) - 2.0f) << i;
        // Random entries (F16 ones where the cache is F16) against double precision.
        for (int64_t n : {3, 63, 64, 65, 300}) {
          for (int width : {8, 64, 72}) {
            const auto query = random_vector(rng, width);
            auto keys = random_vector(rng, n * width), values = random_vector(rng, n * width);
            if (f16) keys = f16_values(keys), values = f16_values(values);
            const std::vector<double> want = testing::ref_decode_attention(
                query.data(), keys.data(), values.data(), nullptr, n, width, nullptr);
            std::vector<float> got(static_cast<size_t>(width));
            kernels::ggml_order::flash_attention(isa, query.data(), keys.data(), values.data(), n,
                                                 width, 1.0f / std::sqrt(static_cast<float>(width)),
                                                 how, got.data());
            // An F16 output accumulator keeps 11 bits through every step.
            const double tolerance =
                f16 && !kernels::ggml_order::flash_attention_is_tiled(isa, how, width) ? 2e-2
                                                                                       : 2e-5;
            for (int i = 0; i < width; ++i)
              EXPECT_NEAR(got[i], want[i], tolerance) << "n=" << n << " d=" << width << " " << i;
          }
        }
      }
  }
}

TEST(FlashAttentionAsLlamaCpp, OneChunkRoundsItsF16AccumulatorTheTiledPathDoesNot) {
  // Values 1 and 2^-11 under equal keys: the F16 accumulator of the one-chunk path keeps
  // 1 + 2^-11 as 1 (a tie, to even), so the mean is 1/2; F32 values, or the tiled path (which
  // reads F16 K/V as F32), keep (1 + 2^-11) / 2.
  const int d = 16;
  std::vector<float> q(d, 0.5f), keys(2 * d, 0.25f), values(2 * d, 0.0f);
  values[0] = 1.0f;
  values[d] = 0x1p-11f;
  for (Isa isa : kAllIsas) {
    SCOPED_TRACE(kernels::isa_name(isa));
    std::vector<float> out(d);
    const auto first = [&](int64_t batch_rows, bool f16_keys, bool f16_values) {
      kernels::ggml_order::flash_attention(isa, q.data(), keys.data(), values.data(), 2, d, 1.0f,
                                           flash_how(batch_rows, f16_keys, f16_values), out.data());
      return out[0];
    };
    EXPECT_EQ(first(1, false, true), 0.5f);
    EXPECT_EQ(first(1, true, true), 0.5f);
    EXPECT_EQ(first(1, false, false), 0.5f + 0x1p-12f);
    EXPECT_EQ(first(1, true, false), 0.5f + 0x1p-12f);
    EXPECT_EQ(first(64, true, true), 0.5f + 0x1p-12f);
    EXPECT_EQ(first(64, false, true), 0.5f);  // K and V of two types: one chunk
    EXPECT_TRUE(kernels::ggml_order::flash_attention_is_tiled(isa, flash_how(64, true, true), d));
    EXPECT_FALSE(kernels::ggml_order::flash_attention_is_tiled(isa, flash_how(63, true, true), d));
  }
  // With SIMD the tiled path needs a head width that is a multiple of the vector's lanes.
  EXPECT_FALSE(kernels::ggml_order::flash_attention_is_tiled(Isa::kAvx512, flash_how(64, 0, 0), 8));
  EXPECT_TRUE(kernels::ggml_order::flash_attention_is_tiled(Isa::kAvx2, flash_how(64, 0, 0), 8));
  EXPECT_TRUE(kernels::ggml_order::flash_attention_is_tiled(Isa::kScalar, flash_how(64, 0, 0), 6));
}

TEST(FlashAttentionAsLlamaCpp, QueryRoundedToF16ForF16Keys) {
  // q0 = 1 + 2^-12 rounds to 1 in F16: with F16 keys the score of key e0 is 1 (weight e^1 against
  // e^0), with F32 keys 1 + 2^-12.
  const int d = 8;
  std::vector<float> q(d, 0.0f), keys(2 * d, 0.0f), values(2 * d, 0.0f);
  q[0] = 1.0f + 0x1p-12f;
  keys[0] = 1.0f;
  values[0] = 1.0f;
  for (Isa isa : kAllIsas) {
    std::vector<float> rounded(d), exact(d);
    kernels::ggml_order::flash_attention(isa, q.data(), keys.data(), values.data(), 2, d, 1.0f,
                                         flash_how(1, true, false), rounded.data());
    kernels::ggml_order::flash_attention(isa, q.data(), keys.data(), values.data(), 2, d, 1.0f,
                                         flash_how(1, false, false), exact.data());
    const double e = std::exp(1.0);
    EXPECT_NEAR(rounded[0], e / (e + 1), 1e-6) << kernels::isa_name(isa);
    EXPECT_NE(rounded[0], exact[0]) << kernels::isa_name(isa);
  }
}

// The SIMD kernels compute their instruction set's portable reference, to the bit.
TEST(FlashAttentionAsLlamaCpp, SimdKernelsEqualThePortableOrder) {
  std::mt19937 rng(29);
  for (Isa isa : kernels::available_isas()) {
    SCOPED_TRACE(kernels::isa_name(isa));
    for (int64_t n : {1, 5, 63, 64, 65, 130, 300})
      for (int d : {8, 12, 16, 64, 72, 128})
        for (int64_t batch_rows : {1, 64})
          for (int f16 = 0; f16 < 4; ++f16) {
            const auto how = flash_how(batch_rows, (f16 & 1) != 0, (f16 & 2) != 0);
            const auto q = random_vector(rng, d, 2.0f);
            const auto k = random_vector(rng, n * d), v = random_vector(rng, n * d);
            std::vector<float> fast(static_cast<size_t>(d)), portable(static_cast<size_t>(d));
            const float scale = 1.0f / std::sqrt(static_cast<float>(d));
            // F32 rows (read rounded to F16 where `how` says), and F16 rows as a cache holds them.
            kernels::flash_attention_as_llama_cpp(isa, q.data(), k.data(), v.data(), n, d, scale,
                                                  how, fast.data());
            kernels::ggml_order::flash_attention(isa, q.data(), k.data(), v.data(), n, d, scale,
                                                 how, portable.data());
            EXPECT_EQ(fast, portable)
                << "n=" << n << " d=" << d << " rows=" << batch_rows << " f16=" << f16;
            if (how.f16_keys && how.f16_values) {
              std::vector<uint16_t> k16(k.size()), v16(v.size());
              for (size_t i = 0; i < k.size(); ++i) {
                k16[i] = f32_to_f16(k[i]);
                v16[i] = f32_to_f16(v[i]);
              }
              kernels::flash_attention_as_llama_cpp(
                  isa, q.data(), ValueRows(k16.data(), DType::F16),
                  ValueRows(v16.data(), DType::F16), n, d, scale, how, fast.data());
              EXPECT_EQ(fast, portable) << "F16 rows n=" << n << " d=" << d;
            }
          }
    for (int64_t n : {257, 300, 511, 512, 777, 1300})  // decode steps split over threads
      for (int d : {8, 64, 72})
        for (int threads : {2, 3, 7}) {
          auto how = flash_how(1, true, true);
          how.threads = threads;
          const auto q = random_vector(rng, d, 2.0f);
          const auto k = random_vector(rng, n * d), v = random_vector(rng, n * d);
          std::vector<float> fast(static_cast<size_t>(d)), portable(static_cast<size_t>(d));
          kernels::flash_attention_as_llama_cpp(isa, q.data(), k.data(), v.data(), n, d, 0.125f,
                                                how, fast.data());
          kernels::ggml_order::flash_attention(isa, q.data(), k.data(), v.data(), n, d, 0.125f, how,
                                               portable.data());
          EXPECT_EQ(fast, portable) << "n=" << n << " d=" << d << " threads=" << threads;
        }
  }
}

// A block of causal rows (prefill's call: row r over n_first + r entries) gives each row the
// one-row result, on both paths, from F32 and from F16 rows.
TEST(FlashAttentionAsLlamaCpp, RowBlocksEqualOneRowAtATime) {
  std::mt19937 rng(37);
  // F16 rows, F32 rows read as F16 (llama.cpp's cast), F32 rows as they are, and K/V of two
  // types (no tiled path).
  struct Rows {
    bool f16_storage, f16_keys, f16_values;
  };
  for (Isa isa : kernels::available_isas()) {
    SCOPED_TRACE(kernels::isa_name(isa));
    for (int d : {8, 64, 72})
      for (int64_t rows : {1, 5, 64})
        for (int64_t n_first : {1, 40, 130})
          for (int64_t batch_rows : {rows, int64_t{512}})
            for (const Rows kind : {Rows{true, true, true}, Rows{false, true, true},
                                    Rows{false, false, false}, Rows{false, true, false}}) {
              const int64_t n = n_first + rows - 1;
              // Rows of wider tensors, as prefill's heads, with strides of their own.
              const int64_t q_stride = 3 * d, out_stride = 2 * d;
              const auto q = random_vector(rng, rows * q_stride, 2.0f);
              const auto k = random_vector(rng, n * d), v = random_vector(rng, n * d);
              std::vector<uint16_t> k16(k.size()), v16(v.size());
              for (size_t i = 0; i < k.size(); ++i) {
                k16[i] = f32_to_f16(k[i]);
                v16[i] = f32_to_f16(v[i]);
              }
              const ValueRows keys =
                  kind.f16_storage ? ValueRows(k16.data(), DType::F16) : k.data();
              const ValueRows values =
                  kind.f16_storage ? ValueRows(v16.data(), DType::F16) : v.data();
              const auto how = flash_how(batch_rows, kind.f16_keys, kind.f16_values);
              std::vector<float> block(static_cast<size_t>(rows * out_stride), -1.0f);
              kernels::flash_attention_as_llama_cpp(isa, q.data(), q_stride, rows, keys, values,
                                                    n_first, d, 0.125f, how, block.data(),
                                                    out_stride);
              std::vector<float> one(static_cast<size_t>(d));
              for (int64_t r = 0; r < rows; ++r) {
                kernels::ggml_order::flash_attention(isa, q.data() + r * q_stride, k.data(),
                                                     v.data(), n_first + r, d, 0.125f, how,
                                                     one.data());
                const auto got = block.begin() + r * out_stride;
                EXPECT_EQ(std::vector<float>(got, got + d), one)
                    << "d=" << d << " rows=" << rows << " n_first=" << n_first
                    << " batch=" << batch_rows << " f16 storage=" << kind.f16_storage
                    << " f16 keys=" << kind.f16_keys << " values=" << kind.f16_values << " r=" << r;
                EXPECT_EQ(got[d], -1.0f);  // untouched
              }
            }
  }
}

// llama.cpp's thread count splits a decode step's cells (padded to 256) once they reach 512: the
// split's size, and a result that depends on the threads there and nowhere else.
TEST(FlashAttentionAsLlamaCpp, DecodeOver512CellsSplitsOverLlamaCppsThreads) {
  auto how = flash_how(1, true, true);
  how.threads = 2;
  EXPECT_EQ(kernels::ggml_order::flash_attention_split(how, 256), 0);     // 256 cells
  EXPECT_EQ(kernels::ggml_order::flash_attention_split(how, 257), 256);   // 512 cells
  EXPECT_EQ(kernels::ggml_order::flash_attention_split(how, 1000), 512);  // 1024 cells
  how.threads = 3;
  EXPECT_EQ(kernels::ggml_order::flash_attention_split(how, 600), 256);  // 768 cells
  how.threads = 1;
  EXPECT_EQ(kernels::ggml_order::flash_attention_split(how, 600), 0);
  auto batch = flash_how(2, true, true);  // a ubatch of two rows never splits
  batch.threads = 2;
  EXPECT_EQ(kernels::ggml_order::flash_attention_split(batch, 600), 0);
  auto mixed = flash_how(1, true, false);  // nor K and V of two types
  mixed.threads = 2;
  EXPECT_EQ(kernels::ggml_order::flash_attention_split(mixed, 600), 0);
  std::mt19937 rng(31);
  const int d = 64;
  for (Isa isa : kAllIsas) {
    SCOPED_TRACE(kernels::isa_name(isa));
    int differ = 0;
    for (int trial = 0; trial < 10; ++trial) {
      for (int64_t n : {200, 600}) {
        const auto q = random_vector(rng, d, 2.0f);
        const auto k = random_vector(rng, n * d), v = random_vector(rng, n * d);
        std::vector<float> one(d), split(d);
        auto threads = flash_how(1, true, true);
        kernels::ggml_order::flash_attention(isa, q.data(), k.data(), v.data(), n, d, 0.125f,
                                             threads, one.data());
        threads.threads = 4;
        kernels::ggml_order::flash_attention(isa, q.data(), k.data(), v.data(), n, d, 0.125f,
                                             threads, split.data());
        if (n <= 256) {
          EXPECT_EQ(one, split);
        } else {
          differ += one != split ? 1 : 0;
          for (int i = 0; i < d; ++i) EXPECT_NEAR(one[i], split[i], 2e-2) << i;
        }
      }
    }
    EXPECT_GT(differ, 0);
  }
}

// The SIMD kernels compute their instruction set's portable reference, to the bit.
TEST(AttentionAsLlamaCpp, SimdKernelsEqualThePortableOrder) {
  std::mt19937 rng(17);
  for (Isa isa : kernels::available_isas()) {
    SCOPED_TRACE(kernels::isa_name(isa));
    for (int64_t n : {1, 5, 16, 17, 64, 100, 300})
      for (int d : {8, 12, 64, 72, 128})
        for (bool batched : {false, true}) {
          const auto q = random_vector(rng, d, 2.0f), k = random_vector(rng, n * d);
          const auto v = random_vector(rng, n * d);
          std::vector<float> fast(static_cast<size_t>(d)), portable(static_cast<size_t>(d));
          const float scale = 1.0f / std::sqrt(static_cast<float>(d));
          kernels::attention_as_llama_cpp(isa, q.data(), k.data(), v.data(), n, d, scale, batched,
                                          fast.data());
          kernels::ggml_order::attention(isa, q.data(), k.data(), v.data(), n, d, scale, batched,
                                         portable.data());
          EXPECT_EQ(fast, portable) << "n=" << n << " d=" << d << " batched=" << batched;
        }
    for (int64_t n : {1, 7, 16, 37, 1536}) {
      auto gate = random_vector(rng, n, 4.0f);
      // exp(120): 2^173, a finite scalef; exp(140), exp(-200): the saturated blends (|n| > 192),
      // then infinities and a NaN.
      const float specials[] = {-120.0f,
                                -140.0f,
                                200.0f,
                                -90.0f,
                                88.0f,
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN()};
      for (size_t s = 0; s < std::size(specials); ++s) gate[(s * 5) % n] = specials[s];
      const auto up = random_vector(rng, n);
      std::vector<float> fast = gate, portable = gate;
      kernels::swiglu_as_llama_cpp(isa, fast.data(), up.data(), n);
      kernels::ggml_order::swiglu(isa, portable.data(), up.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(portable[i])) {
          EXPECT_TRUE(std::isnan(fast[i])) << "swiglu n=" << n << " " << i;
        } else {
          EXPECT_EQ(fast[i], portable[i]) << "swiglu n=" << n << " " << i << " x=" << gate[i];
        }
      }
    }
  }
}

TEST(RopeAsGgml, AnglesMultipliedUpInFloatAndFusedRotation) {
  std::mt19937 rng(21);
  const int head_dim = 64, n_heads = 3;
  for (bool neox : {false, true}) {
    const kernels::RopeTable exact =
        kernels::make_rope_table(head_dim, head_dim, 10000.0f, neox, 1.0f, nullptr, false);
    const kernels::RopeTable ggml =
        kernels::make_rope_table(head_dim, head_dim, 10000.0f, neox, 1.0f, nullptr, true);
    const auto x = random_vector(rng, n_heads * head_dim);
    int differ = 0;
    for (int32_t pos : {0, 1, 7, 500, 4000}) {
      std::vector<float> a = x, b = x;
      kernels::rope_rows(a.data(), 1, 0, n_heads, exact, &pos);
      kernels::rope_rows(b.data(), 1, 0, n_heads, ggml, &pos);
      if (pos == 0) {
        EXPECT_EQ(b, x);  // angle 0: cos 1, sin 0, x0 * 1 - x1 * 0
      }
      // Pair 1 of head 0 at this position, written out as ggml computes it.
      const float theta_scale = std::pow(10000.0f, -2.0f / head_dim);
      const float angle = static_cast<float>(pos) * theta_scale;
      const float c = std::cos(angle), s = std::sin(angle);
      const int i0 = neox ? 1 : 2, i1 = neox ? 1 + head_dim / 2 : 3;
      const float x1s = x[i1] * s, x1c = x[i1] * c;
      EXPECT_EQ(b[i0], std::fma(x[i0], c, -x1s));
      EXPECT_EQ(b[i1], std::fma(x[i0], s, x1c));
      for (size_t i = 0; i < a.size(); ++i) {
        // float angles lose about pos * 2^-24 radians against double ones
        EXPECT_NEAR(a[i], b[i], 1e-6 * (1 + pos)) << pos << " " << i;
        differ += a[i] != b[i] ? 1 : 0;
      }
    }
    EXPECT_GT(differ, 0);
  }
}

// tinyBLAS's order for one (row, token): a `lanes`-lane FMA accumulator, then its horizontal sum
// (GCC's _mm512_reduce_add_ps for 16 lanes; the AVX2 hsum for 8).
float tinyblas_emulation(int lanes, const float* w, const float* x, int64_t n) {
  std::vector<float> acc(static_cast<size_t>(lanes), 0.0f);
  for (int64_t i = 0; i < n; ++i) acc[i % lanes] = std::fma(w[i], x[i], acc[i % lanes]);
  for (int width = lanes / 2; width >= 4; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] = acc[l + width] + acc[l];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

TEST(MatmulAsLlamaCpp, TinyBlasOrderWhereItsShapesAllowElseVecDot) {
  std::mt19937 rng(31);
  for (Isa isa : kernels::available_isas()) {
    const int lanes = isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 0;
    for (DType type : {DType::F32, DType::F16}) {
      for (const auto& [rows, cols] : {std::pair{8, 64}, std::pair{6, 64}, std::pair{8, 40}}) {
        SCOPED_TRACE(::testing::Message() << kernels::isa_name(isa) << " " << dtype_name(type)
                                          << " " << rows << "x" << cols);
        const TestWeight w = random_weight(rng, type, rows, cols);
        const int64_t n = 3;
        const auto x = random_vector(rng, n * cols);
        std::vector<float> y(static_cast<size_t>(n * rows));
        kernels::matmul_as_llama_cpp(isa, w.matrix, x.data(), n, y.data(), /*batched=*/true);
        const bool tinyblas = lanes > 0 && cols % lanes == 0 && rows % 4 == 0;
        const std::vector<double> exact = testing::ref_matmul(w, x.data(), n);
        for (int64_t i = 0; i < n; ++i)
          for (int r = 0; r < rows; ++r) {
            std::vector<float> weights(static_cast<size_t>(cols)), xi(static_cast<size_t>(cols));
            kernels::weight_row_to_f32(isa, type, w.matrix.row(r), weights.data(), cols);
            for (int c = 0; c < cols; ++c)  // F16 rows meet the activation rounded to F16
              xi[c] =
                  type == DType::F16 ? f16_to_f32(f32_to_f16(x[i * cols + c])) : x[i * cols + c];
            const float got = y[i * rows + r];
            if (tinyblas) {
              EXPECT_EQ(got, tinyblas_emulation(lanes, weights.data(), xi.data(), cols));
            } else if (type == DType::F32) {
              EXPECT_EQ(got, kernels::ggml_order::dot_f32(isa, weights.data(), xi.data(), cols));
            }
            // F16 activations: 2^-11 relative each
            const double bound = testing::ref_abs_dot(weights.data(), x.data() + i * cols, cols);
            EXPECT_NEAR(got, exact[i * rows + r], 1e-3 * bound);
          }
        // One row is a decode step: ggml_vec_dot's order.
        std::vector<float> one(static_cast<size_t>(rows));
        kernels::matmul_as_llama_cpp(isa, w.matrix, x.data(), 1, one.data(), /*batched=*/false);
        if (type == DType::F32) {
          for (int r = 0; r < rows; ++r)
            EXPECT_EQ(one[r], kernels::ggml_order::dot_f32(
                                  isa, static_cast<const float*>(w.matrix.row(r)), x.data(), cols));
        }
      }
    }
  }
}

}  // namespace
}  // namespace protokv
