// SPDX-License-Identifier: Apache-2.0
// llama.cpp's attention and SwiGLU arithmetic at SIMD speed: what kernels/llama_cpp_order.h's
// portable functions compute for this variant's instruction set, to the bit (tests/
// test_llama_cpp_order.cpp), with the dot products and exponentials in vector registers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/simd.h"
#include "kernels/variant.h"

namespace protokv::kernels {
namespace {

// The lanes of one vector reduced as ggml_vec_soft_max_f32 and tinyBLAS's hsum do (GCC's
// _mm512_reduce_add_ps; the AVX2 hsum): upper half plus lower half down to four lanes, then
// (l0 + l2) + (l1 + l3). Here each "lane" is a row of d values (one per output value).
[[maybe_unused]] void horizontal_sum_rows(float* lanes, int count, int d, float* out) {
  for (int width = count / 2; width >= 4; width /= 2)
    for (int l = 0; l < width; ++l) {
      float* a = lanes + static_cast<int64_t>(l) * d;
      const float* b = lanes + static_cast<int64_t>(l + width) * d;
      for (int i = 0; i < d; ++i) a[i] = b[i] + a[i];
    }
  const float* l0 = lanes;
  const float* l1 = lanes + d;
  const float* l2 = lanes + 2 * static_cast<int64_t>(d);
  const float* l3 = lanes + 3 * static_cast<int64_t>(d);
  for (int i = 0; i < d; ++i) out[i] = (l0[i] + l2[i]) + (l1[i] + l3[i]);
}

// out[i] = sum over entries of values[e][i] * p[e] in ggml_vec_dot_f32's order (four
// accumulators of `lanes` lanes: slot e % (4 lanes)) or tinyBLAS's (one accumulator: slot
// e % lanes), each slot a row of d accumulators advanced with FMAs.
template <class Ops>
void weighted_values(const float* p, const float* values, int64_t n, int d, bool tinyblas,
                     float* out) {
  constexpr int lanes = Ops::kGgmlLanes;
  if constexpr (lanes == 0) {  // no SIMD: float products summed in double
    thread_local std::vector<double> sums;
    sums.assign(static_cast<size_t>(d), 0.0);
    for (int64_t e = 0; e < n; ++e)
      for (int i = 0; i < d; ++i) {
        const float product = values[e * d + i] * p[e];
        sums[static_cast<size_t>(i)] += static_cast<double>(product);
      }
    for (int i = 0; i < d; ++i) out[i] = static_cast<float>(sums[static_cast<size_t>(i)]);
  } else {
    const int slots = tinyblas ? lanes : 4 * lanes;
    thread_local std::vector<float> acc;  // [slots, d]
    acc.assign(static_cast<size_t>(slots) * static_cast<size_t>(d), 0.0f);
    for (int64_t e = 0; e < n; ++e) {
      float* a = acc.data() + (e % slots) * d;
      const float* v = values + e * d;
      const float weight = p[e];
      for (int i = 0; i < d; ++i) a[i] = std::fma(v[i], weight, a[i]);
    }
    float* rows = acc.data();
    if (!tinyblas) {  // GGML_F32_VEC_REDUCE: (s0 + s2) + (s1 + s3), lane by lane
      for (int l = 0; l < lanes; ++l) {
        float* s0 = rows + static_cast<int64_t>(l) * d;
        const float* s1 = s0 + static_cast<int64_t>(lanes) * d;
        const float* s2 = s1 + static_cast<int64_t>(lanes) * d;
        const float* s3 = s2 + static_cast<int64_t>(lanes) * d;
        for (int i = 0; i < d; ++i) s0[i] = (s0[i] + s2[i]) + (s1[i] + s3[i]);
      }
      if constexpr (Ops::kGgmlHaddReduce) {  // halves, then two _mm_hadd_ps
        for (int l = 0; l < 4; ++l) {
          float* a = rows + static_cast<int64_t>(l) * d;
          const float* b = rows + static_cast<int64_t>(l + 4) * d;
          for (int i = 0; i < d; ++i) a[i] = a[i] + b[i];
        }
        const float* t0 = rows;
        const float* t1 = rows + d;
        const float* t2 = rows + 2 * static_cast<int64_t>(d);
        const float* t3 = rows + 3 * static_cast<int64_t>(d);
        for (int i = 0; i < d; ++i) out[i] = (t0[i] + t1[i]) + (t2[i] + t3[i]);
        return;
      }
    }
    horizontal_sum_rows(rows, lanes, d, out);
  }
}

template <class Ops>
void attention_as_llama_cpp_impl(const float* q, const float* keys, const float* values, int64_t n,
                                 int d, float scale, bool batched, float* out) {
  thread_local std::vector<float> p;
  p.resize(static_cast<size_t>(n));
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) {
    const float dot = Ops::dot_f32_as_ggml(keys + e * d, q, d);
    p[static_cast<size_t>(e)] = dot * scale;
    max = std::max(max, p[static_cast<size_t>(e)]);
  }
  const auto inverse = static_cast<float>(1.0 / Ops::exp_sum_as_ggml(p.data(), max, n));
  for (float& value : p) value *= inverse;
  weighted_values<Ops>(p.data(), values, n, d, batched && d % 4 == 0, out);
}

}  // namespace

namespace PROTOKV_KERNEL_VARIANT {

void attention_as_llama_cpp(const float* q, const float* keys, const float* values, int64_t n,
                            int d, float scale, bool batched, float* out) {
  attention_as_llama_cpp_impl<VariantOps>(q, keys, values, n, d, scale, batched, out);
}

void swiglu_as_llama_cpp(float* gate, const float* up, int64_t n) {
  VariantOps::swiglu_as_ggml(gate, up, n);
}

}  // namespace PROTOKV_KERNEL_VARIANT
}  // namespace protokv::kernels
