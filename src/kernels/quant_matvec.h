// SPDX-License-Identifier: Apache-2.0
#pragma once
// Integer mat-vec for the quantised weight types: as in ggml, the activation vector is quantised
// once per call to int8 blocks, and each weight block is multiplied with them in int32.
//  - Q2_K ... Q6_K: quantize_activation, per 256 values like ggml's Q8_K, each block with a
//    float scale and the int sums of its groups of 16; the weight block is unpacked
//    (quant_blocks.h) and multiplied by the instruction set's dot_q_groups. The only rounding
//    against the dequantised weights is the activation's (|error| <= scale / 2 per value) and the
//    F32 sum.
//  - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: quantize_activation_ggml_q8, ggml's own Q8_0 / Q8_1 blocks
//    (FP16 scales), and the instruction set's dot_q8_0_int8, dot_q4_0_q8_0 ... dot_q5_1_q8_1,
//    ggml's vec_dot arithmetic, so that decode rounds as llama.cpp does.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/quant_blocks.h"
#include "protokv/dtype.h"

namespace protokv::kernels {

// The block formats are core facts (core/quant_blocks.h); these kernels multiply them.
using quant::UnpackedBlock;
using quant::with_unpacker;

struct QuantizedActivation {
  int block = 0;              // 32 or 256
  std::vector<int8_t> q;      // [n]
  std::vector<float> scale;   // [n / block]
  std::vector<int16_t> sums;  // [n / 16]: sum of q over each group of 16 (quantize_activation)
  std::vector<float> s;       // [n / 32]: Q8_1 blocks' s (quantize_activation_ggml_q8)
};

// A value already scaled into [-127, 127], rounded half to even in the default rounding mode (as
// _mm256_round_ps with _MM_ROUND_NEAREST). Not finite (a corrupt model's activations: a NaN, an
// infinity times a zero inverse scale, or a subnormal block whose inverse scale overflows, as in
// ggml) gives -128, as the x86 conversion's 0x80000000 does after the saturating packs, instead
// of an undefined float -> int8 cast.
inline int8_t round_to_int8(float scaled) {
  return std::isfinite(scaled) ? static_cast<int8_t>(std::rint(scaled)) : INT8_MIN;
}

// x[n] to int8 blocks of `block` values: scale = max|x| / 127, q = round(x / scale) (ggml's
// quantize_row_q8_0 / q8_K rounding up to ties).
inline void quantize_activation(const float* x, int64_t n, int block, QuantizedActivation& out) {
  out.block = block;
  out.q.resize(static_cast<size_t>(n));
  out.scale.resize(static_cast<size_t>(n / block));
  out.sums.resize(static_cast<size_t>(n / 16));
  for (int64_t b = 0; b < n / block; ++b) {
    const float* xb = x + b * block;
    float amax = 0.0f;
    for (int j = 0; j < block; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    out.scale[static_cast<size_t>(b)] = scale;
    int8_t* qb = out.q.data() + b * block;
    for (int j = 0; j < block; ++j) qb[j] = round_to_int8(xb[j] * inv);
  }
  for (int64_t g = 0; g < n / 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += out.q[static_cast<size_t>(16 * g + l)];
    out.sums[static_cast<size_t>(g)] = static_cast<int16_t>(sum);
  }
}

// The activation llama.cpp's CPU backend multiplies legacy weights with: ggml's Q8_0 blocks for
// Q4_0 and Q5_0, Q8_1 blocks for Q4_1 and Q5_1, rounded as its x86 quantize_row_q8_0 /
// quantize_row_q8_1 (AVX2) round them, block by block of 32 values:
//   d = max|x| / 127 in F32, stored as FP16 (round to nearest even): `scale` holds that FP16
//     value widened back to F32, the d of every block product;
//   q = round-half-to-even(x * (127 / max|x|)): the unrounded reciprocal, not 1 / FP16(d), and
//     127 / max rather than 1 / d (ggml's scalar quantize_row_q8_0_ref takes 1 / d and rounds
//     ties away from zero; the x86 path, which llama.cpp runs on this machine, differs in both);
//   Q8_1 only: s = FP16(d * sum of the block's q) with the unrounded F32 d (also in
//     quantize_row_q8_1_ref): the weight's min m enters the dot as m * s.
// An all-zero block gets d = 0, q = 0 and s = 0. `sums`: the int16 sums of q over each group
// of 16, as quantize_activation's (the 8-row Q4_0 kernel takes 8 * sum off its dots).
inline void quantize_activation_ggml_q8(const float* x, int64_t n, bool q8_1,
                                        QuantizedActivation& out) {
  const int64_t n_blocks = n / kQ8BlockSize;
  out.block = kQ8BlockSize;
  out.q.resize(static_cast<size_t>(n));
  out.scale.resize(static_cast<size_t>(n_blocks));
  out.s.resize(q8_1 ? static_cast<size_t>(n_blocks) : 0);
  out.sums.resize(static_cast<size_t>(2 * n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * kQ8BlockSize;
    float amax = 0.0f;
    for (int j = 0; j < kQ8BlockSize; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    int8_t* qb = out.q.data() + b * kQ8BlockSize;
    int sum = 0, first_half = 0;
    for (int j = 0; j < kQ8BlockSize; ++j) {
      // |x * inv| <= 127 keeps it in int8.
      qb[j] = round_to_int8(xb[j] * inv);
      sum += qb[j];
      if (j == kQ8BlockSize / 2 - 1) first_half = sum;
    }
    out.sums[static_cast<size_t>(2 * b)] = static_cast<int16_t>(first_half);
    out.sums[static_cast<size_t>(2 * b + 1)] = static_cast<int16_t>(sum - first_half);
    out.scale[static_cast<size_t>(b)] = f16_to_f32(f32_to_f16(d));
    if (q8_1) out.s[static_cast<size_t>(b)] = f16_to_f32(f32_to_f16(d * static_cast<float>(sum)));
  }
}

// One weight row of `n_blocks` blocks of Unpack's type against the quantised activation.
template <class Ops, class Unpack>
float dot_quantized_row(const void* row, int64_t n_blocks, const QuantizedActivation& x) {
  constexpr int kValues = Unpack::kValues;
  constexpr int kGroups = kValues / 16;
  const auto* blocks = static_cast<const typename Unpack::Block*>(row);
  UnpackedBlock u;
  float sum = 0.0f;
  for (int64_t b = 0; b < n_blocks; ++b) {
    Unpack::unpack(blocks[b], u);
    const int32_t scaled_dot = Ops::dot_q_groups(u.q, x.q.data() + b * kValues, u.scale, kValues);
    const int16_t* group_sums = x.sums.data() + b * kGroups;
    int32_t min_dot = 0;
    for (int g = 0; g < kGroups; ++g) min_dot += u.min[g] * group_sums[g];
    sum += x.scale[static_cast<size_t>(b)] *
           (u.d * static_cast<float>(scaled_dot) - u.m * static_cast<float>(min_dot));
  }
  return sum;
}

}  // namespace protokv::kernels
