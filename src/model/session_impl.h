// SPDX-License-Identifier: Apache-2.0
#pragma once
// Internal state of protokv::Session, shared by session.cpp (lifecycle), forward.cpp (the
// transformer block), prefill.cpp and decode.cpp. Not part of the public API.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kernels.h"
#include "protokv/engine.h"

namespace protokv {

// Activations of `rows` token rows through one transformer block (forward.cpp). Decode uses a
// one-row set owned by the Session, so a decode step allocates nothing but cache growth; a
// prefill allocates one for its chunk.
struct RowBuffers {
  RowBuffers() = default;
  RowBuffers(int64_t rows, const ModelConfig& config);
  int64_t rows = 0;
  std::vector<float> x;     // [rows, dim] residual stream
  std::vector<float> xb;    // [rows, dim] normalised input of a sub-block, then its projection
  std::vector<float> q;     // [rows, n_heads * head_dim] post-RoPE queries
  std::vector<float> k;     // [rows, n_kv_heads * head_dim] post-RoPE keys
  std::vector<float> v;     // [rows, n_kv_heads * head_dim]
  std::vector<float> att;   // [rows, n_heads * head_dim] attention output before wo
  std::vector<float> gate;  // [ffn_rows, hidden_dim]
  std::vector<float> up;    // [ffn_rows, hidden_dim]
  int64_t ffn_rows = 0;     // FFN rows processed at once (bounds gate/up on long prompts)
  // Rows of different sequences (decode_batch): each is multiplied exactly as decode's one row is
  // (kernels::matvec_rows, weights read once for all), not as prompt rows (GEMM).
  bool independent_rows = false;
  // Rows multiplied as llama.cpp multiplies them (SessionOptions::llama_cpp_arithmetic).
  bool llama_cpp_arithmetic = false;
};

// How a chunk of rows (Session::Impl::forward_chunk, prefill.cpp) treats the cache and the press.
enum class ChunkKind {
  kPrompt,       // part of prefill(): compression (if any) is deferred to the end of the prompt
  kPromptWhole,  // the whole prompt in one chunk with a compressing press: K/V go to the press
  kAppend,       // append() after a prefill: no compression, the press's decode hook sees rows
};

// What a PrefilledPrompt holds (engine.h).
struct PrefilledPrompt::Data {
  const ModelWeights* weights = nullptr;  // identity check: a prompt serves its own weights only
  int64_t n_tokens = 0;
  SessionOptions options;  // ubatch, cache type and arithmetic (PrefilledPrompt::options)
  KvCache cache;           // every row of every layer, uncompressed (sliding-window layers too)
  std::vector<std::vector<float>> queries;  // [n_layers][n_heads, n_tokens, head_dim] post-RoPE
  std::vector<float> logits;                // [vocab] of the last token
  size_t peak_kv_bytes = 0;
  double prefill_ms = 0.0;
};

struct Session::Impl {
  Impl(const ModelWeights& w, SessionOptions opts);

  std::span<const float> prefill(std::span<const int32_t> tokens);
  // prefill(tokens) one chunk at a time (Session::begin_prefill / prefill_chunk).
  void begin_prefill(std::span<const int32_t> tokens);
  bool prefill_chunk();
  std::span<const float> prefill(const PrefilledPrompt& prompt);
  // Runs `tokens` through every layer without a press, keeping every row and every layer's
  // queries in `out` (PrefilledPrompt::make); leaves the session reset.
  void capture_prompt(std::span<const int32_t> tokens, PrefilledPrompt::Data& out);
  // Throws Error for an empty or too long prompt, a bad token or ubatch.
  void check_prompt(std::span<const int32_t> tokens) const;
  // Makes and begins this sequence's press for a prompt of n tokens (none without a press or
  // without layers for it); returns the entries the budget keeps per head.
  int64_t begin_press(int64_t n);
  std::span<const float> append(std::span<const int32_t> tokens,
                                const Session::RowLogits& on_logits = nullptr);
  // Throws Error, leaving the session as it is, when `tokens` cannot be appended.
  void check_append(std::span<const int32_t> tokens) const;
  std::span<const float> decode(int32_t token);
  // decode() in three parts, so that decode_batch can run the block once over several sessions'
  // rows: begin_decode checks the token and the context (throwing before anything changes) and
  // prepares the step; decode_attention appends a layer's K/V row, attends and runs the press's
  // hook; end_decode counts the step.
  struct DecodeState {
    int32_t position = 0;
    bool want_probs = false;
    bool keep_queries = false;
    size_t attended_bytes = 0;
  };
  DecodeState begin_decode(int32_t token);
  void decode_attention(int layer, DecodeState& state, const float* q, const float* k,
                        const float* v, float* att);
  void end_decode(DecodeState& state);
  void reset();

