// SPDX-License-Identifier: Apache-2.0
#pragma once
// CPU kernels. Each has a naive reference in tests/. Shapes are in the comments; all math is F32.
//
// Threading (one level at a time, docs/DESIGN.md §3.5):
// - matvec, matmul, rmsnorm_rows and attention_prefill_heads parallelise inside (OpenMP, and
//   OpenBLAS which shares the OpenMP pool). Call them from serial code.
// - dot, rmsnorm, softmax, rope, attention_prefill, attention_decode and attention_decode_group
//   are single-threaded: call them from the caller's own `#pragma omp parallel for` (e.g. over
//   heads). BLAS calls inside then run single-threaded, as OpenBLAS does inside a parallel
//   region.
// - Any of them may be called from inside a parallel region; the parallel ones then run on the
//   calling thread only (nested parallelism stays off).
//
// Each kernel exists once per compiled instruction set (scalar, AVX2, AVX-512); these functions
// use the best one. kernels/isa.h exposes the variants for tests and benchmarks.
#include <cstdint>
#include <span>
#include <vector>

#include "protokv/key_segment.h"
#include "protokv/tensor.h"

namespace protokv::kernels {

float dot(const float* a, const float* b, int64_t n);

// out[i] = x[i] / rms(x) * weight[i], rms over n values. out may alias x.
void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps);
// Same for `rows` rows of n values each.
void rmsnorm_rows(float* out, const float* x, const float* weight, int64_t rows, int64_t n,
                  float eps);

// In-place softmax over n values (max-subtracted, F32). Logits of any finite magnitude give
// finite results; if every value is -inf the output is all zeros (nothing to attend to).
void softmax(float* x, int64_t n);

// Rotary embedding in place for one token: x [n_heads, head_dim] at token position `pos`.
// neox=false rotates pairs (2i, 2i+1) (Meta/llama order); neox=true rotates (i, i + d/2).
// Pair i turns by the angle pos * theta^(-2i/head_dim) (computed in double).
void rope(float* x, int n_heads, int head_dim, int32_t pos, float theta, bool neox);
// Same for n_tokens tokens: token t's heads start at x + t * token_stride, at positions[t].
// Single-threaded.
void rope_rows(float* x, int64_t n_tokens, int64_t token_stride, int n_heads, int head_dim,
               const int32_t* positions, float theta, bool neox);
// The per-model part of RoPE, built once (a Session owns one): the inverse frequencies of the
// rot_dims/2 rotated pairs of each head, freq_scale * theta^(-2i/rot_dims) / freq_factors[i]
// (ggml_rope_ext without YaRN: freq_scale = 1 / linear factor; freq_factors from Llama 3.x's
// rope_freqs.weight). Dimensions past rot_dims pass through unrotated. Using it, RoPE allocates
// nothing.
struct RopeTable {
  std::vector<double> inv_freq;  // [rot_dims / 2]
  int head_dim = 0;
  int rot_dims = 0;  // even, <= head_dim
  bool neox = false;
  // ggml's arithmetic instead (ggml_rope_cache_init, rotate_pairs; SessionOptions::
  // llama_cpp_arithmetic): pair i's angle is freq_scale * (theta_i / freq_factors[i]) in float,
  // theta_i = pos * theta_scale^i by repeated float multiplication (theta_scale = powf(theta,
  // -2 / rot_dims)), cosf / sinf of it, and the rotation x0 c - x1 s, x0 s + x1 c with the
  // first product of each fused (as GCC contracts ggml's expression).
  bool ggml_order = false;
  float theta_scale = 0.0f;
  float freq_scale = 1.0f;
  std::vector<float> freq_factors;  // [rot_dims / 2], or empty for all 1
};
RopeTable make_rope_table(int head_dim, float theta, bool neox);
RopeTable make_rope_table(int head_dim, int rot_dims, float theta, bool neox, float freq_scale,
                          const float* freq_factors, bool ggml_order = false);
// rope_rows with a prebuilt table; same results as the overload above (unless the table has
// ggml_order: ggml's float angles then). Single-threaded.
void rope_rows(float* x, int64_t n_tokens, int64_t token_stride, int n_heads,
               const RopeTable& table, const int32_t* positions);

// y[rows] = W[rows, cols] · x[cols], W in any supported dtype. Parallel over rows.
// Q8_0 and K-quant weights: as in ggml, x is quantised to int8 per block of the weight type (32
// values for Q8_0, 256 for K-quants, scale max|x| / 127) and each block is multiplied in int32
// (kernels/quant_matvec.h), so the result differs from the dequantised F32 product by at most
// sum over blocks of (scale / 2) * sum |w| (tests/test_quant.cpp). Q4_0/Q4_1/Q5_0/Q5_1 take
// ggml's Q8_0 / Q8_1 activation blocks and its vec_dot arithmetic (matvec.cpp).
void matvec(const WeightMatrix& w, const float* x, float* y);

