// SPDX-License-Identifier: Apache-2.0
#pragma once
// llama.cpp's own float arithmetic for the parts of a forward pass that protokv otherwise rounds
// its own way (SessionOptions::llama_cpp_arithmetic): attention without flash attention over an
// F32 cache. The orders are those of ggml-cpu (llama.cpp's CPU backend, upstream de3ff81) built
// by GCC 12 at -O3 for the instruction set, read from its source and its machine code
// (docs/DESIGN.md §llama.cpp's arithmetic). They are written as scalar IEEE operations (std::fma
// where ggml fuses, separate statements where it rounds a product first), so that each
// instruction set's order can be computed, and tested, on any CPU: the references of the SIMD
// kernels kernels::attention_as_llama_cpp and swiglu_as_llama_cpp (kernels/isa.h), which compute
// the same at vector speed.
#include <cstdint>

#include "kernels/isa.h"

namespace protokv::kernels::ggml_order {

// ggml_vec_dot_f32(n, x, y) as ggml-cpu built for `isa` sums it: a build without SIMD (kScalar)
// adds the float products in double; AVX2 / AVX-512 keep four 8- / 16-lane FMA accumulators over
// the whole steps of 32 / 64 values, reduce them (GGML_F32x8_REDUCE / GGML_F32x16_REDUCE), then
// add the leftovers to that float as GCC vectorises `sumf += x[i]*y[i]`: the first multiples of
// 4 / 8 as rounded products, the last 0-3 / 0-7 with scalar FMAs.
float dot_f32(Isa isa, const float* x, const float* y, int64_t n);

// e^x as one lane of ggml_v_expf (the AVX-512 and AVX2 forms differ in their last steps), or as
// expf for a build without SIMD: the exponentials of ggml_vec_soft_max_f32.
float exp(Isa isa, float x);

// gate[i] = silu(gate[i]) * up[i] as ggml_vec_swiglu_f32 computes it: the whole vectors of 8 / 16
// lanes with ggml_v_silu (x / (1 + exp(-x))), the rest (all of it without SIMD) with expf.
void swiglu(Isa isa, float* gate, const float* up, int64_t n);

// out[d] = the attention of one query row q[d] over n entries (F32 keys and values [n, d], all
// visible to the query) as llama.cpp computes it without flash attention, F32 cache:
//   kq   = ggml_mul_mat(k, q): dot_f32 of each key with q (q is a permuted view, so never
//          tinyBLAS);
//   p    = ggml_soft_max_ext(kq, mask, scale): kq * scale, its maximum, exp of the
//          differences summed per vector of lanes (padded with the masked cells' zeros; llama.cpp
//          pads the cells it attends over to a multiple of 256) into a double, times
//          (float)(1 / sum);
//   out  = ggml_mul_mat(v^T, p): per output value, dot_f32 over the entries for one query
//          (decode), or llamafile's tinyBLAS (one FMA accumulator of 8 / 16 lanes, then its
//          horizontal sum) when llama.cpp multiplies a batch of two or more queries (`batched`)
//          and d is a multiple of 4.
// Single-threaded; allocates per thread once.
void attention(Isa isa, const float* q, const float* keys, const float* values, int64_t n, int d,
               float scale, bool batched, float* out);

}  // namespace protokv::kernels::ggml_order
