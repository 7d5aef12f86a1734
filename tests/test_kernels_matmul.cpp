// SPDX-License-Identifier: Apache-2.0
// matvec (decode) and matmul (prefill) for every weight dtype and instruction-set variant,
// against the dequantised weights multiplied in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_reference.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"

namespace protokv::kernels {
namespace {

using protokv::testing::random_vector;
using protokv::testing::random_weight;
using protokv::testing::ref_abs_dot;
using protokv::testing::ref_dot;
using protokv::testing::ref_matmul;
using protokv::testing::TestWeight;

struct Shape {
  int64_t rows, cols;
};

// Plain dtypes take any width; Q8_0 needs whole blocks of 32.
std::vector<Shape> shapes_for(DType type) {
  if (type == DType::Q8_0) return {{1, 32}, {5, 64}, {17, 96}, {130, 320}, {33, 4096}};
  return {{1, 1}, {1, 7}, {5, 33}, {17, 300}, {130, 64}, {33, 4099}};
}

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0};

double f32_tolerance(const float* w_row, const float* x, int64_t cols) {
  return 1e-5 * ref_abs_dot(w_row, x, cols) + 1e-6;
}

// Mat-vec multiplies Q8_0 weights with int8-quantised activations (as ggml does), so its error
// bound includes the activation rounding; the plain types stay at F32 rounding.
double matvec_tolerance(DType type, const float* w_row, const float* x, int64_t cols) {
  if (type == DType::Q8_0)
    return protokv::testing::int8_activation_bound(w_row, x, cols, kQ8BlockSize);
  return f32_tolerance(w_row, x, cols);
}

TEST(KernelsMatvec, EveryDtypeMatchesDequantisedReference) {
  std::mt19937 rng(10);
  for (Isa isa : available_isas()) {
    for (DType type : kTypes) {
      for (Shape s : shapes_for(type)) {
        SCOPED_TRACE(::testing::Message()
                     << isa_name(isa) << " " << dtype_name(type) << " " << s.rows << "x" << s.cols);
        const TestWeight w = random_weight(rng, type, s.rows, s.cols);
        const auto x = random_vector(rng, s.cols);
        std::vector<float> y(static_cast<size_t>(s.rows), NAN);
        matvec(isa, w.matrix, x.data(), y.data());
        const auto expected = ref_matmul(w, x.data(), 1);
        for (int64_t r = 0; r < s.rows; ++r) {
          const float* w_row = w.values.data() + r * s.cols;
          const double tolerance = matvec_tolerance(type, w_row, x.data(), s.cols);
          ASSERT_NEAR(y[r], expected[r], tolerance) << "row " << r;
        }
      }
    }
  }
}

// Quantisers other than ours may emit -128 (the full int8 range must convert correctly).
TEST(KernelsMatvec, Q8HandlesMinus128Weights) {
  const int64_t rows = 3, cols = 64;
  std::vector<BlockQ8_0> blocks(rows * 2);
  for (auto& b : blocks) {
    b.scale = f32_to_f16(0.01f);
    for (int j = 0; j < 32; ++j) b.quants[j] = static_cast<int8_t>(j % 2 ? -128 : 127 - j);
  }
  const WeightMatrix w{DType::Q8_0, blocks.data(), rows, cols};
  std::vector<float> x(cols);
  for (int64_t i = 0; i < cols; ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f);
  std::vector<float> dense(cols);
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<float> y(rows);
    matvec(isa, w, x.data(), y.data());
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(DType::Q8_0, w.row(r), dense.data(), cols);
      EXPECT_NEAR(y[r], ref_dot(dense.data(), x.data(), cols), 1e-4);
    }
  }
}

TEST(KernelsMatmul, EveryDtypeMatchesDequantisedReference) {
  std::mt19937 rng(12);
  const bool small = protokv::testing::sanitized_build();
  struct Case {
    int64_t n, rows, cols;
  };
  std::vector<Case> cases = {{1, 5, 64}, {3, 17, 96}, {4, 33, 64}, {7, 130, 320}, {33, 70, 256}};
  // Several panels of converted rows, the last one partial.
  if (!small) cases.push_back({33, 600, 1024});
  for (Isa isa : available_isas()) {
    for (DType type : kTypes) {
      for (const Case& c : cases) {
        SCOPED_TRACE(::testing::Message() << isa_name(isa) << " " << dtype_name(type)
                                          << " n=" << c.n << " " << c.rows << "x" << c.cols);
        const TestWeight w = random_weight(rng, type, c.rows, c.cols);
        const auto x = random_vector(rng, c.n * c.cols);
        std::vector<float> y(static_cast<size_t>(c.n * c.rows), NAN);
        matmul(isa, w.matrix, x.data(), c.n, y.data());
        const auto expected = ref_matmul(w, x.data(), c.n);
        for (int64_t i = 0; i < c.n; ++i) {
          for (int64_t r = 0; r < c.rows; ++r) {
            const float* w_row = w.values.data() + r * c.cols;
            const float* x_row = x.data() + i * c.cols;
            // n = 1 takes the mat-vec path.
            const double tolerance = c.n == 1 ? matvec_tolerance(type, w_row, x_row, c.cols)
                                              : f32_tolerance(w_row, x_row, c.cols);
            ASSERT_NEAR(y[i * c.rows + r], expected[i * c.rows + r], tolerance)
                << "token " << i << " row " << r;
          }
        }
      }
    }
  }
}

TEST(KernelsMatmul, OddWidthPlainTypesAndBestIsaEntryPoint) {
  std::mt19937 rng(13);
  for (DType type : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(type));
    const int64_t n = 9, rows = 45, cols = 301;
    const TestWeight w = random_weight(rng, type, rows, cols);
    const auto x = random_vector(rng, n * cols);
    std::vector<float> y(n * rows);
    matmul(w.matrix, x.data(), n, y.data());
    const auto expected = ref_matmul(w, x.data(), n);
    for (int64_t i = 0; i < n * rows; ++i) {
      const double tolerance =
          f32_tolerance(w.values.data() + (i % rows) * cols, x.data() + (i / rows) * cols, cols);
      ASSERT_NEAR(y[i], expected[i], tolerance);
    }
  }
}

}  // namespace
}  // namespace protokv::kernels
