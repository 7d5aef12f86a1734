// Prefill (DESIGN §3): the whole prompt, layer by layer. After each layer's attention the press
// compresses that layer's K/V straight into the cache, so peak KV memory is one layer's full K/V
// plus the compressed layers before it.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/kernels.h"
#include "model/session_impl.h"
#include "protokv/error.h"
#include "protokv/timer.h"

namespace protokv {
namespace {

// Rows of the FFN processed at once: bounds the [rows, hidden_dim] intermediates on long prompts
// while keeping the GEMMs large enough to run at full speed.
constexpr int64_t kFfnChunkRows = 256;
// Below this many elements an elementwise loop is not worth waking the thread pool for.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// src [n, n_heads * head_dim] (token-major, as the projections produce it) ->
// dst [n_heads, n, head_dim] (head-major, as LayerView and the attention kernel want it).
void rows_to_heads(const float* src, int64_t n, int n_heads, int head_dim, float* dst) {
  const int64_t width = static_cast<int64_t>(n_heads) * head_dim;
  const size_t row_bytes = static_cast<size_t>(head_dim) * sizeof(float);
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < n_heads; ++h)
      std::memcpy(dst + (static_cast<int64_t>(h) * n + i) * head_dim,
                  src + i * width + static_cast<int64_t>(h) * head_dim, row_bytes);
}

// RoPE at each token's position, token blocks in parallel. x [n, n_heads * head_dim].
void rope_rows_parallel(float* x, int64_t n, int n_heads, int head_dim, const int32_t* positions,
                        const ModelConfig& config) {
  const int64_t width = static_cast<int64_t>(n_heads) * head_dim;
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t t0 = b * kBlock;
    kernels::rope_rows(x + t0 * width, std::min(kBlock, n - t0), width, n_heads, head_dim,
                       positions + t0, config.rope_theta, config.rope_neox);
  }
}

void add_bias_rows(float* x, const float* bias, int64_t n, int64_t width) {
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) add_bias(x + i * width, bias, width);
}

void add_rows(float* x, const float* delta, int64_t count) {
#pragma omp parallel for schedule(static) if (count >= kParallelMinElements)
  for (int64_t i = 0; i < count; ++i) x[i] += delta[i];
}

}  // namespace

