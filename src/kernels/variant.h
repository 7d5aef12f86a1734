// SPDX-License-Identifier: Apache-2.0
#pragma once
// The kernels compiled once per instruction set. Every source in kernels/variant/ is built once
// per variant (CMakeLists.txt: scalar; avx2 = AVX2 + FMA + F16C; avx512 = AVX-512 F/BW/VL/DQ/VNNI
// on top of avx2), into namespace kernels::<variant>, and each build fills one KernelVariant
// table with its functions. kernels/dispatch.cpp picks the table this CPU runs (kernels/isa.h),
// so one binary runs on any x86-64 CPU and no part of the build needs -march=native.
#include <cstdint>
#include <span>

#include "kernels/clustering.h"
#include "kernels/kernels.h"
#include "protokv/dtype.h"

namespace protokv::kernels {

struct QuantizedActivation;

// One variant's kernels; the contracts are those of the functions of the same names in
// kernels.h and kernels/isa.h.
struct KernelVariant {
  float (*dot)(const float* a, const float* b, int64_t n);
  float (*exp)(float x);  // the vector exp's arithmetic on one value (tests)
  void (*rmsnorm)(float* out, const float* x, const float* weight, int64_t n, float eps);
  void (*softmax)(float* x, int64_t n);
  void (*matvec_rows)(const WeightMatrix& w, const float* x, int64_t n, float* y);
  void (*matmul)(const WeightMatrix& w, const float* x, int64_t n, float* y);
  void (*matmul_as_llama_cpp)(const WeightMatrix& w, const float* x, int64_t n, float* y,
                              bool batched);
  void (*attention_as_llama_cpp)(const float* q, const float* keys, const float* values, int64_t n,
                                 int d, float scale, bool batched, float* out);
  void (*flash_attention_as_llama_cpp)(const float* q, int64_t q_stride, int64_t rows,
                                       ValueRows keys, ValueRows values, int64_t n_first, int d,
                                       float scale, const LlamaCppFlashAttention& how, float* out,
                                       int64_t out_stride);
  void (*swiglu_as_llama_cpp)(float* gate, const float* up, int64_t n);
  // One row of a legacy 32-value quant type (Q4_0/Q4_1/Q5_0/Q5_1) against ggml's Q8_0 / Q8_1
  // activation blocks: what matvec computes per row (tests).
  float (*legacy_quant_dot)(DType type, const void* row, const QuantizedActivation& x,
                            int64_t cols);
  // One row of `n` values of any dtype to F32, as prefill converts weight panels (tests).
  void (*weight_row_to_f32)(DType type, const void* row, float* out, int64_t n);
  void (*attention_prefill_heads)(HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                                  int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                                  int head_dim, int64_t window);
  void (*attention_prefill_cached)(HeadsView q, std::span<const KvHeadRows> kv_heads,
                                   MutableHeadsView out, int64_t n_queries, int n_heads,
                                   int head_dim);
  void (*attention_prefill)(const float* q, const float* k, const float* v, int64_t n, int d,
                            float* out);
  // n = the sum of the segments' counts.
  void (*attention_decode_group_segments)(const float* q, int group,
                                          std::span<const KeySegment> keys, ValueRows values,
                                          const float* log_weights, int64_t n, int d, float* out,
                                          float* probs);
  void (*attention_decode_gathered_segments)(const float* q, std::span<const KeySegment> keys,
                                             ValueRows values, const float* log_weights,
                                             std::span<const int32_t> indices, int d, float* out,
                                             float* probs);
  // ProtoKV's clustering loops (kernels/clustering.h).
  void (*chunk_pass_range)(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                           int64_t m_end, float* norms, float* chunk_sums, float* delta,
                           const LocalDots& local);
  void (*rows_dot)(const float* rows, int64_t begin, int64_t end, int d, const float* vec,
                   float* out);
  void (*assign_to_prototypes)(const float* keys, int64_t n, int d, const float* prototypes,
                               int count, int32_t* out);
};

#if defined(PROTOKV_KERNEL_VARIANT)
// Inside a variant's build: its own functions, each defined in one kernels/variant/ source.
namespace PROTOKV_KERNEL_VARIANT {
float dot(const float* a, const float* b, int64_t n);
float exp(float x);
void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps);
void softmax(float* x, int64_t n);
void matvec_rows(const WeightMatrix& w, const float* x, int64_t n, float* y);
void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y);
void matmul_as_llama_cpp(const WeightMatrix& w, const float* x, int64_t n, float* y, bool batched);
void attention_as_llama_cpp(const float* q, const float* keys, const float* values, int64_t n,
                            int d, float scale, bool batched, float* out);
void flash_attention_as_llama_cpp(const float* q, int64_t q_stride, int64_t rows, ValueRows keys,
                                  ValueRows values, int64_t n_first, int d, float scale,
                                  const LlamaCppFlashAttention& how, float* out,
                                  int64_t out_stride);
void swiglu_as_llama_cpp(float* gate, const float* up, int64_t n);
float legacy_quant_dot(DType type, const void* row, const QuantizedActivation& x, int64_t cols);
void weight_row_to_f32(DType type, const void* row, float* out, int64_t n);
void attention_prefill_heads(HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                             int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                             int head_dim, int64_t window);
void attention_prefill_cached(HeadsView q, std::span<const KvHeadRows> kv_heads,
                              MutableHeadsView out, int64_t n_queries, int n_heads, int head_dim);
void attention_prefill(const float* q, const float* k, const float* v, int64_t n, int d,
                       float* out);
void attention_decode_group_segments(const float* q, int group, std::span<const KeySegment> keys,
                                     ValueRows values, const float* log_weights, int64_t n, int d,
                                     float* out, float* probs);
void attention_decode_gathered_segments(const float* q, std::span<const KeySegment> keys,
                                        ValueRows values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs);
void chunk_pass_range(const float* keys, int64_t n, int d, int64_t k, int64_t m_begin,
                      int64_t m_end, float* norms, float* chunk_sums, float* delta,
                      const LocalDots& local);
void rows_dot(const float* rows, int64_t begin, int64_t end, int d, const float* vec, float* out);
void assign_to_prototypes(const float* keys, int64_t n, int d, const float* prototypes, int count,
                          int32_t* out);
// The variant's table (kernels/variant/table.cpp): the one symbol its object exports.
const KernelVariant& kernel_table();
}  // namespace PROTOKV_KERNEL_VARIANT
#endif

}  // namespace protokv::kernels
