// SPDX-License-Identifier: Apache-2.0
#pragma once
// Instruction-set variants of the kernels (kernels/variant.h). The functions in kernels.h run the
// variant active_isa() picks at run time from the CPU's features; tests and benchmarks call each
// variant this CPU runs explicitly through the Isa overloads below, so the scalar path is always
// exercised too.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/kernels.h"
#include "protokv/dtype.h"

namespace protokv::kernels {

enum class Isa { kScalar, kAvx2, kAvx512 };

struct QuantizedActivation;

// Every variant built into this binary that this CPU can run, scalar first.
std::vector<Isa> available_isas();
// The variant the kernels without an Isa argument (kernels.h) run: the widest of
// available_isas(), or the one the environment variable PROTOKV_ISA names (scalar | avx2 |
// avx512), so that every variant can be run end to end on one machine. Read once. Throws Error
// when PROTOKV_ISA names a variant this binary lacks or this CPU cannot run: load_model(), Session
// and PrefilledPrompt call it first, so the error surfaces there and never inside a parallel
// region.
Isa active_isa();
std::string_view isa_name(Isa isa);
// What a variant needs of the CPU, in words (for messages and `protokv info`).
std::string_view isa_requirements(Isa isa);

// Same contracts as the functions of the same names in kernels.h. `isa` must be one of
// available_isas().
float dot(Isa isa, const float* a, const float* b, int64_t n);
void rmsnorm(Isa isa, float* out, const float* x, const float* weight, int64_t n, float eps);
void softmax(Isa isa, float* x, int64_t n);
void matvec(Isa isa, const WeightMatrix& w, const float* x, float* y);
void matvec_rows(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y);
void matmul_as_llama_cpp(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y,
                         bool batched);
void attention_as_llama_cpp(Isa isa, const float* q, const float* keys, const float* values,
                            int64_t n, int d, float scale, bool batched, float* out);
void flash_attention_as_llama_cpp(Isa isa, const float* q, ValueRows keys, ValueRows values,
                                  int64_t n, int d, float scale, const LlamaCppFlashAttention& how,
                                  float* out);
void flash_attention_as_llama_cpp(Isa isa, const float* q, int64_t q_stride, int64_t rows,
                                  ValueRows keys, ValueRows values, int64_t n_first, int d,
                                  float scale, const LlamaCppFlashAttention& how, float* out,
                                  int64_t out_stride);
void swiglu_as_llama_cpp(Isa isa, float* gate, const float* up, int64_t n);
void matmul(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y);
void attention_prefill_heads(Isa isa, HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                             int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                             int head_dim, int64_t window = 0);
void attention_decode_group(Isa isa, const float* q, int group, const float* keys,
                            const float* values, const float* log_weights, int64_t n, int d,
                            float* out, float* probs);
void attention_decode_gathered(Isa isa, const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs);
void attention_decode_gathered_segments(Isa isa, const float* q, std::span<const KeySegment> keys,
                                        ValueRows values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs);
void attention_decode_group_segments(Isa isa, const float* q, int group,
                                     std::span<const KeySegment> keys, ValueRows values,
                                     const float* log_weights, int d, float* out, float* probs);
// The variant's vector exp on one value (its accuracy is tested over the float range).
float vector_exp(Isa isa, float x);
// One row of a legacy quant type (Q4_0/Q4_1/Q5_0/Q5_1, `cols` values) against ggml's Q8_0 / Q8_1
// activation blocks (kernels/quant_matvec.h): what matvec computes for that row.
float legacy_quant_dot(Isa isa, DType type, const void* row, const QuantizedActivation& x,
                       int64_t cols);
// One weight row of `n` values to F32 as the variant's prefill converts it: bit-identical to
// dequantize_row for every dtype.
void weight_row_to_f32(Isa isa, DType type, const void* row, float* out, int64_t n);

}  // namespace protokv::kernels