  // Throws Error for a token id outside the vocabulary.
  void check_token(int32_t token) const;
  // Entries to reserve beyond what a head holds after prefill, so that the first decode steps
  // append without reallocating.
  int64_t decode_headroom(int64_t n_past_after_prefill) const;
  // Grows the per-head probability scratch to hold `n` entries per head.
  void ensure_probs_capacity(int64_t n);

  // The transformer block as steps over the rows of `b` (forward.cpp). Each dispatches on the
  // row count inside the kernels: one row takes the SIMD mat-vec path, many rows BLAS GEMMs.
  // x = embeddings of `tokens`.
  void embed(std::span<const int32_t> tokens, RowBuffers& b) const;
  // q/k/v = projections of rmsnorm(x) (+ biases), RoPE'd at `positions`.
  void attention_inputs(int layer, int64_t n, const int32_t* positions, RowBuffers& b) const;
  // Whether layer `layer`'s attention takes llama.cpp's arithmetic
  // (SessionOptions::llama_cpp_arithmetic, kernels/llama_cpp_order.h): llama_cpp_attention, a
  // global layer, no observer of the probabilities. The callers also need plain rows (one
  // segment of the head's own keys, no log-weights, no selection); otherwise protokv's own
  // kernels attend.
  bool attends_as_llama_cpp(int layer, bool want_probs) const;
  // Prefill's attention in llama.cpp's arithmetic (prefill.cpp).
  template <class KvHead>
  void attend_rows_as_llama_cpp(int64_t n, RowBuffers& b, KvHead kv_head) const;
  // The rows of each forward chunk: options.ubatch, or with llama_cpp_arithmetic llama.cpp's
  // default n_ubatch (512) when it is 0, so that a chunk of one row falls where llama.cpp's does.
  int64_t chunk_rows(int64_t n) const;
  // x += wo · att, then x += FFN(rmsnorm(x)) for rows ffn_first.. (the others' x stays x + wo ·
  // att: rows whose outputs nobody reads).
  void attention_output_and_ffn(const LayerWeights& lw, int64_t n, RowBuffers& b,
                                int64_t ffn_first = 0) const;
  // logits = output · rmsnorm(x_row); `scratch` [dim] may alias x_row.
  void output_logits(const float* x_row, float* scratch);
  // The logits of all n rows of b.x, handed to `on_logits` as (first_index + i, logits of row i),
  // the output head run as GEMMs over blocks of rows; this->logits ends as the last row's.
  void output_logits_rows(int64_t n, RowBuffers& b, int64_t first_index,
                          const Session::RowLogits& on_logits);
  // Final-logit soft-capping (Gemma 2/3), in place on this->logits.
  void softcap_logits();

  // Runs `tokens` at positions n_past.. through every layer (prefill.cpp). `queries`, when not
  // null, collects each layer's post-RoPE queries [n_layers][n_heads, n_total, head_dim] for a
  // deferred compression.
  // `on_logits`, when set, receives every row's logits (output_logits_rows; row indices from
  // `first_index`) instead of the last row's alone.
  void forward_chunk(std::span<const int32_t> tokens, ChunkKind kind, RowBuffers& b,
                     std::vector<std::vector<float>>* queries, int64_t n_total,
                     const Session::RowLogits* on_logits = nullptr, int64_t first_index = 0);
  // Drops the entries of sliding-window layer `layer` that no query from next_position on sees.
  void forget_out_of_window(int layer, int64_t next_position);
  // Throws Error when a head of `layer` borrows keys across a sliding-window layer (PoD with
  // compress_local_layers): the lender would forget them.
  void check_key_lenders(int layer) const;
  // The model layer a head borrows its keys from (PoD): the press names its own layer index.
  int lender_layer(const HeadCache& head) const {
    return press_layers[static_cast<size_t>(head.key_lender())];
  }
  // Compresses every layer of a fully prefilled, uncompressed cache with the press, using the
  // queries collected by forward_chunk.
  void compress_cached_prompt(const std::vector<std::vector<float>>& queries, int64_t n);

