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

// Mat-vec multiplies Q8_0 weights with int8-quantised activations and F16 weights with the
// activations rounded to F16 (as ggml does), so its error bound includes the activation
// rounding: for F16 half an F16 ulp, 2^-11 of each |w x| term; F32 and BF16 stay at F32 rounding.
double matvec_tolerance(DType type, const float* w_row, const float* x, int64_t cols) {
  if (type == DType::Q8_0)
    return protokv::testing::int8_activation_bound(w_row, x, cols, kQ8BlockSize, true);
  if (type == DType::F16)
    return 0x1p-11 * ref_abs_dot(w_row, x, cols) + f32_tolerance(w_row, x, cols);
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

// ggml_vec_dot_f16 of the build for `isa` (ggml-cpu/vec.cpp, simd-mappings.h), emulated: the
// activation rounded to F16; `lanes` F32 lanes in 4 accumulators over whole steps of 4 * lanes
// values (fma per lane), reduced as GGML_F32x8_REDUCE (AVX2) or GGML_F32Cx16_REDUCE with GCC's
// _mm512_reduce_add_ps (AVX-512), then the leftovers' float products added in double; no SIMD
// (scalar): every product added in double.
float ggml_vec_dot_f16_emulation(Isa isa, const uint16_t* w, const float* x, int64_t n) {
  std::vector<float> xh(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xh[i] = f16_to_f32(f32_to_f16(x[i]));
  const int lanes = isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 0;
  const int64_t whole = lanes == 0 ? 0 : n / (4 * lanes) * (4 * lanes);
  double sum = 0.0;
  if (lanes > 0) {
    std::vector<float> acc(static_cast<size_t>(4 * lanes), 0.0f);
    for (int64_t i = 0; i < whole; i += 4 * lanes)
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < lanes; ++l) {
          const int64_t k = i + j * lanes + l;
          float& a = acc[static_cast<size_t>(j * lanes + l)];
          a = std::fma(f16_to_f32(w[k]), xh[static_cast<size_t>(k)], a);
        }
    std::vector<float> r(static_cast<size_t>(lanes));
    for (int l = 0; l < lanes; ++l)
      r[l] = (acc[l] + acc[2 * lanes + l]) + (acc[lanes + l] + acc[3 * lanes + l]);
    if (lanes == 8) {
      float t[4];
      for (int k = 0; k < 4; ++k) t[k] = r[k] + r[k + 4];
      sum = (t[0] + t[1]) + (t[2] + t[3]);
    } else {
      float h[8], q[4];
      for (int k = 0; k < 8; ++k) h[k] = r[k + 8] + r[k];
      for (int k = 0; k < 4; ++k) q[k] = h[k + 4] + h[k];
      sum = (q[0] + q[2]) + (q[1] + q[3]);
    }
  }
  for (int64_t i = whole; i < n; ++i)
    sum += static_cast<double>(f16_to_f32(w[i]) * xh[static_cast<size_t>(i)]);
  return static_cast<float>(sum);
}

// F16 rows round as llama.cpp's (ggml_vec_dot_f16 of the same instruction set), bit for bit,
// whole steps and leftovers alike; several activations at once (batched decode) as one at a time.
TEST(KernelsMatvec, F16RowsRoundAsGgmlVecDotF16) {
  std::mt19937 rng(14);
  for (Isa isa : available_isas()) {
    for (int64_t cols : {1, 31, 64, 172, 256, 1000}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " x" << cols);
      const int64_t rows = 6;
      const TestWeight w = random_weight(rng, DType::F16, rows, cols);
      const auto x = random_vector(rng, 2 * cols);
      std::vector<float> y(static_cast<size_t>(2 * rows), NAN);
      matvec_rows(w.matrix, x.data(), 2, y.data());  // the active instruction set
      for (int64_t i = 0; i < 2; ++i) {
        std::vector<float> one(static_cast<size_t>(rows), NAN);
        matvec(isa, w.matrix, x.data() + i * cols, one.data());
        for (int64_t r = 0; r < rows; ++r) {
          const auto* row = static_cast<const uint16_t*>(w.matrix.row(r));
          EXPECT_EQ(one[r], ggml_vec_dot_f16_emulation(isa, row, x.data() + i * cols, cols))
              << "activation " << i << " row " << r;
          if (isa == active_isa()) {
            EXPECT_EQ(y[i * rows + r], one[r]);
          }
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
