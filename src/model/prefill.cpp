// Prefill (docs/DESIGN.md §3.3): the prompt, layer by layer, in chunks of `ubatch` rows appended at
// n_past; append() feeds a follow-up turn the same way without resetting the cache.
//
// With a compressing press and the whole prompt in one chunk, each layer's K/V go to the press
// right after that layer's attention and the press writes the cache, so peak KV memory is one
// layer's full K/V plus the compressed layers before it. With several chunks, each chunk's K/V
// are appended to the cache in full (later chunks attend to them) and the press runs once the
// final chunk is in, layer by layer, over the same post-RoPE Q/K/V it would have seen in one
// chunk (equal to float rounding); the peak is then the whole uncompressed cache plus every
// layer's queries.
#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/kernels.h"
#include "model/session_impl.h"
#include "protokv/error.h"
#include "protokv/timer.h"

namespace protokv {
namespace {

// Below this many elements a copy loop is not worth waking the thread pool for.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// src [n, n_heads * head_dim] (token-major, as the projections produce it) ->
// dst rows [row0, row0 + n) of [n_heads, n_total, head_dim] (head-major, as LayerView and the
// attention kernel want it).
void rows_to_heads(const float* src, int64_t n, int n_heads, int head_dim, float* dst,
                   int64_t row0 = 0, int64_t n_total = -1) {
  if (n_total < 0) n_total = n;
  const int64_t width = static_cast<int64_t>(n_heads) * head_dim;
  const size_t row_bytes = static_cast<size_t>(head_dim) * sizeof(float);
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < n_heads; ++h)
      std::memcpy(dst + (static_cast<int64_t>(h) * n_total + row0 + i) * head_dim,
                  src + i * width + static_cast<int64_t>(h) * head_dim, row_bytes);
}

}  // namespace

