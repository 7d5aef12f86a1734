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

void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps) {
  const float mean_square = VariantOps::sum_squares(x, n) / static_cast<float>(n);
  VariantOps::scaled_mul(out, x, 1.0f / std::sqrt(mean_square + eps), weight, n);
}

void softmax(float* x, int64_t n) {
  softmax_with<VariantOps>(x, n);
}

}  // namespace protokv::kernels::PROTOKV_KERNEL_VARIANT
