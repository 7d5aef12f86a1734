// SPDX-License-Identifier: Apache-2.0
#pragma once
// Naive reference implementations (double accumulation, no tiling, no SIMD) and random inputs
// for the kernel tests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "protokv/dtype.h"
#include "protokv/model.h"

namespace protokv::testing {

inline bool sanitized_build() {
  return std::getenv("PROTOKV_SANITIZED") != nullptr;
}

inline std::vector<float> random_vector(std::mt19937& rng, int64_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// A weight matrix with random values stored in `type`; `values` holds the F32 values it decodes
// to (what the kernels must multiply by).
struct TestWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [rows, cols] dequantised
  WeightMatrix matrix;
};

inline TestWeight random_weight(std::mt19937& rng, DType type, int64_t rows, int64_t cols) {
  TestWeight w;
  const std::vector<float> source = random_vector(rng, rows * cols);
  const size_t row_bytes = dtype_row_bytes(type, cols);
  w.bytes.resize(row_bytes * static_cast<size_t>(rows));
  w.values.resize(source.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, source.data() + r * cols, w.bytes.data() + r * row_bytes, cols);
    dequantize_row(type, w.bytes.data() + r * row_bytes, w.values.data() + r * cols, cols);
  }
  w.matrix = WeightMatrix{type, w.bytes.data(), rows, cols};
  return w;
}

inline double ref_dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

inline double ref_abs_dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(a[i]) * b[i]);
  return s;
}

// Bound on |matvec - exact dot| for quantised weights, whose mat-vec quantises x to int8 per
// activation block (dtype_block_size values: each value moves by at most half a step, step =
// max|x| / 127 of its block), plus F32 rounding of the sums. fp16_scale: the step is stored as
// FP16 (ggml's Q8_0 / Q8_1 blocks, the legacy types' decode), so a value q * FP16(step) moves by
// up to 127 |step - FP16(step)| <= 127 * 2^-11 step more. (Q8_1's s = FP16(step * sum q) adds
// |m| 2^-10 step |sum q| for a weight block's min m, which these bounds' slack covers.)
inline double int8_activation_bound(const float* w, const float* x, int64_t cols, int64_t block,
                                    bool fp16_scale = false) {
  const double per_step = 0.5 + (fp16_scale ? 127.0 / 2048.0 : 0.0);
  double bound = 0;
  for (int64_t b = 0; b < cols / block; ++b) {
    double amax = 0, wsum = 0;
    for (int64_t i = b * block; i < (b + 1) * block; ++i) {
      amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
      wsum += std::fabs(static_cast<double>(w[i]));
    }
    bound += per_step * amax / 127.0 * wsum * 1.0001;
  }
  return bound + 1e-5 * ref_abs_dot(w, x, cols) + 1e-6;
}

// Y[n, rows] = X[n, cols] W^T with the dequantised weights.
inline std::vector<double> ref_matmul(const TestWeight& w, const float* x, int64_t n) {
  const int64_t rows = w.matrix.rows, cols = w.matrix.cols;
  std::vector<double> y(static_cast<size_t>(n * rows));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r)
      y[i * rows + r] = ref_dot(w.values.data() + r * cols, x + i * cols, cols);
  return y;
}

inline std::vector<double> ref_softmax(const std::vector<double>& logits) {
  double max_value = -std::numeric_limits<double>::infinity();
  for (double v : logits) max_value = std::max(max_value, v);
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp(logits[i] - max_value);
  for (double& v : p) v /= sum;
  return p;
}

// Causal attention of one head with the full n_keys × n_queries matrix: query t (at position
// n_past + t) over keys 0 .. n_past + t. q [n_queries, d] (rows q_stride apart), k/v [n_keys, d]
// (kv_stride apart). Returns [n_queries, d].
inline std::vector<double> ref_causal_attention(const float* q, int64_t q_stride, const float* k,
                                                const float* v, int64_t kv_stride,
                                                int64_t n_queries, int64_t n_past, int d) {
  std::vector<double> out(static_cast<size_t>(n_queries * d), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t t = 0; t < n_queries; ++t) {
    const int64_t n_visible = n_past + t + 1;
    std::vector<double> logits(static_cast<size_t>(n_visible));
    for (int64_t j = 0; j < n_visible; ++j)
      logits[j] = ref_dot(q + t * q_stride, k + j * kv_stride, d) * scale;
    const std::vector<double> p = ref_softmax(logits);
    for (int64_t j = 0; j < n_visible; ++j)
      for (int c = 0; c < d; ++c) out[t * d + c] += p[j] * v[j * kv_stride + c];
  }
  return out;
}

// Decode attention of one query over n entries with optional log-weights; probs [n] returned too.
inline std::vector<double> ref_decode_attention(const float* q, const float* keys,
                                                const float* values, const float* log_weights,
                                                int64_t n, int d, std::vector<double>* probs) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> logits(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    logits[j] = ref_dot(q, keys + j * d, d) * scale + (log_weights ? log_weights[j] : 0.0);
  const std::vector<double> p = ref_softmax(logits);
  std::vector<double> out(static_cast<size_t>(d), 0.0);
  for (int64_t j = 0; j < n; ++j)
    for (int c = 0; c < d; ++c) out[c] += p[j] * values[j * d + c];
  if (probs) *probs = p;
  return out;
}

}  // namespace protokv::testing
