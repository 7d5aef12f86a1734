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
#include "kernels/kernels.h"

namespace protokv::kernels::ggml_order {

// ggml_vec_dot_f32(n, x, y) as ggml-cpu built for `isa` sums it: a build without SIMD (kScalar)
// adds the float products in double; AVX2 / AVX-512 keep four 8- / 16-lane FMA accumulators over
// the whole steps of 32 / 64 values, reduce them (GGML_F32x8_REDUCE / GGML_F32x16_REDUCE), then
// add the leftovers to that float as GCC vectorises `sumf += x[i]*y[i]`: the first multiples of
// 4 / 8 as rounded products, the last 0-3 / 0-7 with scalar FMAs.
float dot_f32(Isa isa, const float* x, const float* y, int64_t n);

// ggml_vec_dot_f16(n, x, y) of F16 values (given as the floats they are, so that every product
// is exact in float) as ggml-cpu built for `isa` sums it: the whole steps of 32 / 64 values as
// dot_f32's vector part, then the rest (all of it without SIMD) as float products added in double.
float dot_f16(Isa isa, const float* x, const float* y, int64_t n);

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

// The rows of llama.cpp's ubatch from which ggml_flash_attn_ext takes its tiled path
// (GGML_FA_TILE_Q), and the cells of one of its tiles (GGML_FA_TILE_KV).
inline constexpr int64_t kFlashTileRows = 64;
inline constexpr int64_t kFlashTileCells = 64;
// llama.cpp attends over its cache's cells padded to a multiple of 256 (llama_kv_cache::get_n_kv);
// a decode step over 512 of them or more splits them over its threads.
inline constexpr int64_t kFlashCachePadding = 256;
inline constexpr int64_t kFlashSplitCells = 512;

// Whether ggml_flash_attn_ext takes its tiled path for `how` (its one-chunk path otherwise): a
// ubatch of kFlashTileRows or more, K and V of one type, and with SIMD a head width that is a
// multiple of the vector's lanes.
bool flash_attention_is_tiled(Isa isa, const LlamaCppFlashAttention& how, int d);

// The cells of each of llama.cpp's threads when ggml_flash_attn_ext splits a decode step over n
// entries (its padded cells: kFlashCachePadding, at least kFlashSplitCells, K and V of one type,
// how.threads > 1); 0 when it does not.
int64_t flash_attention_split(const LlamaCppFlashAttention& how, int64_t n);

// out[d] = the attention of one query row over n entries (all visible) as ggml-cpu's
// ggml_flash_attn_ext computes it (llama.cpp -fa on; F32 or F16 K/V, the softmax scale only;
// with how.f16_keys / f16_values the rows are read rounded to F16, as llama.cpp casts them):
//   one chunk (decode; ubatches of fewer than 64 rows): entry by entry, s = the query's dot with
//     the key (dot_f32, or dot_f16 of the query rounded to F16 over F16 keys) * scale; when s
//     raises the running maximum M, the accumulator and the sum are scaled by expf(M_old - s),
//     otherwise the entry's weight is expf(s - M) (libm); acc += v * weight (FMAs; rounded to F16
//     after every step for F16 values), S = S * scale + weight (one FMA); out = acc * (1 / S).
//   split (a decode step over 512 padded cells or more with how.threads > 1): each thread's
//     chunk of cells as one chunk, the partial results merged in thread order (acc = fma(acc,
//     expf(M - M_new), part * expf(M_part - M_new)), S likewise), then * (1 / S). llama.cpp's
//     result therefore depends on its thread count; with one thread it equals one chunk.
//   tiled (ubatches of 64 rows or more): cells in tiles of 64; each score a sequential FMA dot
//     from the head's first value (simd_gemm), * scale; a tile that raises M scales acc and S by
//     expf(M_old - M_new); S = (float)(S + the tile's ggml_vec_soft_max_f32 sum, in double); acc
//     += v * p cell after cell (FMAs); out = acc * (1 / S).
// A build without SIMD (kScalar) is taken as one for a CPU without FMA: no product fused.
void flash_attention(Isa isa, const float* q, const float* keys, const float* values, int64_t n,
                     int d, float scale, const LlamaCppFlashAttention& how, float* out);

}  // namespace protokv::kernels::ggml_order
