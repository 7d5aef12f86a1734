// SPDX-License-Identifier: Apache-2.0
// Element-wise kernels (dot, exp, softmax, RMSNorm, RoPE) against naive references, for every
// compiled instruction-set variant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "kernel_reference.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/quant_matvec.h"
#include "protokv/error.h"
#include "test_util.h"

namespace protokv::kernels {
namespace {

using protokv::testing::random_vector;
using protokv::testing::ref_abs_dot;
using protokv::testing::ref_dot;
using protokv::testing::ref_softmax;

const std::vector<int64_t> kLengths = {0, 1, 2, 7, 8, 15, 16, 17, 33, 64, 100, 300, 1000, 4099};

TEST(Kernels, AvailableIsasStartWithScalarAndEndWithTheActiveOne) {
  const std::vector<Isa> isas = available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::kScalar);
  // Unless PROTOKV_ISA chose another (the PythonPackage_scalar test does), the widest one runs.
  const char* requested = std::getenv("PROTOKV_ISA");
  if (requested == nullptr || *requested == '\0') {
    EXPECT_EQ(isas.back(), active_isa());
  }
#if defined(__x86_64__)
  // Every x86-64 build carries all three variants; this CPU runs AVX2 at least (CI's do).
  EXPECT_GE(isas.size(), 2u);
#endif
}

// An error thrown inside a kernel variant (whose object keeps its own local copy of
// protokv::Error's type information, CMakeLists.txt) is caught as protokv::Error outside it.
TEST(Kernels, AnErrorInsideAVariantIsAProtokvError) {
  const QuantizedActivation x;
  const float row[32] = {};
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    EXPECT_THROW(legacy_quant_dot(isa, DType::F32, row, x, 32), Error);
  }
}

// PROTOKV_ISA picks any variant this CPU runs, end to end; one it cannot run is one clear line.
TEST(Kernels, ProtokvIsaRunsEveryAvailableVariantAndRefusesTheOthers) {
  const std::string model =
      (std::filesystem::path(PROTOKV_SOURCE_DIR) / "models" / "protokv-recall.gguf").string();
  const std::vector<Isa> available = available_isas();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const std::string name(isa_name(isa));
    SCOPED_TRACE(name);
    const testing::CommandResult r = testing::run_protokv(
        "generate -m '" + model + "' -p 'the key is' -n 2 --temp 0", "PROTOKV_ISA=" + name);
    if (std::find(available.begin(), available.end(), isa) != available.end()) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_FALSE(r.out.empty());
    } else {
      testing::expect_one_line_error(r, "PROTOKV_ISA=" + name + ": this CPU cannot run it");
    }
  }
}

TEST(Kernels, DotMatchesDoubleReference) {
  std::mt19937 rng(1);
  for (Isa isa : available_isas()) {
    for (int64_t n : kLengths) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " n=" << n);
      const auto a = random_vector(rng, n), b = random_vector(rng, n);
      const double expected = ref_dot(a.data(), b.data(), n);
      // F32 accumulation error stays far below the size of one term (~abs_dot / n).
      const double tolerance = 1e-5 * ref_abs_dot(a.data(), b.data(), n) + 1e-7;
      EXPECT_NEAR(dot(isa, a.data(), b.data(), n), expected, tolerance);
    }
  }
  const auto a = random_vector(rng, 77), b = random_vector(rng, 77);
  EXPECT_NEAR(dot(a.data(), b.data(), 77), ref_dot(a.data(), b.data(), 77), 1e-4);
}

TEST(Kernels, VectorExpIsAccurateOverTheFloatRange) {
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    for (double x = -87.0; x <= 88.0; x += 0.01721) {
      const double expected = std::exp(x);
      const double got = vector_exp(isa, static_cast<float>(x));
      // Relative to exp of the float input (the rounding of x itself is not the kernel's).
      const double exact = std::exp(static_cast<double>(static_cast<float>(x)));
      ASSERT_NEAR(got / exact, 1.0, 1e-6) << "x=" << x << " expected " << expected;
    }
    EXPECT_EQ(vector_exp(isa, -std::numeric_limits<float>::infinity()), 0.0f);
    EXPECT_EQ(vector_exp(isa, -200.0f), 0.0f);
    EXPECT_EQ(vector_exp(isa, 0.0f), 1.0f);
  }
}

