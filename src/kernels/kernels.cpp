#include "kernels/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace protokv::kernels {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void rmsnorm_rows(float* out, const float* x, const float* weight, int64_t rows, int64_t n,
                  float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) rmsnorm(out + r * n, x + r * n, weight, n, eps);
}

void softmax(float* x, int64_t n) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max_value = std::max(max_value, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope(float* x, int n_heads, int head_dim, int32_t pos, float theta, bool neox) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float freq = std::pow(theta, -2.0f * static_cast<float>(i) / head_dim);
    const float angle = static_cast<float>(pos) * freq;
    const float c = std::cos(angle), s = std::sin(angle);
    for (int h = 0; h < n_heads; ++h) {
      float* head = x + static_cast<int64_t>(h) * head_dim;
      const int a = neox ? i : 2 * i;
      const int b = neox ? i + half : 2 * i + 1;
      const float x0 = head[a], x1 = head[b];
      head[a] = x0 * c - x1 * s;
      head[b] = x0 * s + x1 * c;
    }
  }
}

void matvec(const WeightMatrix& w, const float* x, float* y) {
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(w.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize_row(w.type, w.row(r), row.data(), w.cols);
      y[r] = dot(row.data(), x, w.cols);
    }
  }
}

void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) {
  const float* wf = static_cast<const float*>(w.data);
  std::vector<float> converted;
  if (w.type != DType::F32) {
    converted.resize(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r)
      dequantize_row(w.type, w.row(r), converted.data() + r * w.cols, w.cols);
    wf = converted.data();
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
              static_cast<int>(w.rows), static_cast<int>(w.cols), 1.0f, x, static_cast<int>(w.cols),
              wf, static_cast<int>(w.cols), 0.0f, y, static_cast<int>(w.rows));
}

void attention_prefill(const float* q, const float* k, const float* v, int64_t n, int d,
                       float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> acc(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i) {
    // Online softmax over keys 0..i.
    float running_max = -std::numeric_limits<float>::infinity();
    float running_sum = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j <= i; ++j) {
      const float logit = dot(q + i * d, k + j * d, d) * scale;
      if (logit > running_max) {
        const float correction = std::exp(running_max - logit);
        running_sum *= correction;
        for (int c = 0; c < d; ++c) acc[c] *= correction;
        running_max = logit;
      }
      const float p = std::exp(logit - running_max);
      running_sum += p;
      for (int c = 0; c < d; ++c) acc[c] += p * v[j * d + c];
    }
    for (int c = 0; c < d; ++c) out[i * d + c] = acc[c] / running_sum;
  }
}

void attention_decode(const float* q, const float* keys, const float* values,
                      const float* log_weights, int64_t n, int d, float* out, float* probs) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> local;
  float* p = probs;
  if (p == nullptr) {
    local.resize(static_cast<size_t>(n));
    p = local.data();
  }
  for (int64_t j = 0; j < n; ++j) {
    p[j] = dot(q, keys + j * d, d) * scale + (log_weights ? log_weights[j] : 0.0f);
  }
  softmax(p, n);
  std::fill(out, out + d, 0.0f);
  for (int64_t j = 0; j < n; ++j)
    for (int c = 0; c < d; ++c) out[c] += p[j] * values[j * d + c];
}

}  // namespace protokv::kernels
