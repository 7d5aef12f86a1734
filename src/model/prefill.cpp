// SPDX-License-Identifier: Apache-2.0
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
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "core/parallel.h"
#include "kernels/kernels.h"
#include "model/session_impl.h"
#include "protokv/error.h"
#include "protokv/timer.h"

namespace protokv {
namespace {

constexpr int64_t kLlamaCppUbatch = 512;  // llama.cpp's default n_ubatch (-ub)

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

// Every query row i of the chunk (b.q) attends, head by head, as llama.cpp computes it
// (kernels::attention_as_llama_cpp, or flash_attention_as_llama_cpp with the chunk's row count as
// llama.cpp's ubatch) over its KV head's rows up to its own: kv_head(kv) gives that head's F32
// keys, values ([rows, head_dim]) and the rows before the chunk's first.
template <class KvHead>
void Session::Impl::attend_rows_as_llama_cpp(int64_t n, RowBuffers& b, KvHead kv_head) const {
  const int hd = config.head_dim();
  const int n_heads = config.n_heads;
  const int group = config.group_size();
  const int64_t q_dim = static_cast<int64_t>(n_heads) * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ParallelErrors errors;
  if (options.llama_cpp_flash_attention) {
    // Blocks of ggml's 64 query rows per head, each sharing its tiles' converted keys and values.
    kernels::LlamaCppFlashAttention how = flash_decode;
    how.batch_rows = n;  // llama.cpp's ubatch picks ggml's path
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) schedule(dynamic) if (n * q_dim >= kParallelMinElements)
    for (int h = 0; h < n_heads; ++h)
      for (int64_t block = 0; block < blocks; ++block)
        errors.run([&] {
          const auto [keys, values, n_past] = kv_head(h / group);
          const int64_t first = block * kBlock;
          kernels::flash_attention_as_llama_cpp(
              b.q.data() + first * q_dim + h * hd, q_dim, std::min(kBlock, n - first), keys, values,
              n_past + first + 1, hd, scale, how, b.att.data() + first * q_dim + h * hd, q_dim);
        });
    errors.rethrow();
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if (n * q_dim >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < n_heads; ++h)
      errors.run([&] {
        const auto [keys, values, n_past] = kv_head(h / group);
        kernels::attention_as_llama_cpp(b.q.data() + i * q_dim + h * hd, keys, values,
                                        n_past + i + 1, hd, scale, /*batched=*/n > 1,
                                        b.att.data() + i * q_dim + h * hd);
      });
  errors.rethrow();
}

void Session::Impl::forward_chunk(std::span<const int32_t> tokens, ChunkKind kind, RowBuffers& b,
                                  std::vector<std::vector<float>>* queries, int64_t n_total,
                                  const Session::RowLogits* on_logits, int64_t first_index) {
  const auto n = static_cast<int64_t>(tokens.size());
  b.llama_cpp_arithmetic = options.llama_cpp_arithmetic;
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
  // The whole prompt's K/V go to the press directly at the layers it compresses; the others (a
  // model's sliding-window layers) take the cached path below.
  const bool to_press = kind == ChunkKind::kPromptWhole;
  std::vector<float> k_heads(to_press ? static_cast<size_t>(n * kv_dim) : 0);  // [n_kv, n, hd]
  std::vector<float> v_heads(to_press ? static_cast<size_t>(n * kv_dim) : 0);  // [n_kv, n, hd]
  std::vector<float> q_heads(to_press ? static_cast<size_t>(n * q_dim) : 0);   // [n_heads, n, hd]
  std::vector<kernels::KvHeadRows> kv_rows(static_cast<size_t>(n_kv));
  // Keys of heads that share keys (PoD), gathered for the chunk's attention, and the rows of a
  // quantised cache as F32 (the cached path only).
  std::vector<std::vector<float>> gathered_keys(static_cast<size_t>(n_kv));
  std::vector<std::vector<float>> gathered_values(static_cast<size_t>(n_kv));
  const KvCacheType cache_type = cache.type();

  embed(tokens, b);
  const size_t chunk_layer_kv_bytes =
      static_cast<size_t>(n * n_kv) *
      (dtype_row_bytes(cache_type.key, hd) + dtype_row_bytes(cache_type.value, hd));
  size_t kv_bytes_now = cache.kv_bytes();  // all layers: this chunk's done ones + earlier chunks
  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& lw = weights.layers[static_cast<size_t>(l)];
    LayerCache& layer_cache = cache.layer(l);
    attention_inputs(l, n, positions.data(), b);
    // A quantised cache: every attention reads K/V as the cache holds them (llama.cpp's
    // attention reads its -ctk/-ctv cache too), the press scores those, and storing them again
    // changes nothing (each type's round trip is idempotent; with rotated rows, up to the float
    // rounding of the rotation, which would have to move a value across a rounding boundary).
    round_trip_to_cache_type(cache_type.key, key_rotation_width(cache_type, hd), b.k.data(),
                             n * n_kv, hd);
    round_trip_to_cache_type(cache_type.value, value_rotation_width(cache_type, hd), b.v.data(),
                             n * n_kv, hd);
    const int press_layer = press_index[static_cast<size_t>(l)];
    const int64_t window = config.is_local_layer(l) ? config.sliding_window : 0;

    if (to_press && press_layer >= 0) {
      // Causal attention over the chunk's own K/V, then the press writes this layer's cache
      // while the full tensors are at hand.
      rows_to_heads(b.k.data(), n, n_kv, hd, k_heads.data());
      rows_to_heads(b.v.data(), n, n_kv, hd, v_heads.data());
      rows_to_heads(b.q.data(), n, n_heads, hd, q_heads.data());
      if (window == 0 && attends_as_llama_cpp(l, /*want_probs=*/false)) {
        attend_rows_as_llama_cpp(n, b, [&](int kv) {
          const int64_t head = static_cast<int64_t>(kv) * n * hd;
          return std::tuple{k_heads.data() + head, v_heads.data() + head, int64_t{0}};
        });
      } else {
        kernels::attention_prefill_heads({b.q.data(), q_dim, hd}, {k_heads.data(), hd, n * hd},
                                         {v_heads.data(), hd, n * hd}, {b.att.data(), q_dim, hd}, n,
                                         /*n_past=*/0, n_heads, n_kv, hd, window);
      }
      stats.peak_kv_bytes = std::max(stats.peak_kv_bytes, kv_bytes_now + chunk_layer_kv_bytes);
      LayerView view;
      view.layer = press_layer;
      view.n_layers = static_cast<int>(press_layers.size());
      view.n_tokens = n;
      view.head_dim = hd;
      view.n_heads = n_heads;
      view.n_kv_heads = n_kv;
      view.q = q_heads.data();
      view.k = k_heads.data();
      view.v = v_heads.data();
      view.positions = positions.data();
      view.rope = rope_view(l);
      const Timer compress_timer;
      press->compress_prefill(view, layer_cache);
      stats.compress_ms += compress_timer.ms();
      check_key_lenders(l);
      if (window > 0) {
        forget_out_of_window(l, n);  // compress_local_layers: window on top
      } else {
        const int64_t headroom = decode_headroom(n);
        for (HeadCache& head : layer_cache.heads) head.reserve(head.size() + headroom);
      }
      kv_bytes_now += layer_cache.kv_bytes();
    } else {
      // The chunk's K/V join the cache first; then each query row attends to its head's cached
      // entries (possibly compressed, with log-weights) and the chunk rows up to its own.
      // Room for the rest of this prompt (or appended turn) and the first decode steps; a
      // sliding-window layer that forgets after this chunk needs room for the chunk only.
      const bool compression_pending = queries != nullptr && (press_layer >= 0 || capturing_prompt);
      const bool forgets = window > 0 && !compression_pending;
      const int64_t reserve_rows = forgets ? n : (n_total - row0) + decode_headroom(n_total);
      ParallelErrors errors;
#pragma omp parallel for schedule(static) if (n * kv_dim >= kParallelMinElements)
      for (int h = 0; h < n_kv; ++h) {
        errors.run([&] {
          HeadCache& head = layer_cache.heads[static_cast<size_t>(h)];
          const int64_t head_past = head.size();
          head.reserve(head_past + reserve_rows);
          for (int64_t i = 0; i < n; ++i)
            head.append(b.k.data() + i * kv_dim + static_cast<int64_t>(h) * hd,
                        b.v.data() + i * kv_dim + static_cast<int64_t>(h) * hd,
                        positions[static_cast<size_t>(i)]);
          std::vector<float>& key_floats = gathered_keys[static_cast<size_t>(h)];
          std::vector<float>& value_floats = gathered_values[static_cast<size_t>(h)];
          const float* keys = nullptr;
          if (head.shares_keys()) {
            // PoD: the chunk's rows read the distant entries' keys from the block's lowest layer
            // (already run for this chunk), gathered once per chunk; the entries that leave the
            // recent window during the chunk keep their own keys until the press drops them after
            // it (on_decode below), so the chunk sees slightly more own keys than decode would.
            // The chunk kernel has one query per row: with scores=lower the borrowed keys meet
            // the row's own query here, not the lender layer's.
            std::array<KeySegment, 3> segments;
            const int count = head.key_segments(
                cache.layer(lender_layer(head)).heads[static_cast<size_t>(h)], segments);
            key_floats.resize(static_cast<size_t>(head.size() * hd));
            float* next = key_floats.data();
            for (int i = 0; i < count; ++i) {
              const KeySegment& segment = segments[static_cast<size_t>(i)];
              dequantize_row(segment.type, segment.keys, next, segment.count * hd);
              next += segment.count * hd;
            }
            hadamard_rows(key_floats.data(), head.size(), hd, head.key_rotation());
            keys = key_floats.data();
          } else {
            keys = head.keys_as_f32(0, head.size(), key_floats);
          }
          const float* values = head.values_as_f32(0, head.size(), value_floats);
          kv_rows[static_cast<size_t>(h)] = {
              keys, values, hd, head.has_log_weights() ? head.log_weights().data() : nullptr,
              head_past};
          if (window > 0) {  // sliding-window layer: rows are masked by their positions
            const std::span<const int32_t> pos = head.positions();
            kv_rows[static_cast<size_t>(h)].window = window;
            kv_rows[static_cast<size_t>(h)].positions = pos.data();
            kv_rows[static_cast<size_t>(h)].positions_ascending =
                std::is_sorted(pos.begin(), pos.end());
          }
        });
      }
      errors.rethrow();
      kv_bytes_now += chunk_layer_kv_bytes;
      if (kind != ChunkKind::kAppend)  // the stats describe the prompt's prefill
        stats.peak_kv_bytes = std::max(stats.peak_kv_bytes, kv_bytes_now);
      const bool plain_rows =
          std::all_of(kv_rows.begin(), kv_rows.end(), [](const kernels::KvHeadRows& rows) {
            return rows.log_weights == nullptr && rows.window == 0;
          });
      if (plain_rows && attends_as_llama_cpp(l, /*want_probs=*/false)) {
        // Query row i of head h over its KV head's rows up to its own (llama.cpp multiplies the
        // values of a batch of two or more rows by tinyBLAS).
        attend_rows_as_llama_cpp(n, b, [&](int kv) {
          const kernels::KvHeadRows& rows = kv_rows[static_cast<size_t>(kv)];
          return std::tuple{rows.k, rows.v, rows.n_past};
        });
      } else {
        kernels::attention_prefill_cached({b.q.data(), q_dim, hd}, kv_rows,
                                          {b.att.data(), q_dim, hd}, n, n_heads, hd);
      }
      if (queries != nullptr) {
        auto& layer_queries = (*queries)[static_cast<size_t>(l)];
        if (layer_queries.empty()) layer_queries.assign(static_cast<size_t>(n_total * q_dim), 0.0f);
        rows_to_heads(b.q.data(), n, n_heads, hd, layer_queries.data(), row0, n_total);
      }
      // A sliding-window layer forgets the rows no later query sees, unless the press is yet to
      // compress it from the whole prompt (chunked prefill with compress_local_layers).
      if (forgets) forget_out_of_window(l, row0 + n);
      // After compression, appended rows reach the press like decoded tokens do.
      if (kind == ChunkKind::kAppend && press != nullptr && press_layer >= 0) {
        DecodeStep step{
            .layer = press_layer, .n_heads = n_heads, .head_dim = hd, .cache = &layer_cache};
        for (int64_t i = 0; i < n; ++i) {
          step.position = positions[static_cast<size_t>(i)];
          step.q = b.q.data() + i * q_dim;
          press->on_decode(step);
        }
      }
    }

    // llama.cpp keeps only the rows whose logits it returns after the last layer's attention
    // output (inp_out_ids): its FFN multiplies that one row as a mat-vec, which rounds F16 rows
    // differently from its batched (tinyBLAS) order.
    const bool all_logits = on_logits != nullptr && *on_logits;
    const bool last_row_ffn =
        options.llama_cpp_arithmetic && !all_logits && l == config.n_layers - 1;
    attention_output_and_ffn(lw, n, b, last_row_ffn ? n - 1 : 0);
  }