void Session::Impl::forward_chunk(std::span<const int32_t> tokens, ChunkKind kind, RowBuffers& b,
                                  std::vector<std::vector<float>>* queries, int64_t n_total) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int hd = config.head_dim();
  const int n_heads = config.n_heads;
  const int n_kv = config.n_kv_heads;
  const int64_t q_dim = static_cast<int64_t>(n_heads) * hd;
  const int64_t kv_dim = static_cast<int64_t>(n_kv) * hd;
  const int64_t row0 = n_past;  // position of the chunk's first token
  Press* press = this->press.get();

  std::vector<int32_t> positions(static_cast<size_t>(n));  // [n] true token positions
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(row0));

  // Head-major copies for the press of a whole-prompt chunk.
  const bool to_press = kind == ChunkKind::kPromptWhole;
  std::vector<float> k_heads(to_press ? static_cast<size_t>(n * kv_dim) : 0);  // [n_kv, n, hd]
  std::vector<float> v_heads(to_press ? static_cast<size_t>(n * kv_dim) : 0);  // [n_kv, n, hd]
  std::vector<float> q_heads(to_press ? static_cast<size_t>(n * q_dim) : 0);   // [n_heads, n, hd]
  std::vector<kernels::KvHeadRows> kv_rows(static_cast<size_t>(n_kv));
  // Keys of heads that share keys (PoD), gathered for the chunk's attention (append only).
  std::vector<std::vector<float>> gathered_keys(static_cast<size_t>(n_kv));

  embed(tokens, b);
  const size_t chunk_layer_kv_bytes = static_cast<size_t>(2 * n * kv_dim) * sizeof(float);
  size_t kv_bytes_now = cache.kv_bytes();  // all layers: this chunk's done ones + earlier chunks
  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& lw = weights.layers[static_cast<size_t>(l)];
    LayerCache& layer_cache = cache.layer(l);
    attention_inputs(lw, n, positions.data(), b);

    if (to_press) {
      // Causal attention over the chunk's own K/V, then the press writes this layer's cache
      // while the full tensors are at hand.
      rows_to_heads(b.k.data(), n, n_kv, hd, k_heads.data());
      rows_to_heads(b.v.data(), n, n_kv, hd, v_heads.data());
      rows_to_heads(b.q.data(), n, n_heads, hd, q_heads.data());
      kernels::attention_prefill_heads({b.q.data(), q_dim, hd}, {k_heads.data(), hd, n * hd},
                                       {v_heads.data(), hd, n * hd}, {b.att.data(), q_dim, hd}, n,
                                       /*n_past=*/0, n_heads, n_kv, hd);
      stats.peak_kv_bytes = std::max(stats.peak_kv_bytes, kv_bytes_now + chunk_layer_kv_bytes);
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
      const int64_t headroom = decode_headroom(n);
      for (HeadCache& head : layer_cache.heads) head.reserve(head.size() + headroom);
      kv_bytes_now += layer_cache.kv_bytes();
    } else {
      // The chunk's K/V join the cache first; then each query row attends to its head's cached
      // entries (possibly compressed, with log-weights) and the chunk rows up to its own.
      // Room for the rest of this prompt (or appended turn) and the first decode steps.
      const int64_t reserve_rows = (n_total - row0) + decode_headroom(n_total);
#pragma omp parallel for schedule(static) if (n * kv_dim >= kParallelMinElements)
      for (int h = 0; h < n_kv; ++h) {
        HeadCache& head = layer_cache.heads[static_cast<size_t>(h)];
        const int64_t head_past = head.size();
        head.reserve(head_past + reserve_rows);
        for (int64_t i = 0; i < n; ++i)
          head.append(b.k.data() + i * kv_dim + static_cast<int64_t>(h) * hd,
                      b.v.data() + i * kv_dim + static_cast<int64_t>(h) * hd,
                      positions[static_cast<size_t>(i)]);
        const float* keys = head.keys();
        if (head.shares_keys()) {
          // PoD: the chunk's rows read the distant entries' keys from the block's lowest layer
          // (already run for this chunk), gathered once per chunk; the entries that leave the
          // recent window during the chunk keep their own keys until the press drops them after
          // it (on_decode below), so the chunk sees slightly more own keys than decode would.
          // The chunk kernel has one query per row: with scores=lower the borrowed keys meet
          // the row's own query here, not the lender layer's.
          std::array<KeySegment, 3> segments;
          const int count = head.key_segments(
              cache.layer(head.key_lender()).heads[static_cast<size_t>(h)], segments);
          std::vector<float>& gathered = gathered_keys[static_cast<size_t>(h)];
          gathered.clear();
          for (int i = 0; i < count; ++i)
            gathered.insert(gathered.end(), segments[static_cast<size_t>(i)].keys,
                            segments[static_cast<size_t>(i)].keys +
                                segments[static_cast<size_t>(i)].count * hd);
          keys = gathered.data();
        }
        kv_rows[static_cast<size_t>(h)] = {
            keys, head.values(), hd, head.has_log_weights() ? head.log_weights().data() : nullptr,
            head_past};
      }
      kv_bytes_now += chunk_layer_kv_bytes;
      if (kind != ChunkKind::kAppend)  // the stats describe the prompt's prefill
        stats.peak_kv_bytes = std::max(stats.peak_kv_bytes, kv_bytes_now);
      kernels::attention_prefill_cached({b.q.data(), q_dim, hd}, kv_rows, {b.att.data(), q_dim, hd},
                                        n, n_heads, hd);
      if (queries != nullptr) {
        auto& layer_queries = (*queries)[static_cast<size_t>(l)];
        if (layer_queries.empty()) layer_queries.assign(static_cast<size_t>(n_total * q_dim), 0.0f);
        rows_to_heads(b.q.data(), n, n_heads, hd, layer_queries.data(), row0, n_total);
      }
      // After compression, appended rows reach the press like decoded tokens do.
      if (kind == ChunkKind::kAppend && press != nullptr) {
        DecodeStep step{.layer = l, .n_heads = n_heads, .head_dim = hd, .cache = &layer_cache};
        for (int64_t i = 0; i < n; ++i) {
          step.position = positions[static_cast<size_t>(i)];
          step.q = b.q.data() + i * q_dim;
          press->on_decode(step);
        }
      }
    }

    attention_output_and_ffn(lw, n, b);
  }

  // Logits of the last token only.
  float* last = b.x.data() + (n - 1) * config.dim;
  output_logits(last, last);
  n_past += n;
}