std::span<const float> Session::Impl::prefill(std::span<const int32_t> tokens) {
  const Timer total_timer;
  const auto n = static_cast<int64_t>(tokens.size());
  PROTOKV_CHECK(n > 0, "empty prompt: prefill needs at least one token");
  PROTOKV_CHECK(n <= config.context_length,
                "prompt of {} tokens is longer than the model's context ({} tokens)", n,
                config.context_length);
  for (int32_t t : tokens) check_token(t);
  reset();

  const int dim = config.dim;
  const int hd = config.head_dim();
  const int n_heads = config.n_heads;
  const int n_kv = config.n_kv_heads;
  const int64_t q_dim = static_cast<int64_t>(n_heads) * hd;
  const int64_t kv_dim = static_cast<int64_t>(n_kv) * hd;
  const int64_t hidden = config.hidden_dim;
  const int64_t headroom = decode_headroom(n);

  Press* press = options.press;
  int64_t budget_entries = n;
  if (press != nullptr) {
    options.budget.validate();
    budget_entries = options.budget.resolve(n);
    SequenceInfo info;
    info.n_layers = config.n_layers;
    info.n_heads = n_heads;
    info.n_kv_heads = n_kv;
    info.head_dim = hd;
    info.n_tokens = n;
    press->begin(info, options.budget);
    press_begun = true;
  }
  // A budget that covers the prompt keeps everything: the cache is filled exactly as without a
  // press, so the output is bit-identical to no compression.
  const bool compress = press != nullptr && budget_entries < n;

  std::vector<int32_t> positions(static_cast<size_t>(n));  // [n] true token positions
  std::iota(positions.begin(), positions.end(), 0);

  std::vector<float> x(static_cast<size_t>(n * dim));           // [n, dim] residual stream
  std::vector<float> xb(static_cast<size_t>(n * dim));          // [n, dim] normalised / projected
  std::vector<float> q_rows(static_cast<size_t>(n * q_dim));    // [n, n_heads * hd]
  std::vector<float> k_rows(static_cast<size_t>(n * kv_dim));   // [n, n_kv_heads * hd]
  std::vector<float> v_rows(static_cast<size_t>(n * kv_dim));   // [n, n_kv_heads * hd]
  std::vector<float> k_heads(static_cast<size_t>(n * kv_dim));  // [n_kv_heads, n, hd]
  std::vector<float> v_heads(static_cast<size_t>(n * kv_dim));  // [n_kv_heads, n, hd]
  std::vector<float> att_rows(static_cast<size_t>(n * q_dim));  // [n, n_heads * hd]
  // [n_heads, n, hd]: the press's view of the queries, only needed when compressing.
  std::vector<float> q_heads(compress ? static_cast<size_t>(n * q_dim) : 0);
  const int64_t chunk = std::min(n, kFfnChunkRows);
  std::vector<float> gate(static_cast<size_t>(chunk * hidden));  // [chunk, hidden]
  std::vector<float> up(static_cast<size_t>(chunk * hidden));    // [chunk, hidden]

#pragma omp parallel for schedule(static) if (n * dim >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) {
    dequantize_row(weights.token_embd.type, weights.token_embd.row(tokens[static_cast<size_t>(i)]),
                   x.data() + i * dim, dim);
  }

  const size_t full_layer_kv_bytes = static_cast<size_t>(2 * n * kv_dim) * sizeof(float);
  size_t done_kv_bytes = 0;  // cache bytes of the layers already compressed
  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& lw = weights.layers[static_cast<size_t>(l)];

    // Attention block.
    kernels::rmsnorm_rows(xb.data(), x.data(), lw.attn_norm, n, dim, config.norm_eps);
    kernels::matmul(lw.wq, xb.data(), n, q_rows.data());
    kernels::matmul(lw.wk, xb.data(), n, k_rows.data());
    kernels::matmul(lw.wv, xb.data(), n, v_rows.data());
    add_bias_rows(q_rows.data(), lw.bq, n, q_dim);
    add_bias_rows(k_rows.data(), lw.bk, n, kv_dim);
    add_bias_rows(v_rows.data(), lw.bv, n, kv_dim);
    rope_rows_parallel(q_rows.data(), n, n_heads, hd, positions.data(), config);
    rope_rows_parallel(k_rows.data(), n, n_kv, hd, positions.data(), config);
    rows_to_heads(k_rows.data(), n, n_kv, hd, k_heads.data());
    rows_to_heads(v_rows.data(), n, n_kv, hd, v_heads.data());
    if (compress) rows_to_heads(q_rows.data(), n, n_heads, hd, q_heads.data());

    // Causal attention of every query head (GQA: head h reads KV head h / group), written
    // straight into token-major rows for the output projection.
    kernels::attention_prefill_heads({q_rows.data(), q_dim, hd}, {k_heads.data(), hd, n * hd},
                                     {v_heads.data(), hd, n * hd}, {att_rows.data(), q_dim, hd}, n,
                                     /*n_past=*/0, n_heads, n_kv, hd);

    // The layer's K/V go to the cache (compressed or whole) while the full tensors are at hand.
    stats.peak_kv_bytes = std::max(stats.peak_kv_bytes, done_kv_bytes + full_layer_kv_bytes);
    LayerCache& layer_cache = cache.layer(l);
    if (compress) {
      LayerView view;
      view.layer = l;
      view.n_layers = config.n_layers;
      view.n_tokens = n;
      view.head_dim = hd;
      view.n_heads = n_heads;
      view.n_kv_heads = n_kv;
      view.q = q_heads.data();
      view.k = k_heads.data();
      view.v = v_heads.data();
      view.positions = positions.data();
      const Timer compress_timer;
      press->compress_prefill(view, layer_cache);
      stats.compress_ms += compress_timer.ms();
      for (HeadCache& head : layer_cache.heads) head.reserve(head.size() + headroom);
    } else {
#pragma omp parallel for schedule(static) if (n * kv_dim >= kParallelMinElements)
      for (int h = 0; h < n_kv; ++h) {
        HeadCache& head = layer_cache.heads[static_cast<size_t>(h)];
        head.reserve(n + headroom);
        const float* keys = k_heads.data() + static_cast<int64_t>(h) * n * hd;
        const float* values = v_heads.data() + static_cast<int64_t>(h) * n * hd;
        for (int64_t i = 0; i < n; ++i)
          head.append(keys + i * hd, values + i * hd, positions[static_cast<size_t>(i)]);
      }
    }
    done_kv_bytes += layer_cache.kv_bytes();

    kernels::matmul(lw.wo, att_rows.data(), n, xb.data());
    add_rows(x.data(), xb.data(), n * dim);

    // Feed-forward block, `chunk` rows at a time (rows are independent).
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t rows = std::min(chunk, n - r0);
      float* x_chunk = x.data() + r0 * dim;
      float* xb_chunk = xb.data() + r0 * dim;
      kernels::rmsnorm_rows(xb_chunk, x_chunk, lw.ffn_norm, rows, dim, config.norm_eps);
      kernels::matmul(lw.w_gate, xb_chunk, rows, gate.data());
      kernels::matmul(lw.w_up, xb_chunk, rows, up.data());
#pragma omp parallel for schedule(static) if (rows * hidden >= kParallelMinElements)
      for (int64_t r = 0; r < rows; ++r)
        swiglu(gate.data() + r * hidden, up.data() + r * hidden, hidden);
      kernels::matmul(lw.w_down, gate.data(), rows, xb_chunk);
      add_rows(x_chunk, xb_chunk, rows * dim);
    }
  }

  // Logits of the last token only.
  float* last = x.data() + (n - 1) * dim;
  kernels::rmsnorm(last, last, weights.output_norm, dim, config.norm_eps);
  kernels::matvec(weights.output, last, logits.data());

  n_past = n;
  stats.n_tokens = n;
  stats.kv_bytes = cache.kv_bytes();
  stats.prefill_ms = total_timer.ms();
  return logits;
}

}  // namespace protokv