TEST(Kernels, SoftmaxMatchesReferenceAndSumsToOne) {
  std::mt19937 rng(2);
  for (Isa isa : available_isas()) {
    for (int64_t n : kLengths) {
      if (n == 0) continue;
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " n=" << n);
      auto x = random_vector(rng, n, 3.0f);
      const auto expected = ref_softmax(std::vector<double>(x.begin(), x.end()));
      softmax(isa, x.data(), n);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(x[i], expected[i], 1e-6 * expected[i] + 1e-9);
        sum += x[i];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

TEST(Kernels, SoftmaxOfExtremeLogitsIsFinite) {
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<float> x = {1e30f, -1e30f, 0.0f,  1e30f,  -std::numeric_limits<float>::infinity(),
                            3e38f, -3e38f, 88.0f, -88.0f, 1e-30f,
                            1e4f,  -1e4f,  5.0f,  6.0f,   7.0f,
                            8.0f,  9.0f,   10.0f};
    softmax(isa, x.data(), static_cast<int64_t>(x.size()));
    double sum = 0;
    for (float v : x) {
      EXPECT_TRUE(std::isfinite(v));
      EXPECT_GE(v, 0.0f);
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_FLOAT_EQ(x[5], 1.0f);  // 3e38 dominates everything else

    std::vector<float> tiny(40, -1e30f);
    tiny[17] = -1e30f + 1e24f;  // the largest by far
    softmax(isa, tiny.data(), 40);
    EXPECT_FLOAT_EQ(tiny[17], 1.0f);

    std::vector<float> all_masked(5, -std::numeric_limits<float>::infinity());
    softmax(isa, all_masked.data(), 5);
    for (float v : all_masked) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Kernels, RmsnormMatchesReferenceAndMayAlias) {
  std::mt19937 rng(3);
  for (Isa isa : available_isas()) {
    for (int64_t n : {1, 7, 16, 33, 300, 4096}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " n=" << n);
      auto x = random_vector(rng, n, 2.0f);
      const auto weight = random_vector(rng, n);
      const float eps = 1e-5f;
      const double rms = std::sqrt(ref_dot(x.data(), x.data(), n) / n + eps);
      std::vector<float> out(static_cast<size_t>(n));
      rmsnorm(isa, out.data(), x.data(), weight.data(), n, eps);
      for (int64_t i = 0; i < n; ++i) {
        const double expected = x[i] / rms * weight[i];
        ASSERT_NEAR(out[i], expected, 2e-6 * std::fabs(expected) + 1e-7);
      }
      rmsnorm(isa, x.data(), x.data(), weight.data(), n, eps);  // in place
      EXPECT_EQ(x, out);
    }
  }
}

// RMSNorm rounds as ggml's rms_norm: squares in float summed in double in index order, the mean
// rounded to float, x * (1 / sqrt(mean + eps)) * weight in float (a float sum of the squares, as
// before, rounds the mean differently in most of these rows). Every third value is scaled down by
// up to 2^-24, so that the squares span many binades.
TEST(Kernels, RmsnormRoundsAsGgml) {
  std::mt19937 rng(5);
  for (Isa isa : available_isas()) {
    for (int64_t n : {1, 64, 576, 4099}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " n=" << n);
      auto x = random_vector(rng, n, 2.0f);
      for (int64_t i = 0; i < n; i += 3) x[i] *= std::ldexp(1.0f, -static_cast<int>(i % 25));
      const auto weight = random_vector(rng, n);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
      const auto mean = static_cast<float>(sum / static_cast<double>(n));
      const float scale = 1.0f / std::sqrt(mean + 1e-6f);
      std::vector<float> out(static_cast<size_t>(n));
      rmsnorm(isa, out.data(), x.data(), weight.data(), n, 1e-6f);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] * scale * weight[i]) << i;
    }
  }
}

TEST(Kernels, RmsnormRowsNormalisesEachRow) {
  std::mt19937 rng(4);
  const int64_t rows = 37, n = 2048;  // enough work to take the parallel path
  auto x = random_vector(rng, rows * n);
  const auto weight = random_vector(rng, n);
  std::vector<float> out(x.size()), row(static_cast<size_t>(n));
  rmsnorm_rows(out.data(), x.data(), weight.data(), rows, n, 1e-6f);
  for (int64_t r = 0; r < rows; ++r) {
    rmsnorm(row.data(), x.data() + r * n, weight.data(), n, 1e-6f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[r * n + i], row[i]);
  }
}

