// SPDX-License-Identifier: Apache-2.0
// The transformer block, written once as steps over N token rows: prefill runs them over a chunk
// of the prompt, decode over one row. The steps differ only in how attention reads the cache
// (prefill.cpp, decode.cpp); everything else is here. The kernels dispatch on N: one row uses
// the SIMD mat-vec path, several prompt rows BLAS GEMMs (kernels::matmul), several sequences'
// decode rows one mat-vec each over weights read once (kernels::matvec_rows, decode_batch).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "model/session_impl.h"

namespace protokv {
namespace {

// Rows of the FFN processed at once: bounds the [rows, hidden_dim] intermediates on long prompts
// while keeping the GEMMs large enough to run at full speed.
constexpr int64_t kFfnChunkRows = 256;
// Below this many elements an elementwise loop is not worth waking the thread pool for.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

void add_bias_rows(float* x, const float* bias, int64_t n, int64_t width) {
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) add_bias(x + i * width, bias, width);
}

// Y[n, rows] = X[n, cols] · W^T: prompt rows through kernels::matmul (F32 activations), or as
// llama.cpp multiplies them when the session computes as it does
// (SessionOptions::llama_cpp_arithmetic, kernels::matmul_as_llama_cpp); rows of different
// sequences (decode_batch) each exactly as a lone decode row.
// `llama_batch`: the rows stand for llama.cpp's multiplication of a batch of two or more rows
// (its prompt ubatch; not the rows of one decode step, nor the one row its last layer keeps).
void project(const WeightMatrix& w, const float* x, int64_t n, float* y, const RowBuffers& b,
             bool llama_batch) {
  if (b.llama_cpp_arithmetic)
    kernels::matmul_as_llama_cpp(w, x, n, y, llama_batch && !b.independent_rows);
  else if (b.independent_rows)
    kernels::matvec_rows(w, x, n, y);
  else
    kernels::matmul(w, x, n, y);
}

void add_rows(float* x, const float* delta, int64_t count) {
#pragma omp parallel for schedule(static) if (count >= kParallelMinElements)
  for (int64_t i = 0; i < count; ++i) x[i] += delta[i];
}

// RoPE at each token's position, token blocks in parallel. x [n, n_heads * head_dim].
void rope_rows_parallel(float* x, int64_t n, int n_heads, const int32_t* positions,
                        const kernels::RopeTable& rope) {
  const int64_t width = static_cast<int64_t>(n_heads) * rope.head_dim;
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t t0 = b * kBlock;
    kernels::rope_rows(x + t0 * width, std::min(kBlock, n - t0), width, n_heads, rope,
                       positions + t0);
  }
}

// ggml's GELU table (ggml-cpu.c, ggml_cpu_init): for every F16 value h, F16(gelu_tanh(h)) with
// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) in float.
const std::vector<float>& gelu_f16_table() {
  static const std::vector<float> table = [] {
    constexpr float kGeluCoefA = 0.044715f;
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    std::vector<float> t(size_t{1} << 16);
    for (size_t bits = 0; bits < t.size(); ++bits) {
      const float x = f16_to_f32(static_cast<uint16_t>(bits));
      const float gelu =
          0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kGeluCoefA * x * x)));
      t[bits] = f16_to_f32(f32_to_f16(gelu));
    }
    return t;
  }();
  return table;
}

}  // namespace

void geglu(float* gate, const float* up, int64_t n) {
  const float* table = gelu_f16_table().data();
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    float gelu;
    if (x <= -10.0f)
      gelu = 0.0f;
    else if (x >= 10.0f)
      gelu = x;
    else
      gelu = table[f32_to_f16(x)];
    gate[i] = gelu * up[i];
  }
}