// n independent mat-vecs, y[i, rows] = W · x[i, cols] (decode steps of n sequences batched):
// each row's result equals matvec(W, x[i]) bit for bit, but W is streamed from memory once for
// all n (each weight row is dotted with every x[i] while it is in cache).
void matvec_rows(const WeightMatrix& w, const float* x, int64_t n, float* y);

// Y[n, rows] = X[n, cols] · W^T (prefill projections), W in any supported dtype, through BLAS.
// F32 calls sgemm directly; other dtypes convert W in panels of rows to F32 scratch (per thread,
// never the whole matrix) and run one sgemm per panel. n = 1 uses matvec, and so does n < 4 for
// F32 and BF16; quantised and F16 weights with n >= 2 keep F32 activations (their matvec rounds
// the activations as llama.cpp's does), so that prefill gives the same result whatever its
// chunking, except for a chunk of a single row, which takes the mat-vec.
void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y);
// Y[n, rows] = X[n, cols] · W^T as llama.cpp's CPU backend multiplies rows
// (SessionOptions::llama_cpp_arithmetic). `batched`: the rows are (part of) a batch of two or
// more that llama.cpp multiplies at once; then F32 and F16 rows (F16 with the activations
// rounded to F16) take llamafile tinyBLAS's order where it takes the shape (cols a multiple of
// its 8 / 16 lanes, rows of 4: one lane accumulator per (row, token), then its horizontal sum).
// Otherwise, and for rows multiplied one by one, F32 and F16 take ggml_vec_dot_f32's /
// ggml_vec_dot_f16's order. The legacy quants go row by row as matvec_rows either way (ggml's
// repacked Q4_0 and vec_dot arithmetic, which its batches share); other types take matvec
// one by one and matmul in a batch.
void matmul_as_llama_cpp(const WeightMatrix& w, const float* x, int64_t n, float* y, bool batched);
// out[d] = one query over n F32 entries (keys/values [n, d], all visible) as llama.cpp's CPU
// backend computes attention without flash attention: kernels/llama_cpp_order.h's
// ggml_order::attention for the instruction set this CPU runs, to the bit, at SIMD speed.
// `batched`: a query of a batch of two or more (llama.cpp sums the values by tinyBLAS then).
// Single-threaded.
void attention_as_llama_cpp(const float* q, const float* keys, const float* values, int64_t n,
                            int d, float scale, bool batched, float* out);
// How llama.cpp's flash attention (ggml_flash_attn_ext on its CPU backend: -fa on, the default
// -fa auto there) reads one query's head: the ubatch the query belongs to picks ggml's path, the
// cache types its arithmetic.
struct LlamaCppFlashAttention {
  // Rows of llama.cpp's ubatch (1: a decode step). 64 or more, with a head width that is a
  // multiple of the vector width, take ggml's tiled path; fewer its one-chunk path.
  int64_t batch_rows = 1;
  // K / V of type F16 (llama.cpp's default -ctk / -ctv f16, and what it casts an F32 cache to for
  // flash attention): F32 keys / values are read rounded to F16. The one-chunk path then rounds
  // the query to F16 for ggml_vec_dot_f16 and, for F16 values, accumulates the output in F16; the
  // tiled path (K and V of one type) reads both as F32.
  bool f16_keys = false;
  bool f16_values = false;
  // llama.cpp's thread count (-t): a decode step over 512 padded cells or more splits the cells
  // over its threads (ggml_order::flash_attention_split), which changes the rounding.
  int threads = 1;
};
// out[d] = one query over n entries (keys/values [n, d], F32 or F16 rows as a cache holds them,
// all visible) as llama.cpp's flash attention computes it (ggml_order::flash_attention for the
// instruction set this CPU runs, to the bit), converting one row at a time. Single-threaded;
// allocates per thread once.
void flash_attention_as_llama_cpp(const float* q, ValueRows keys, ValueRows values, int64_t n,
                                  int d, float scale, const LlamaCppFlashAttention& how,
                                  float* out);
// The same for `rows` consecutive query rows of one head of a ubatch, causal: row r (at q +
// r * q_stride, its output at out + r * out_stride) over the first n_first + r entries. Each row's
// result is the one-row call's; the tiled path converts each tile of keys and values once for
// all of them (as ggml shares a tile among its ubatch's rows).
void flash_attention_as_llama_cpp(const float* q, int64_t q_stride, int64_t rows, ValueRows keys,
                                  ValueRows values, int64_t n_first, int d, float scale,
                                  const LlamaCppFlashAttention& how, float* out,
                                  int64_t out_stride);
// gate[i] = silu(gate[i]) * up[i] as ggml_vec_swiglu_f32 (ggml_order::swiglu), in place.
void swiglu_as_llama_cpp(float* gate, const float* up, int64_t n);

// Causal attention of one query head over its KV head, all n tokens of a prefill:
// q, k, v [n, d]; out [n, d]; query i sees keys 0..i. Tiled with online softmax: never
// materialises an n×n matrix. Logits scaled by 1/sqrt(d). Single-threaded.
void attention_prefill(const float* q, const float* k, const float* v, int64_t n, int d,
                       float* out);

