#pragma once
// Integer mat-vec for the quantised weight types (Q4_0 ... Q6_K, and Q8_0's int8 path): as in
// ggml, the activation vector is quantised once per call to int8 blocks (per 32 values for the
// legacy formats like ggml's Q8_0, per 256 for the K-quants like its Q8_K, each with a float
// scale and the int sums of its groups of 16), and each weight block is unpacked (quant_blocks.h)
// and multiplied in int32 by the instruction set's dot_q_groups. The only rounding against the
// dequantised weights is the activation's (|error| <= scale / 2 per value) and the F32 sum.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/quant_blocks.h"
#include "protokv/dtype.h"

namespace protokv::kernels {

struct QuantizedActivation {
  int block = 0;              // 32 or 256
  std::vector<int8_t> q;      // [n]
  std::vector<float> scale;   // [n / block]
  std::vector<int16_t> sums;  // [n / 16]: sum of q over each group of 16
};

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
    for (int j = 0; j < block; ++j) qb[j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
  }
  for (int64_t g = 0; g < n / 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += out.q[static_cast<size_t>(16 * g + l)];
    out.sums[static_cast<size_t>(g)] = static_cast<int16_t>(sum);
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