RowBuffers::RowBuffers(int64_t n, const ModelConfig& config)
    : rows(n), ffn_rows(std::min(n, kFfnChunkRows)) {
  const int64_t q_dim = static_cast<int64_t>(config.n_heads) * config.head_dim();
  const int64_t kv_dim = static_cast<int64_t>(config.n_kv_heads) * config.head_dim();
  x.assign(static_cast<size_t>(n * config.dim), 0.0f);
  xb.assign(static_cast<size_t>(n * config.dim), 0.0f);
  q.assign(static_cast<size_t>(n * q_dim), 0.0f);
  k.assign(static_cast<size_t>(n * kv_dim), 0.0f);
  v.assign(static_cast<size_t>(n * kv_dim), 0.0f);
  att.assign(static_cast<size_t>(n * q_dim), 0.0f);
  gate.assign(static_cast<size_t>(ffn_rows * config.hidden_dim), 0.0f);
  up.assign(static_cast<size_t>(ffn_rows * config.hidden_dim), 0.0f);
}

void Session::Impl::embed(std::span<const int32_t> tokens, RowBuffers& b) const {
  const auto n = static_cast<int64_t>(tokens.size());
  const int dim = config.dim;
  const float scale = config.embedding_scale;
#pragma omp parallel for schedule(static) if (n * dim >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    float* row = b.x.data() + i * dim;
    dequantize_row(weights.token_embd.type, weights.token_embd.row(tokens[static_cast<size_t>(i)]),
                   row, dim);
    if (scale != 1.0f)  // Gemma: embeddings times sqrt(dim)
      for (int c = 0; c < dim; ++c) row[c] *= scale;
  }
}

void Session::Impl::attention_inputs(int layer, int64_t n, const int32_t* positions,
                                     RowBuffers& b) const {
  const LayerWeights& lw = weights.layers[static_cast<size_t>(layer)];
  const int64_t q_dim = static_cast<int64_t>(config.n_heads) * config.head_dim();
  const int64_t kv_dim = static_cast<int64_t>(config.n_kv_heads) * config.head_dim();
  kernels::rmsnorm_rows(b.xb.data(), b.x.data(), lw.attn_norm, n, config.dim, config.norm_eps);
  project(lw.wq, b.xb.data(), n, b.q.data(), b, n > 1);
  project(lw.wk, b.xb.data(), n, b.k.data(), b, n > 1);
  project(lw.wv, b.xb.data(), n, b.v.data(), b, n > 1);
  add_bias_rows(b.q.data(), lw.bq, n, q_dim);
  add_bias_rows(b.k.data(), lw.bk, n, kv_dim);
  add_bias_rows(b.v.data(), lw.bv, n, kv_dim);
  // Qwen3: each head of q and k is RMS-normalised (own weights, the model's epsilon) before RoPE.
  const int64_t hd = config.head_dim();
  if (lw.attn_q_norm != nullptr) {
    kernels::rmsnorm_rows(b.q.data(), b.q.data(), lw.attn_q_norm, n * config.n_heads, hd,
                          config.norm_eps);
  }
  if (lw.attn_k_norm != nullptr) {
    kernels::rmsnorm_rows(b.k.data(), b.k.data(), lw.attn_k_norm, n * config.n_kv_heads, hd,
                          config.norm_eps);
  }
  const kernels::RopeTable& table = rope_of(layer);
  rope_rows_parallel(b.q.data(), n, config.n_heads, positions, table);
  rope_rows_parallel(b.k.data(), n, config.n_kv_heads, positions, table);
  // A query scale other than 1/sqrt(head_dim) (Gemma 3 27B) is folded into the queries, so that
  // the attention kernels, the presses and the observers all see the queries the model attends
  // with.
  if (config.attention_scale > 0.0f) {
    const float fold = config.attention_scale * std::sqrt(static_cast<float>(hd));
    float* q = b.q.data();
    const int64_t count = n * q_dim;
#pragma omp parallel for schedule(static) if (count >= kParallelMinElements)
    for (int64_t i = 0; i < count; ++i) q[i] *= fold;
  }
}

bool Session::Impl::attends_as_llama_cpp(int layer, bool want_probs) const {
  return llama_cpp_attention && !want_probs && !config.is_local_layer(layer);
}

