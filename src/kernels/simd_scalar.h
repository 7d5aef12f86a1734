// SPDX-License-Identifier: Apache-2.0
#pragma once
// The portable vector primitives (see kernels/simd.h): always compiled, the reference the
// vector paths are tested against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/quant_blocks.h"
#include "protokv/dtype.h"

namespace protokv::kernels {

using quant::f16_table;

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

  // F16 weights against an activation already rounded to F16 (round_to_f16; kept as the floats
  // those F16 values are, which F16 -> F32 gives exactly), as llama.cpp multiplies them (ggml-cpu's
  // vec_dot_type for F16 is F16): ggml_vec_dot_f16 of a build without SIMD, each product in float
  // (exact: 11-bit significands) summed in double.
  static float dot_f16(const uint16_t* w, const float* x, int64_t n) {
    const float* table = f16_table();
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(table[w[i]] * x[i]);
    return static_cast<float>(sum);
  }

  // A llama.cpp built without SIMD has no tinyBLAS: its prompt rows take ggml_vec_dot_f16 /
  // ggml_vec_dot_f32.
  static constexpr int kTinyBlasLanes = 0;
  static float tinyblas_dot_f16(const uint16_t* w, const float* x, int64_t n) {
    return dot_f16(w, x, n);
  }
  static float tinyblas_dot_f32(const float* w, const float* x, int64_t n) {
    double sum = 0.0;  // ggml_vec_dot_f32 without SIMD
    for (int64_t i = 0; i < n; ++i) {
      const float product = w[i] * x[i];
      sum += static_cast<double>(product);
    }
    return static_cast<float>(sum);
  }

  // x rounded to F16, round to nearest even (as ggml_cpu_fp32_to_fp16), and back to F32.
  static void round_to_f16(const float* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(f32_to_f16(x[i]));
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

  // The int32 dot of a legacy block's 32 weight values, less `offset`, with 32 int8 activations.
  // Value j is the low nibble of qs[j] for j < 16, the high nibble of qs[j - 16] after, and, for
  // the 5-bit types (qh not null), bit j of the little-endian uint32 qh its fifth bit (ggml's
  // block_q4_0 ... block_q5_1 layouts, as quant_blocks.h unpacks them).
  static int32_t legacy_block_dot(const uint8_t* qs, const uint8_t* qh, int offset,
                                  const int8_t* x) {
    uint32_t high = 0;
    if (qh != nullptr) std::memcpy(&high, qh, 4);
    int32_t dot = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0f) | static_cast<int>(((high >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((high >> (j + 16)) & 1u) << 4);
      dot += (lo - offset) * x[j] + (hi - offset) * x[j + 16];
    }
    return dot;
  }

  // Legacy weights against ggml's Q8_0 (Q4_0, Q5_0) or Q8_1 (Q4_1, Q5_1) activation blocks of
  // kernels/quant_matvec.h: x the int8 values, xd the blocks' FP16 d widened to F32, xs Q8_1's s.
  // Per block an exact int32 dot, then, as ggml's ggml_vec_dot_q4_0_q8_0_generic ...
  // ggml_vec_dot_q5_1_q8_1_generic:
  //   Q4_0 / Q5_0 (weights offset by 8 / 16): sum += (d_w * d_x) * dot
  //   Q4_1 / Q5_1 (unsigned weights, min m_w): sum += (d_w * d_x) * dot + m_w * s_x
  // The vector variants keep 8 partial sums per row (ggml's x86 form), so they differ from these
  // by F32 summation order only.
  static float dot_q4_0_q8_0(const BlockQ4_0* w, const int8_t* x, const float* xd,
                             int64_t n_blocks) {
    const float* f16 = f16_table();
    float s = 0;
    for (int64_t b = 0; b < n_blocks; ++b)
      s += (f16[w[b].d] * xd[b]) *
           static_cast<float>(legacy_block_dot(w[b].qs, nullptr, 8, x + 32 * b));
    return s;
  }
  static float dot_q5_0_q8_0(const BlockQ5_0* w, const int8_t* x, const float* xd,
                             int64_t n_blocks) {
    const float* f16 = f16_table();
    float s = 0;
    for (int64_t b = 0; b < n_blocks; ++b)
      s += (f16[w[b].d] * xd[b]) *
           static_cast<float>(legacy_block_dot(w[b].qs, w[b].qh, 16, x + 32 * b));
    return s;
  }
  static float dot_q4_1_q8_1(const BlockQ4_1* w, const int8_t* x, const float* xd, const float* xs,
                             int64_t n_blocks) {
    const float* f16 = f16_table();
    float s = 0;
    for (int64_t b = 0; b < n_blocks; ++b)
      s += (f16[w[b].d] * xd[b]) *
               static_cast<float>(legacy_block_dot(w[b].qs, nullptr, 0, x + 32 * b)) +
           f16[w[b].m] * xs[b];
    return s;
  }
  static float dot_q5_1_q8_1(const BlockQ5_1* w, const int8_t* x, const float* xd, const float* xs,
                             int64_t n_blocks) {
    const float* f16 = f16_table();
    float s = 0;
    for (int64_t b = 0; b < n_blocks; ++b)
      s += (f16[w[b].d] * xd[b]) *
               static_cast<float>(legacy_block_dot(w[b].qs, w[b].qh, 0, x + 32 * b)) +
           f16[w[b].m] * xs[b];
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

  // out[i] = x[i] * s * w[i]
  static void scaled_mul(float* out, const float* x, float s, const float* w, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s * w[i];
  }

  // llama.cpp's arithmetic for ggml-cpu built without SIMD (see Avx512Ops::dot_f32_as_ggml).
  static constexpr int kGgmlLanes = 0;
  static constexpr bool kGgmlHaddReduce = false;
  static float dot_f32_as_ggml(const float* x, const float* y, int64_t n) {
    return tinyblas_dot_f32(x, y, n);  // float products summed in double
  }
  static double exp_sum_as_ggml(float* x, float max, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - max);
      sum += static_cast<double>(x[i]);
    }
    return sum;
  }
  // ggml_vec_swiglu_f32's leftovers (all of it without SIMD): x / (1 + expf(-x)) * g.
  static void swiglu_as_ggml(float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float x = gate[i];
      const float silu = x / (1.0f + std::exp(-x));
      gate[i] = silu * up[i];
    }
  }
};

}  // namespace protokv::kernels
