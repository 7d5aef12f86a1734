// The transformer block, written once as steps over N token rows: prefill runs them over a chunk
// of the prompt, decode over one row. The steps differ only in how attention reads the cache
// (prefill.cpp, decode.cpp); everything else is here. The kernels dispatch on N: one row uses
// the SIMD mat-vec path, several rows BLAS GEMMs (kernels::matmul).
#include <algorithm>
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

}  // namespace

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
#pragma omp parallel for schedule(static) if (n * dim >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    dequantize_row(weights.token_embd.type, weights.token_embd.row(tokens[static_cast<size_t>(i)]),
                   b.x.data() + i * dim, dim);
  }
}

void Session::Impl::attention_inputs(const LayerWeights& lw, int64_t n, const int32_t* positions,
                                     RowBuffers& b) const {
  const int64_t q_dim = static_cast<int64_t>(config.n_heads) * config.head_dim();
  const int64_t kv_dim = static_cast<int64_t>(config.n_kv_heads) * config.head_dim();
  kernels::rmsnorm_rows(b.xb.data(), b.x.data(), lw.attn_norm, n, config.dim, config.norm_eps);
  kernels::matmul(lw.wq, b.xb.data(), n, b.q.data());
  kernels::matmul(lw.wk, b.xb.data(), n, b.k.data());
  kernels::matmul(lw.wv, b.xb.data(), n, b.v.data());
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
  rope_rows_parallel(b.q.data(), n, config.n_heads, positions, rope);
  rope_rows_parallel(b.k.data(), n, config.n_kv_heads, positions, rope);
}

void Session::Impl::attention_output_and_ffn(const LayerWeights& lw, int64_t n,
                                             RowBuffers& b) const {
  const int dim = config.dim;
  const int64_t hidden = config.hidden_dim;
  kernels::matmul(lw.wo, b.att.data(), n, b.xb.data());
  add_rows(b.x.data(), b.xb.data(), n * dim);

  // Feed-forward block, ffn_rows rows at a time (rows are independent).
  for (int64_t r0 = 0; r0 < n; r0 += b.ffn_rows) {
    const int64_t rows = std::min(b.ffn_rows, n - r0);
    float* x_chunk = b.x.data() + r0 * dim;
    float* xb_chunk = b.xb.data() + r0 * dim;
    kernels::rmsnorm_rows(xb_chunk, x_chunk, lw.ffn_norm, rows, dim, config.norm_eps);
    kernels::matmul(lw.w_gate, xb_chunk, rows, b.gate.data());
    kernels::matmul(lw.w_up, xb_chunk, rows, b.up.data());
#pragma omp parallel for schedule(static) if (rows * hidden >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r)
      swiglu(b.gate.data() + r * hidden, b.up.data() + r * hidden, hidden);
    kernels::matmul(lw.w_down, b.gate.data(), rows, xb_chunk);
    add_rows(x_chunk, xb_chunk, rows * dim);
  }
}

void Session::Impl::output_logits(const float* x_row, float* scratch) {
  kernels::rmsnorm(scratch, x_row, weights.output_norm, config.dim, config.norm_eps);
  kernels::matvec(weights.output, scratch, logits.data());
}

}  // namespace protokv