void Session::Impl::attention_output_and_ffn(const LayerWeights& lw, int64_t n, RowBuffers& b,
                                             int64_t ffn_first) const {
  const int dim = config.dim;
  const int64_t hidden = config.hidden_dim;
  project(lw.wo, b.att.data(), n, b.xb.data(), b, n > 1);
  if (lw.attn_post_norm != nullptr)  // Gemma 3: the attention output is normalised first
    kernels::rmsnorm_rows(b.xb.data(), b.xb.data(), lw.attn_post_norm, n, dim, config.norm_eps);
  add_rows(b.x.data(), b.xb.data(), n * dim);

  // Feed-forward block, ffn_rows rows at a time (rows are independent).
  for (int64_t r0 = ffn_first; r0 < n; r0 += b.ffn_rows) {
    const int64_t rows = std::min(b.ffn_rows, n - r0);
    float* x_chunk = b.x.data() + r0 * dim;
    float* xb_chunk = b.xb.data() + r0 * dim;
    kernels::rmsnorm_rows(xb_chunk, x_chunk, lw.ffn_norm, rows, dim, config.norm_eps);
    // llama.cpp multiplies the FFN's rows [ffn_first, n) as one batch, however they are chunked.
    const bool ffn_batch = n - ffn_first > 1;
    project(lw.w_gate, xb_chunk, rows, b.gate.data(), b, ffn_batch);
    project(lw.w_up, xb_chunk, rows, b.up.data(), b, ffn_batch);
    const bool gelu = config.ffn_activation == FfnActivation::kGeluTanh;
    const bool silu_as_ggml = options.llama_cpp_arithmetic;  // ggml's vector exp
#pragma omp parallel for schedule(static) if (rows * hidden >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      float* gate = b.gate.data() + r * hidden;
      const float* up = b.up.data() + r * hidden;
      if (gelu)
        geglu(gate, up, hidden);
      else if (silu_as_ggml)
        kernels::swiglu_as_llama_cpp(gate, up, hidden);
      else
        swiglu(gate, up, hidden);
    }
    project(lw.w_down, b.gate.data(), rows, xb_chunk, b, ffn_batch);
    if (lw.ffn_post_norm != nullptr)  // Gemma 3: the FFN output is normalised first
      kernels::rmsnorm_rows(xb_chunk, xb_chunk, lw.ffn_post_norm, rows, dim, config.norm_eps);
    add_rows(x_chunk, xb_chunk, rows * dim);
  }
}

void Session::Impl::output_logits(const float* x_row, float* scratch) {
  kernels::rmsnorm(scratch, x_row, weights.output_norm, config.dim, config.norm_eps);
  if (options.llama_cpp_arithmetic)
    kernels::matmul_as_llama_cpp(weights.output, scratch, 1, logits.data(), false);
  else
    kernels::matvec(weights.output, scratch, logits.data());
  softcap_logits();
}

void Session::Impl::output_logits_rows(int64_t n, RowBuffers& b, int64_t first_index,
                                       const Session::RowLogits& on_logits) {
  // Blocks of rows bound the [rows, vocab] scratch (a 262K-token vocabulary is 1 MiB a row);
  // each block is one pass over the output weights (project: as the chunk's other rows).
  constexpr int64_t kBlockRows = 32;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  kernels::rmsnorm_rows(b.xb.data(), b.x.data(), weights.output_norm, n, config.dim,
                        config.norm_eps);
  std::vector<float> block(static_cast<size_t>(std::min(n, kBlockRows) * vocab));
  for (int64_t r0 = 0; r0 < n; r0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, n - r0);
    project(weights.output, b.xb.data() + r0 * config.dim, rows, block.data(), b, n > 1);
    for (int64_t i = 0; i < rows; ++i) {
      const std::span<float> row(block.data() + i * vocab, static_cast<size_t>(vocab));
      std::copy(row.begin(), row.end(), logits.begin());
      softcap_logits();
      on_logits(first_index + r0 + i, logits);
    }
  }
}

void Session::Impl::softcap_logits() {
  if (const float cap = config.final_logit_softcap; cap > 0.0f)  // Gemma 2/3 soft-capping
    for (float& logit : logits) logit = cap * std::tanh(logit / cap);
}

}  // namespace protokv
