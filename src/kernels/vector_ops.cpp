// SPDX-License-Identifier: Apache-2.0
// The kernels written once for every CPU: RoPE, RMSNorm over rows (kernels/variant/ has the
// per-instruction-set ones).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "protokv/error.h"

namespace protokv::kernels {

namespace {

// cos/sin of pos * inv_freq[i] for pairs [first, last) of one position (angle in double).
void rope_angles(int32_t pos, const double* inv_freq, int first, int last, float* cos_out,
                 float* sin_out) {
  for (int i = first; i < last; ++i) {
    const double angle = static_cast<double>(pos) * inv_freq[i];
    cos_out[i - first] = static_cast<float>(std::cos(angle));
    sin_out[i - first] = static_cast<float>(std::sin(angle));
  }
}

// Rotates pairs [first, last) of the first rot_dims values of every head by the angles c/s
// (indexed from `first`).
void rope_apply(float* x, int n_heads, int head_dim, int rot_dims, int first, int last,
                const float* c, const float* s, bool neox) {
  const int half = rot_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* head = x + static_cast<int64_t>(h) * head_dim;
    if (neox) {
      float* a = head;
      float* b = head + half;
      for (int i = first; i < last; ++i) {
        const float x0 = a[i], x1 = b[i];
        a[i] = x0 * c[i - first] - x1 * s[i - first];
        b[i] = x0 * s[i - first] + x1 * c[i - first];
      }
    } else {
      for (int i = first; i < last; ++i) {
        const float x0 = head[2 * i], x1 = head[2 * i + 1];
        head[2 * i] = x0 * c[i - first] - x1 * s[i - first];
        head[2 * i + 1] = x0 * s[i - first] + x1 * c[i - first];
      }
    }
  }
}

// rope_angles in ggml's arithmetic (RopeTable::ggml_order): the angle of pair i comes from pos
// times theta_scale^i, multiplied up from pair 0 in float as ggml_rope_cache_init does.
void rope_angles_as_ggml(int32_t pos, const RopeTable& table, int first, int last, float* cos_out,
                         float* sin_out) {
  auto theta = static_cast<float>(pos);
  for (int i = 0; i < first; ++i) theta *= table.theta_scale;
  for (int i = first; i < last; ++i) {
    const float factor = table.freq_factors.empty() ? 1.0f : table.freq_factors[i];
    const float extrapolated = theta / factor;
    const float angle = table.freq_scale * extrapolated;
    cos_out[i - first] = std::cos(angle);
    sin_out[i - first] = std::sin(angle);
    theta *= table.theta_scale;
  }
}

// rope_apply with ggml's rounding: dst0 = fma(x0, c, -(x1 s)), dst1 = fma(x0, s, x1 c).
void rope_apply_as_ggml(float* x, int n_heads, int head_dim, int rot_dims, int first, int last,
                        const float* c, const float* s, bool neox) {
  const int half = rot_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* head = x + static_cast<int64_t>(h) * head_dim;
    for (int i = first; i < last; ++i) {
      float* a = neox ? head + i : head + 2 * i;
      float* b = neox ? head + half + i : head + 2 * i + 1;
      const float x0 = *a, x1 = *b;
      const float x1s = x1 * s[i - first];
      const float x1c = x1 * c[i - first];
      *a = std::fma(x0, c[i - first], -x1s);
      *b = std::fma(x0, s[i - first], x1c);
    }
  }
}

}  // namespace

void rmsnorm_rows(float* out, const float* x, const float* weight, int64_t rows, int64_t n,
                  float eps) {
  // Rows are cheap (O(n)); threads only pay off for a prefill's worth of them. Four rows at a time:
  // each row's sum of squares is a chain of dependent double adds in index order (ggml's order,
  // see rmsnorm), four such chains interleave; the results are rmsnorm's to the bit.
  constexpr int64_t kGroup = 4;
  const int64_t groups = (rows + kGroup - 1) / kGroup;
#pragma omp parallel for schedule(static) if (rows * n >= (1 << 16))
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r0 = g * kGroup;
    if (rows - r0 < kGroup) {
      for (int64_t r = r0; r < rows; ++r) rmsnorm(out + r * n, x + r * n, weight, n, eps);
      continue;
    }
    const float* x0 = x + r0 * n;
    double sums[kGroup] = {};
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < kGroup; ++k) {
        const float v = x0[k * n + i];
        sums[k] += static_cast<double>(v * v);
      }
    for (int64_t k = 0; k < kGroup; ++k) {
      const auto mean_square = static_cast<float>(sums[k] / static_cast<double>(n));
      const float scale = 1.0f / std::sqrt(mean_square + eps);
      const float* xr = x0 + k * n;
      float* o = out + (r0 + k) * n;
      for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * scale * weight[i];
    }
  }
}

RopeTable make_rope_table(int head_dim, float theta, bool neox) {
  return make_rope_table(head_dim, head_dim, theta, neox, 1.0f, nullptr);
}

RopeTable make_rope_table(int head_dim, int rot_dims, float theta, bool neox, float freq_scale,
                          const float* freq_factors, bool ggml_order) {
  RopeTable table;
  table.head_dim = head_dim;
  table.rot_dims = rot_dims;
  table.neox = neox;
  table.ggml_order = ggml_order;
  table.theta_scale = std::pow(theta, -2.0f / static_cast<float>(rot_dims));
  table.freq_scale = freq_scale;
  if (freq_factors != nullptr) table.freq_factors.assign(freq_factors, freq_factors + rot_dims / 2);
  table.inv_freq.resize(static_cast<size_t>(rot_dims / 2));
  const double log_theta = std::log(static_cast<double>(theta));
  for (size_t i = 0; i < table.inv_freq.size(); ++i) {
    double f = std::exp(-2.0 * static_cast<double>(i) / rot_dims * log_theta) * freq_scale;
    if (freq_factors != nullptr) f /= static_cast<double>(freq_factors[i]);
    table.inv_freq[i] = f;
  }
  return table;
}

void rope_rows(float* x, int64_t n_tokens, int64_t token_stride, int n_heads,
               const RopeTable& table, const int32_t* positions) {
  // Angles are computed for a block of pairs at a time into stack buffers: no allocation, and
  // the same values for every head of the token.
  constexpr int kPairBlock = 64;
  float c[kPairBlock];
  float s[kPairBlock];
  const int half = table.rot_dims / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int first = 0; first < half; first += kPairBlock) {
      const int last = std::min(half, first + kPairBlock);
      if (table.ggml_order) {
        rope_angles_as_ggml(positions[t], table, first, last, c, s);
        rope_apply_as_ggml(x + t * token_stride, n_heads, table.head_dim, table.rot_dims, first,
                           last, c, s, table.neox);
        continue;
      }
      rope_angles(positions[t], table.inv_freq.data(), first, last, c, s);
      rope_apply(x + t * token_stride, n_heads, table.head_dim, table.rot_dims, first, last, c, s,
                 table.neox);
    }
  }
}

void rope(float* x, int n_heads, int head_dim, int32_t pos, float theta, bool neox) {
  rope_rows(x, 1, 0, n_heads, head_dim, &pos, theta, neox);
}

void rope_rows(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim,
               const int32_t* positions, float theta, bool neox) {
  rope_rows(x, n_tokens, token_stride, n_heads, make_rope_table(head_dim, theta, neox), positions);
}

}  // namespace protokv::kernels