// Rows of several heads inside one tensor: element c of head h at token t is
// data[t * token_stride + h * head_stride + c]. E.g. the Q projection output [n, n_heads * d]
// is {q, n_heads * d, d}; a per-head cache [n_kv_heads][n, d] is {k, d, n * d}.
struct HeadsView {
  const float* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};
struct MutableHeadsView {
  float* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// Causal attention of all heads of one layer over a prefill chunk: n_queries query tokens at
// positions n_past .. n_past + n_queries - 1 over keys/values of tokens 0 .. n_past + n_queries - 1
// (query token t sees keys 0 .. n_past + t). Query head h uses KV head h / (n_heads / n_kv_heads);
// the group of query heads sharing a KV head is processed together (stacked as GEMM rows) so
// each K/V tile is read once per group. Parallel (OpenMP) over (KV head, query tile) work items;
// BLAS runs single-threaded inside. out [n_queries] tokens x [n_heads] heads x head_dim.
// window > 0: sliding-window attention (Gemma 3's local layers), query token t sees only keys
// t + n_past - window < j <= t + n_past; key tiles left of the window are skipped.
void attention_prefill_heads(HeadsView q, HeadsView k, HeadsView v, MutableHeadsView out,
                             int64_t n_queries, int64_t n_past, int n_heads, int n_kv_heads,
                             int head_dim, int64_t window = 0);

// One KV head's entries as attention_prefill_cached reads them: rows k/v [n_past + n_queries, d]
// (row i at k + i * token_stride), the first n_past of them already in the cache before the chunk
// (possibly compressed: heads may differ in n_past) and the last n_queries the chunk's own.
// log_weights [n_past + n_queries] (nullable) are added to the scaled logits (Chelsea Eq. 2).
struct KvHeadRows {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t token_stride = 0;
  const float* log_weights = nullptr;
  int64_t n_past = 0;
  // Sliding-window attention: window > 0 and positions [n_past + n_queries] (each row's token
  // position; the last n_queries are the chunk's queries): a query at position p sees only rows at
  // positions p - window < pos <= p.
  int64_t window = 0;
  const int32_t* positions = nullptr;
  bool positions_ascending = false;  // lets the kernel skip key tiles left of every window
};

// Causal attention of a prefill chunk over a ragged cache: query token t of KV head kv's group
// sees that head's rows 0 .. n_past(kv) + t. With equal n_past and no log-weights this computes
// exactly what attention_prefill_heads computes. Parallel like attention_prefill_heads; one
// KvHeadRows per KV head (kv_heads.size() == n_kv_heads).
void attention_prefill_cached(HeadsView q, std::span<const KvHeadRows> kv_heads,
                              MutableHeadsView out, int64_t n_queries, int n_heads, int head_dim);

// One query q [d] over n cached entries keys/values [n, d]; log_weights [n] (nullable) added to
// the scaled logits (Chelsea Eq. 2). out [d]. If probs is non-null, the softmax weights [n] are
// written there. Single-threaded.
void attention_decode(const float* q, const float* keys, const float* values,
                      const float* log_weights, int64_t n, int d, float* out, float* probs);

// The `group` query heads that share one KV head, in one pass over its keys and values (each
// read once instead of `group` times): q [group, d], out [group, d], probs [group, n] (nullable),
// same semantics as attention_decode per head. Single-threaded.
void attention_decode_group(const float* q, int group, const float* keys, const float* values,
                            const float* log_weights, int64_t n, int d, float* out, float* probs);

// attention_decode_group over keys given as consecutive segments (PoD, DESIGN §5 pod: a head
// whose distant entries' keys are read from a lower layer): the entries are the segments' rows
// in order, n = the sum of their counts; values [n, d], log_weights [n] and probs [group, n] as
// attention_decode_group. Equal to attention_decode_group on the concatenated keys (the same
// per-entry dot products; only the 4-wide grouping at segment ends may differ in rounding).
void attention_decode_group_segments(const float* q, int group, std::span<const KeySegment> keys,
                                     ValueRows values, const float* log_weights, int d, float* out,
                                     float* probs);

// One query q [d] over the cached entries `indices` of keys/values [*, d] (a recall press's
// selection, DESIGN §4): what attention_decode computes on those rows gathered, without copying
// them. probs [indices.size()] (nullable) in the order of `indices`. Single-threaded.
void attention_decode_gathered(const float* q, const float* keys, const float* values,
                               const float* log_weights, std::span<const int32_t> indices, int d,
                               float* out, float* probs);
// attention_decode_gathered where entry e's key is row e of the concatenated `keys` segments
// (PoD with a selection: its gate threshold skips the distant entries). Values and log-weights
// stay indexed by entry. Same arithmetic as attention_decode_gathered on the concatenation.
void attention_decode_gathered_segments(const float* q, std::span<const KeySegment> keys,
                                        ValueRows values, const float* log_weights,
                                        std::span<const int32_t> indices, int d, float* out,
                                        float* probs);

}  // namespace protokv::kernels