void Session::Impl::compress_cached_prompt(const std::vector<std::vector<float>>& queries,
                                           int64_t n) {
  const int hd = config.head_dim();
  const int n_kv = config.n_kv_heads;
  const int64_t kv_dim = static_cast<int64_t>(n_kv) * hd;
  std::vector<float> k_heads(static_cast<size_t>(n * kv_dim));  // [n_kv, n, hd]
  std::vector<float> v_heads(static_cast<size_t>(n * kv_dim));  // [n_kv, n, hd]
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), 0);
  const size_t row_bytes = static_cast<size_t>(n * hd) * sizeof(float);
  const int64_t headroom = decode_headroom(n);
  for (int l = 0; l < config.n_layers; ++l) {
    LayerCache& layer_cache = cache.layer(l);
    for (int h = 0; h < n_kv; ++h) {
      HeadCache& head = layer_cache.heads[static_cast<size_t>(h)];
      std::memcpy(k_heads.data() + static_cast<int64_t>(h) * n * hd, head.keys(), row_bytes);
      std::memcpy(v_heads.data() + static_cast<int64_t>(h) * n * hd, head.values(), row_bytes);
      head.clear();  // compress_prefill writes into empty heads
    }
    LayerView view;
    view.layer = l;
    view.n_layers = config.n_layers;
    view.n_tokens = n;
    view.head_dim = hd;
    view.n_heads = config.n_heads;
    view.n_kv_heads = n_kv;
    view.q = queries[static_cast<size_t>(l)].data();
    view.k = k_heads.data();
    view.v = v_heads.data();
    view.positions = positions.data();
    const Timer compress_timer;
    press->compress_prefill(view, layer_cache);
    stats.compress_ms += compress_timer.ms();
    for (HeadCache& head : layer_cache.heads) {
      head.release_unused();
      head.reserve(head.size() + headroom);
    }
  }
}

std::span<const float> Session::Impl::prefill(std::span<const int32_t> tokens) {
  const Timer total_timer;
  const auto n = static_cast<int64_t>(tokens.size());
  PROTOKV_CHECK(n > 0, "empty prompt: prefill needs at least one token");
  PROTOKV_CHECK(n <= config.context_length,
                "prompt of {} tokens is longer than the model's context ({} tokens)", n,
                config.context_length);
  PROTOKV_CHECK(options.ubatch >= 0, "ubatch must be >= 0 (0: the whole prompt), got {}",
                options.ubatch);
  for (int32_t t : tokens) check_token(t);
  reset();

  int64_t budget_entries = n;
  if (options.press != nullptr) {
    options.budget.validate();
    budget_entries = options.budget.resolve(n);
    SequenceInfo info;
    info.n_layers = config.n_layers;
    info.n_heads = config.n_heads;
    info.n_kv_heads = config.n_kv_heads;
    info.head_dim = config.head_dim();
    info.n_tokens = n;
    press = options.press->instantiate();  // this sequence's own state
    press->begin(info, options.budget);
  }
  // A budget that covers the prompt keeps everything: the cache is filled exactly as without a
  // press, so the output is bit-identical to no compression.
  const bool compress = press != nullptr && budget_entries < n;
  const int64_t chunk = options.ubatch > 0 ? std::min(options.ubatch, n) : n;

  RowBuffers rows(chunk, config);
  if (compress && chunk == n) {
    forward_chunk(tokens, ChunkKind::kPromptWhole, rows, nullptr, n);
  } else {
    std::vector<std::vector<float>> queries(compress ? static_cast<size_t>(config.n_layers) : 0);
    for (int64_t r0 = 0; r0 < n; r0 += chunk)
      forward_chunk(
          tokens.subspan(static_cast<size_t>(r0), static_cast<size_t>(std::min(chunk, n - r0))),
          ChunkKind::kPrompt, rows, compress ? &queries : nullptr, n);
    if (compress) compress_cached_prompt(queries, n);
  }

  stats.n_tokens = n;
  stats.kv_bytes = cache.kv_bytes();
  stats.prefill_ms = total_timer.ms();
  return logits;
}

void Session::Impl::check_append(std::span<const int32_t> tokens) const {
  const auto n = static_cast<int64_t>(tokens.size());
  PROTOKV_CHECK(n > 0, "nothing to append: no tokens given");
  PROTOKV_CHECK(n_past + n <= config.context_length,
                "context is full: {} tokens after position {} do not fit the model's context of "
                "{} tokens",
                n, n_past, config.context_length);
  PROTOKV_CHECK(options.ubatch >= 0, "ubatch must be >= 0 (0: the whole prompt), got {}",
                options.ubatch);
  for (int32_t t : tokens) check_token(t);
}

std::span<const float> Session::Impl::append(std::span<const int32_t> tokens) {
  check_append(tokens);
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t chunk = options.ubatch > 0 ? std::min(options.ubatch, n) : n;
  RowBuffers rows(chunk, config);
  for (int64_t r0 = 0; r0 < n; r0 += chunk)
    forward_chunk(
        tokens.subspan(static_cast<size_t>(r0), static_cast<size_t>(std::min(chunk, n - r0))),
        ChunkKind::kAppend, rows, nullptr, n_past + n);
  return logits;
}

}  // namespace protokv
