// SPDX-License-Identifier: Apache-2.0
// Element-wise and reduction kernels of one instruction set: dot, RMSNorm, softmax, exp.
#include <cmath>

#include "kernels/simd.h"
#include "kernels/variant.h"

namespace protokv::kernels::PROTOKV_KERNEL_VARIANT {

float dot(const float* a, const float* b, int64_t n) {
  return VariantOps::dot(a, b, n);
}

float exp(float x) {
  return VariantOps::exp(x);
}

// RMSNorm as ggml's rms_norm: each square in float, their sum in double in index order, the mean
// rounded to float. A last-bit difference in the mean here moves a later int8 or F16 rounding of
// the activations (quant_matvec.h), which then differs from llama.cpp's by a whole step.
void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const auto mean_square = static_cast<float>(sum / static_cast<double>(n));
  VariantOps::scaled_mul(out, x, 1.0f / std::sqrt(mean_square + eps), weight, n);
}

void softmax(float* x, int64_t n) {
  softmax_with<VariantOps>(x, n);
}

}  // namespace protokv::kernels::PROTOKV_KERNEL_VARIANT
