// SPDX-License-Identifier: Apache-2.0
#pragma once
// Vector primitives behind every kernel, one struct per instruction set with the same static
// functions: ScalarOps (portable, always compiled), Avx2Ops (AVX2 + FMA + F16C), Avx512Ops
// (AVX-512 F/BW/VL/DQ; uses AVX-512 VNNI for Q8_0 when present). Kernels are templates over these
// structs, instantiated with VariantOps in the kernel variants (kernels/variant.h), so each kernel
// exists once per instruction set and the tests run every one this CPU can (kernels/isa.h). All
// math is F32; the Q8_0 dot is exact in int32 per block.
//
// One header per instruction set: simd_scalar.h, simd_avx2.h, simd_avx512.h; this one gathers
// them and adds what is written once over any of them.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/simd_avx2.h"
#include "kernels/simd_avx512.h"
#include "kernels/simd_features.h"
#include "kernels/simd_scalar.h"

namespace protokv::kernels {

// The widest primitives this translation unit is compiled for: a kernel variant's own.
#if defined(PROTOKV_HAVE_AVX512)
using VariantOps = Avx512Ops;
#elif defined(PROTOKV_HAVE_AVX2)
using VariantOps = Avx2Ops;
#else
using VariantOps = ScalarOps;
#endif

// In-place softmax with the primitives of one instruction set; all -inf gives all zeros.
template <class Ops>
void softmax_with(float* x, int64_t n) {
  if (n <= 0) return;
  const float max_value = Ops::max(x, n);
  if (max_value == -std::numeric_limits<float>::infinity()) {
    std::fill(x, x + n, 0.0f);
    return;
  }
  const float sum = Ops::exp_shifted_sum(x, max_value, n);
  Ops::scale(x, 1.0f / sum, n);
}

}  // namespace protokv::kernels