  const ModelWeights& weights;
  const ModelConfig& config;
  SessionOptions options;
  // llama_cpp_arithmetic's attention applies to this model and cache at all: an architecture
  // whose llama.cpp graph it follows (Architecture::llama_cpp_order), the default attention
  // scale, an F32 cache (F32 or F16 keys and values with llama_cpp_flash_attention).
  bool llama_cpp_attention = false;
  // How llama.cpp's flash attention reads a decode step's head (llama_cpp_flash_attention): K and
  // V as F16 whatever the cache holds (llama-graph.cpp build_attn_mha casts an F32 cache's views
  // to F16), one row in its ubatch, over llama_cpp_threads.
  kernels::LlamaCppFlashAttention flash_decode{
      .batch_rows = 1, .f16_keys = true, .f16_values = true, .threads = 1};
  kernels::RopeTable rope;        // built once, for every step of every sequence of this Session
  kernels::RopeTable rope_local;  // the local (sliding-window) layers' table (Gemma 3)
  // Layer l's table: local (sliding-window) layers have their own RoPE base (Gemma 3).
  const kernels::RopeTable& rope_of(int layer) const {
    return config.is_local_layer(layer) ? rope_local : rope;
  }
  // The same table as a press sees it (LayerView::rope).
  RopeView rope_view(int layer) const {
    const kernels::RopeTable& table = rope_of(layer);
    return {table.inv_freq, table.rot_dims, table.neox};
  }
  KvCache cache;
  // The layers the press compresses, which it numbers 0 .. press_layers.size() - 1: every layer,
  // or only the global ones of a model with sliding-window layers (whose caches are already
  // bounded by their window) unless options.compress_local_layers. press_index is the inverse
  // (-1: a layer the press never sees).
  std::vector<int> press_layers;
  std::vector<int> press_index;   // [n_layers]
  bool capturing_prompt = false;  // capture_prompt(): no row leaves any cache
  int64_t n_past = 0;
  // The current sequence's press state, made from options.press and begun at prefill; null
  // without a press and until prefill.
  std::unique_ptr<Press> press;
  PrefillStats stats;
  // A prefill between begin_prefill and its last prefill_chunk.
  struct PendingPrefill {
    std::vector<int32_t> tokens;
    int64_t next = 0;   // first row not yet run
    int64_t chunk = 0;  // rows per prefill_chunk
    bool compress = false;
    std::vector<std::vector<float>> queries;  // for the deferred compression of a chunked prompt
    RowBuffers rows;
    double ms = 0.0;  // time inside begin_prefill and prefill_chunk so far
  };
  std::unique_ptr<PendingPrefill> pending;
  DecodeObserver* observer = nullptr;
  std::vector<float> logits;  // [vocab]
  RowBuffers step;            // one row: decode
  // Softmax weights for observers: KV head h owns slots [h * group, (h + 1) * group) of
  // probs_stride floats each, filled as [group, entries] rows by the group attention kernel.
  std::vector<float> probs;  // [n_heads * probs_stride]
  int64_t probs_stride = 0;
  // Entries each query head attends when a recall press selects (decode scratch, reused).
  std::vector<std::vector<int32_t>> selections;  // [n_heads]
  // This decode step's post-RoPE queries of every layer: PoD's scores=lower reads the block's
  // lowest layer's query at the layers above it. Filled only while some head uses it.
  std::vector<float> step_queries;  // [n_layers, n_heads * head_dim]
};

// x[i] += bias[i] when a bias is present (Qwen2 q/k/v biases).
inline void add_bias(float* x, const float* bias, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < n; ++i) x[i] += bias[i];
}

// SwiGLU: gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g).
inline void swiglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// GeGLU (Gemma): gate[i] = gelu(gate[i]) * up[i] with the tanh approximation of GELU, computed as
// ggml's CPU backend computes it (GGML_GELU_FP16): the input rounded to F16, looked up in a table
// of F16-rounded values, saturating to 0 / x beyond |x| >= 10 (forward.cpp).
void geglu(float* gate, const float* up, int64_t n);

}  // namespace protokv