  if (on_logits != nullptr && *on_logits) {
    output_logits_rows(n, b, first_index, *on_logits);
  } else {  // the last token's logits only
    float* last = b.x.data() + (n - 1) * config.dim;
    output_logits(last, last);
  }
  n_past += n;
}

void Session::Impl::forget_out_of_window(int layer, int64_t next_position) {
  // The next query, at next_position, sees positions > next_position - window (llama.cpp's
  // LLAMA_SWA_TYPE_STANDARD), and later ones see less.
  const auto min_position =
      static_cast<int32_t>(std::max<int64_t>(0, next_position - config.sliding_window + 1));
  for (HeadCache& head : cache.layer(layer).heads) {
    if (head.shares_keys())
      fail("layer {} is a sliding-window layer and cannot share its keys with other layers", layer);
    head.drop_positions_before(min_position);
    // The memory too, not only the entries (a whole prompt chunk passed through the head): the
    // next step appends one entry and drops one; a next chunk reserves its own rows.
    head.trim_capacity(head.size() + 1);
  }
}

void Session::Impl::check_key_lenders(int layer) const {
  for (const HeadCache& head : cache.layer(layer).heads) {
    if (!head.shares_keys()) continue;
    const int lender = lender_layer(head);
    if (config.is_local_layer(layer) || config.is_local_layer(lender))
      fail(
          "layer {} would read keys from layer {}: a sliding-window layer forgets its keys, so "
          "it can neither lend nor borrow them (compress the global layers only)",
          layer, lender);
  }
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
  const int64_t headroom = decode_headroom(n);
  for (size_t press_layer = 0; press_layer < press_layers.size(); ++press_layer) {
    const int l = press_layers[press_layer];
    LayerCache& layer_cache = cache.layer(l);
    for (int h = 0; h < n_kv; ++h) {
      HeadCache& head = layer_cache.heads[static_cast<size_t>(h)];
      head.read_keys(0, n, k_heads.data() + static_cast<int64_t>(h) * n * hd);
      head.read_values(0, n, v_heads.data() + static_cast<int64_t>(h) * n * hd);
      head.clear();  // compress_prefill writes into empty heads
    }
    LayerView view;
    view.layer = static_cast<int>(press_layer);
    view.n_layers = static_cast<int>(press_layers.size());
    view.n_tokens = n;
    view.head_dim = hd;
    view.n_heads = config.n_heads;
    view.n_kv_heads = n_kv;
    view.q = queries[static_cast<size_t>(l)].data();
    view.k = k_heads.data();
    view.v = v_heads.data();
    view.positions = positions.data();
    view.rope = rope_view(l);
    const Timer compress_timer;
    press->compress_prefill(view, layer_cache);
    stats.compress_ms += compress_timer.ms();
    check_key_lenders(l);
    if (config.is_local_layer(l)) {
      forget_out_of_window(l, n);  // compress_local_layers
      continue;
    }
    for (HeadCache& head : layer_cache.heads) {
      head.release_unused();
      head.reserve(head.size() + headroom);
    }
  }
}

void Session::Impl::check_prompt(std::span<const int32_t> tokens) const {
  const auto n = static_cast<int64_t>(tokens.size());
  PROTOKV_CHECK(n > 0, "empty prompt: prefill needs at least one token");
  PROTOKV_CHECK(n <= config.context_length,
                "prompt of {} tokens is longer than the model's context ({} tokens)", n,
                config.context_length);
  PROTOKV_CHECK(options.ubatch >= 0, "ubatch must be >= 0 (0: the whole prompt), got {}",
                options.ubatch);
  for (int32_t t : tokens) check_token(t);
}

int64_t Session::Impl::chunk_rows(int64_t n) const {
  const int64_t ubatch = options.ubatch > 0             ? options.ubatch
                         : options.llama_cpp_arithmetic ? kLlamaCppUbatch
                                                        : 0;
  return ubatch > 0 ? std::min(ubatch, n) : n;
}

int64_t Session::Impl::begin_press(int64_t n) {
  int64_t budget_entries = n;
  if (options.press != nullptr && !press_layers.empty()) {
    options.budget.validate();
    budget_entries = options.budget.resolve(n);
    SequenceInfo info;
    info.n_layers = static_cast<int>(press_layers.size());
    info.n_heads = config.n_heads;
    info.n_kv_heads = config.n_kv_heads;
    info.head_dim = config.head_dim();
    info.n_tokens = n;
    press = options.press->instantiate();  // this sequence's own state
    press->begin(info, options.budget);
  }
  return budget_entries;
}

std::span<const float> Session::Impl::prefill(std::span<const int32_t> tokens) {
  begin_prefill(tokens);
  while (!prefill_chunk()) {
  }
  return logits;
}

void Session::Impl::begin_prefill(std::span<const int32_t> tokens) {
  const Timer timer;
  const auto n = static_cast<int64_t>(tokens.size());
  check_prompt(tokens);
  reset();
  const int64_t budget_entries = begin_press(n);
  auto p = std::make_unique<PendingPrefill>();
  p->tokens.assign(tokens.begin(), tokens.end());
  // A budget that covers the prompt keeps everything: the cache is filled exactly as without a
  // press, so the output is bit-identical to no compression.
  p->compress = press != nullptr && budget_entries < n;
  p->chunk = chunk_rows(n);
  p->rows = RowBuffers(p->chunk, config);
  if (p->compress && p->chunk < n) p->queries.resize(static_cast<size_t>(config.n_layers));
  p->ms = timer.ms();
  pending = std::move(p);
}

bool Session::Impl::prefill_chunk() {
  PROTOKV_CHECK(pending != nullptr, "prefill_chunk() without begin_prefill()");
  const Timer timer;
  PendingPrefill& p = *pending;
  const auto n = static_cast<int64_t>(p.tokens.size());
  const std::span<const int32_t> tokens(p.tokens);
  if (p.compress && p.chunk == n) {  // the whole prompt at once: each layer compressed in turn
    forward_chunk(tokens, ChunkKind::kPromptWhole, p.rows, nullptr, n);
    p.next = n;
  } else {
    const int64_t rows = std::min(p.chunk, n - p.next);
    forward_chunk(tokens.subspan(static_cast<size_t>(p.next), static_cast<size_t>(rows)),
                  ChunkKind::kPrompt, p.rows, p.compress ? &p.queries : nullptr, n);
    p.next += rows;
    if (p.next == n && p.compress) compress_cached_prompt(p.queries, n);
  }
  p.ms += timer.ms();
  if (p.next < n) return false;
  stats.n_tokens = n;
  stats.kv_bytes = cache.kv_bytes();
  stats.prefill_ms = p.ms;
  pending.reset();
  return true;
}

void Session::Impl::capture_prompt(std::span<const int32_t> tokens, PrefilledPrompt::Data& out) {
  const Timer total_timer;
  const auto n = static_cast<int64_t>(tokens.size());
  check_prompt(tokens);
  reset();
  const int64_t chunk = chunk_rows(n);
  RowBuffers rows(chunk, config);
  std::vector<std::vector<float>> queries(static_cast<size_t>(config.n_layers));
  capturing_prompt = true;  // every row stays, local layers included: a press may want them
  try {
    for (int64_t r0 = 0; r0 < n; r0 += chunk)
      forward_chunk(
          tokens.subspan(static_cast<size_t>(r0), static_cast<size_t>(std::min(chunk, n - r0))),
          ChunkKind::kPrompt, rows, &queries, n);
  } catch (...) {
    capturing_prompt = false;
    throw;
  }
  capturing_prompt = false;
  out.weights = &weights;
  out.n_tokens = n;
  out.cache = std::move(cache);
  out.queries = std::move(queries);
  out.logits = logits;
  out.peak_kv_bytes = stats.peak_kv_bytes;
  out.prefill_ms = total_timer.ms();
  reset();
}

std::span<const float> Session::Impl::prefill(const PrefilledPrompt& prompt) {
  const Timer total_timer;
  const PrefilledPrompt::Data& d = prompt.data();
  PROTOKV_CHECK(d.weights == &weights,
                "the prefilled prompt was made from other weights than this session's");
  PROTOKV_CHECK(
      d.cache.type() == options.cache_type,
      "the prefilled prompt's cache holds {} keys and {} values, this session's {} and {}",
      dtype_name(d.cache.type().key), dtype_name(d.cache.type().value),
      dtype_name(options.cache_type.key), dtype_name(options.cache_type.value));
  // With llama.cpp's arithmetic the ubatch decides how rows are multiplied and which flash
  // attention path they take.
  const auto arithmetic = [](const SessionOptions& o) {
    if (!o.llama_cpp_arithmetic) return std::string("protokv's");
    const int64_t ubatch = o.ubatch > 0 ? o.ubatch : kLlamaCppUbatch;
    if (!o.llama_cpp_flash_attention) return fmt::format("llama.cpp's (ubatch {})", ubatch);
    return fmt::format("llama.cpp's (ubatch {}, flash attention, {} threads)", ubatch,
                       o.llama_cpp_threads);
  };
  PROTOKV_CHECK(arithmetic(d.options) == arithmetic(options),
                "the prefilled prompt was computed with {} arithmetic, this session asks for {}",
                arithmetic(d.options), arithmetic(options));
  reset();
  const int64_t n = d.n_tokens;
  const int64_t budget_entries = begin_press(n);
  const bool compress = press != nullptr && budget_entries < n;
  cache = d.cache;
  n_past = n;
  std::copy(d.logits.begin(), d.logits.end(), logits.begin());
  if (compress) compress_cached_prompt(d.queries, n);
  const int64_t headroom = decode_headroom(n);
  for (int l = 0; l < config.n_layers; ++l) {
    const bool compressed = compress && press_index[static_cast<size_t>(l)] >= 0;
    if (compressed) continue;
    if (config.is_local_layer(l))
      forget_out_of_window(l, n);  // the copy holds every row: drops them and their memory
    else
      for (HeadCache& head : cache.layer(l).heads) head.reserve(head.size() + headroom);
  }
  stats.n_tokens = n;
  stats.peak_kv_bytes = d.peak_kv_bytes;
  stats.kv_bytes = cache.kv_bytes();
  stats.prefill_ms = total_timer.ms();
  return logits;
}

std::shared_ptr<const PrefilledPrompt> PrefilledPrompt::make(const ModelWeights& weights,
                                                             std::span<const int32_t> tokens,
                                                             int64_t ubatch,
                                                             KvCacheType cache_type) {
  SessionOptions options;
  options.ubatch = ubatch;
  options.cache_type = cache_type;
  return make(weights, tokens, options);
}

std::shared_ptr<const PrefilledPrompt> PrefilledPrompt::make(const ModelWeights& weights,
                                                             std::span<const int32_t> tokens,
                                                             const SessionOptions& arithmetic) {
  SessionOptions options = arithmetic;  // its ubatch, cache type and arithmetic
  options.press = nullptr;              // the prompt keeps every row
  options.budget = Budget{};
  options.compress_local_layers = false;
  Session::Impl impl(weights, options);
  auto data = std::make_unique<Data>();
  impl.capture_prompt(tokens, *data);
  data->options = options;
  return std::make_shared<const PrefilledPrompt>(std::move(data));
}

PrefilledPrompt::PrefilledPrompt(std::unique_ptr<Data> data) : data_(std::move(data)) {}
PrefilledPrompt::~PrefilledPrompt() = default;
int64_t PrefilledPrompt::n_tokens() const {
  return data_->n_tokens;
}
double PrefilledPrompt::prefill_ms() const {
  return data_->prefill_ms;
}
KvCacheType PrefilledPrompt::cache_type() const {
  return data_->cache.type();
}
SessionOptions PrefilledPrompt::options() const {
  return data_->options;
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

std::span<const float> Session::Impl::append(std::span<const int32_t> tokens,
                                             const Session::RowLogits& on_logits) {
  check_append(tokens);
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t chunk = chunk_rows(n);
  RowBuffers rows(chunk, config);
  // Every row's logits: each row multiplied as a decode step multiplies it (matvec_rows: int8
  // activations for the quantised types, F16 ones for F16, as llama.cpp's batches have them
  // too), the weights streamed once for all rows of the chunk; with llama.cpp's arithmetic, as
  // its batch multiplies them (forward.cpp project).
  rows.independent_rows = static_cast<bool>(on_logits) && !options.llama_cpp_arithmetic;
  for (int64_t r0 = 0; r0 < n; r0 += chunk)
    forward_chunk(
        tokens.subspan(static_cast<size_t>(r0), static_cast<size_t>(std::min(chunk, n - r0))),
        ChunkKind::kAppend, rows, nullptr, n_past + n, &on_logits, r0);
  return logits;
}

}  // namespace protokv