// Pair i of a head turns by pos * theta^(-2i/d): a unit vector along the pair's first axis ends
// at (cos, sin) of that angle.
TEST(Kernels, RopeRotatesEachPairByItsFrequency) {
  const int head_dim = 8, n_heads = 2;
  const float theta = 10000.0f;
  for (bool neox : {false, true}) {
    SCOPED_TRACE(neox ? "neox" : "normal");
    const int half = head_dim / 2;
    auto first = [&](int i) { return neox ? i : 2 * i; };
    auto second = [&](int i) { return neox ? i + half : 2 * i + 1; };
    std::vector<float> x(n_heads * head_dim, 0.0f);
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < half; ++i) x[h * head_dim + first(i)] = 1.0f + h;

    std::vector<float> at_zero = x;
    rope(at_zero.data(), n_heads, head_dim, 0, theta, neox);
    EXPECT_EQ(at_zero, x);  // position 0 is the identity

    for (int32_t pos : {1, 5, 1000}) {
      std::vector<float> y = x;
      rope(y.data(), n_heads, head_dim, pos, theta, neox);
      for (int h = 0; h < n_heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const double angle = pos * std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
          EXPECT_NEAR(y[h * head_dim + first(i)], (1.0 + h) * std::cos(angle), 1e-5);
          EXPECT_NEAR(y[h * head_dim + second(i)], (1.0 + h) * std::sin(angle), 1e-5);
        }
      }
    }
  }
}

TEST(Kernels, RopeNeoxAndNormalOrdersAreThePermutedSameRotation) {
  std::mt19937 rng(5);
  const int head_dim = 64, n_heads = 3;
  auto x = random_vector(rng, n_heads * head_dim);
  // Interleaved (2i, 2i+1) layout -> split (i, i + d/2) layout.
  std::vector<float> split(x.size());
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < head_dim / 2; ++i) {
      split[h * head_dim + i] = x[h * head_dim + 2 * i];
      split[h * head_dim + i + head_dim / 2] = x[h * head_dim + 2 * i + 1];
    }
  rope(x.data(), n_heads, head_dim, 77, 500000.0f, false);
  rope(split.data(), n_heads, head_dim, 77, 500000.0f, true);
  // Not bit equality: the two layouts run different loops, and the compiler may contract
  // x0*cos - x1*sin into a fused multiply-add in one and not the other (it does at -O2
  // -march=native). That moves a result by about one rounding of the products, so the bound is
  // about eight float ulps of the inputs' magnitude (standard normal, |x| < 5 here); a wrong
  // pairing or angle is off by O(1).
  constexpr float kTolerance = 4e-6f;
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < head_dim / 2; ++i) {
      EXPECT_NEAR(split[h * head_dim + i], x[h * head_dim + 2 * i], kTolerance);
      EXPECT_NEAR(split[h * head_dim + i + head_dim / 2], x[h * head_dim + 2 * i + 1], kTolerance);
    }
}

TEST(Kernels, RopeRowsEqualsRopePerTokenAndKeepsNorms) {
  std::mt19937 rng(6);
  const int head_dim = 16, n_heads = 4, n_tokens = 9;
  const int64_t stride = n_heads * head_dim + 5;  // rows with padding
  auto x = random_vector(rng, n_tokens * stride);
  std::vector<int32_t> positions = {0, 3, 4, 100, 7, 8000, 2, 1, 65535};
  auto expected = x;
  for (int t = 0; t < n_tokens; ++t)
    rope(expected.data() + t * stride, n_heads, head_dim, positions[t], 10000.0f, false);
  auto y = x;
  rope_rows(y.data(), n_tokens, stride, n_heads, head_dim, positions.data(), 10000.0f, false);
  EXPECT_EQ(y, expected);
  for (int t = 0; t < n_tokens; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const float* a = x.data() + t * stride + h * head_dim;
      const float* b = y.data() + t * stride + h * head_dim;
      EXPECT_NEAR(ref_dot(a, a, head_dim), ref_dot(b, b, head_dim), 1e-4);
    }
  for (int t = 0; t < n_tokens; ++t)  // padding untouched
    for (int64_t c = n_heads * head_dim; c < stride; ++c)
      EXPECT_EQ(y[t * stride + c], x[t * stride + c]);
}

}  // namespace
}  // namespace protokv::kernels
