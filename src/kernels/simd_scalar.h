#pragma once
// The portable vector primitives (see kernels/simd.h): always compiled, the reference the
// vector paths are tested against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "protokv/dtype.h"

namespace protokv::kernels {

// F16 -> F32 for every half bit pattern (256 KB, built on first use): the portable path's
// conversion, one load instead of f16_to_f32's branches.
const float* f16_table();

struct ScalarOps {
  static constexpr const char* kName = "scalar";

  static float dot(const float* a, const float* b, int64_t n) {
    // Four partial sums: same association pattern as the vector paths, and a shorter
    // dependency chain.
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      s0 += a[i] * b[i];
      s1 += a[i + 1] * b[i + 1];
      s2 += a[i + 2] * b[i + 2];
      s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; ++i) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
  }

  static float dot_f16(const uint16_t* w, const float* x, int64_t n) {
    const float* table = f16_table();
    float s0 = 0, s1 = 0;
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      s0 += table[w[i]] * x[i];
      s1 += table[w[i + 1]] * x[i + 1];
    }
    if (i < n) s0 += table[w[i]] * x[i];
    return s0 + s1;
  }

  static float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
    return s;
  }

  // Q8_0 weights against F32 activations: the same arithmetic as prefill's dequantise + GEMM,
  // so prefill and token-by-token decode agree (ggml instead quantises the activations too).
  static float dot_q8(const BlockQ8_0* w, const float* x, int64_t n_blocks) {
    const float* f16 = f16_table();
    float s = 0;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* xb = x + b * kQ8BlockSize;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int j = 0; j < kQ8BlockSize; j += 4) {
        s0 += static_cast<float>(w[b].quants[j]) * xb[j];
        s1 += static_cast<float>(w[b].quants[j + 1]) * xb[j + 1];
        s2 += static_cast<float>(w[b].quants[j + 2]) * xb[j + 2];
        s3 += static_cast<float>(w[b].quants[j + 3]) * xb[j + 3];
      }
      s += ((s0 + s1) + (s2 + s3)) * f16[w[b].scale];
    }
    return s;
  }

  // sum over the n / 16 groups g of scale[g] * (q_g . x_g), q_g and x_g the g-th 16 values:
  // the integer core of every quantised mat-vec (kernels/quant_matvec.h). Exact in int32 for
  // q <= 63, |x| <= 127, |scale| <= 128 and n <= 256.
  static int32_t dot_q_groups(const uint8_t* q, const int8_t* x, const int16_t* scale, int n) {
    int32_t total = 0;
    for (int g = 0; g < n / 16; ++g) {
      int32_t group = 0;
      for (int l = 0; l < 16; ++l) group += q[16 * g + l] * x[16 * g + l];
      total += scale[g] * group;
    }
    return total;
  }

  // Q8_0 weights against int8 activations in blocks of 32 with scales x_scale (ggml's
  // vec_dot_q8_0_q8_0): exact in int32 per block.
  static float dot_q8_0_int8(const BlockQ8_0* w, const int8_t* x, const float* x_scale,
                             int64_t n_blocks) {
    const float* f16 = f16_table();
    float s = 0;
    for (int64_t b = 0; b < n_blocks; ++b) {
      int32_t block = 0;
      for (int j = 0; j < kQ8BlockSize; ++j) block += w[b].quants[j] * x[32 * b + j];
      s += static_cast<float>(block) * (f16[w[b].scale] * x_scale[b]);
    }
    return s;
  }

  // Weights of any dtype to F32 (n a multiple of the block size for Q8_0).
  static void to_f32(DType type, const void* src, float* dst, int64_t n) {
    if (type == DType::F16) {
      const float* table = f16_table();
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = table[h[i]];
      return;
    }
    dequantize_row(type, src, dst, n);
  }

  // out[k] = a · b_k for the four rows b_k = b + k * stride.
  static void dot4(const float* a, const float* b, int64_t stride, int64_t n, float* out) {
    for (int k = 0; k < 4; ++k) out[k] = dot(a, b + k * stride, n);
  }

  // out[c] += sum_j weights[j] * rows[j * stride + c], c < n, j < count.
  static void weighted_row_sum(const float* weights, const float* rows, int64_t count,
                               int64_t stride, float* out, int64_t n) {
    for (int64_t j = 0; j < count; ++j) axpy(weights[j], rows + j * stride, out, n);
  }

  static void axpy(float a, const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }

  static void scale(float* x, float a, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= a;
  }

  static float max(const float* x, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }

  static float exp(float x) { return std::exp(x); }

  // x[i] = exp(x[i] - shift); returns the sum of the new values.
  static float exp_shifted_sum(float* x, float shift, int64_t n) {
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - shift);
      sum += x[i];
    }
    return sum;
  }

  static float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }

  // out[i] = x[i] * s * w[i]
  static void scaled_mul(float* out, const float* x, float s, const float* w, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s * w[i];
  }
};

}  // namespace protokv::kernels
