// SPDX-License-Identifier: Apache-2.0
// Decode (docs/DESIGN.md §3.2): one token at position n_past through the shared block steps
// (forward.cpp) with N = 1. Its K/V are appended to every KV head of each layer, each query head
// attends over all entries of its KV head (heads may hold different numbers of entries after
// compression), then the press sees the step.
#include <algorithm>
#include <array>
#include <cmath>

#include "core/parallel.h"
#include "kernels/kernels.h"
#include "model/session_impl.h"
#include "protokv/error.h"
#include "protokv/threads.h"

namespace protokv {

Session::Impl::DecodeState Session::Impl::begin_decode(int32_t token) {
  check_token(token);
  PROTOKV_CHECK(n_past < config.context_length,
                "context is full: position {} is past the model's context of {} tokens", n_past,
                config.context_length);
  DecodeState st;
  st.position = static_cast<int32_t>(n_past);
  Press* press = this->press.get();
  st.want_probs = (observer != nullptr && observer->wants_probabilities()) ||
                  (press != nullptr && press->wants_decode_probabilities());
  if (selections.size() != static_cast<size_t>(config.n_heads))
    selections.resize(static_cast<size_t>(config.n_heads));
  // Only a head that scores borrowed keys with its lender layer's query (PoD, scores=lower) reads
  // other layers' queries; only a press sets up sharing, and the cache says whether any does.
  for (int l = 0; press != nullptr && l < config.n_layers && !st.keep_queries; ++l)
    for (const HeadCache& head : cache.layer(l).heads)
      st.keep_queries = st.keep_queries || (head.shares_keys() && head.uses_lender_query());
  const int64_t q_dim = static_cast<int64_t>(config.n_heads) * config.head_dim();
  if (st.keep_queries) step_queries.resize(static_cast<size_t>(config.n_layers * q_dim));
  return st;
}

void Session::Impl::decode_attention(int l, DecodeState& st, const float* q, const float* k,
                                     const float* v, float* att) {
  const int32_t pos = st.position;
  const int hd = config.head_dim();
  const int n_heads = config.n_heads;
  const int n_kv = config.n_kv_heads;
  const int group = config.group_size();
  const int64_t q_dim = static_cast<int64_t>(n_heads) * hd;
  Press* press = this->press.get();
  const bool want_probs = st.want_probs;
  LayerCache& layer_cache = cache.layer(l);
  const int press_layer = press_index[static_cast<size_t>(l)];
  if (st.keep_queries) std::copy(q, q + q_dim, step_queries.begin() + l * q_dim);

  int64_t longest = 0;
  for (int h = 0; h < n_kv; ++h) {
    HeadCache& head = layer_cache.heads[static_cast<size_t>(h)];
    head.append(k + static_cast<int64_t>(h) * hd, v + static_cast<int64_t>(h) * hd, pos);
    longest = std::max(longest, head.size());
  }
  if (want_probs) ensure_probs_capacity(longest);
  // A recall press picks each query head's entries before attention (DESIGN §4).
  const bool selecting = press != nullptr && press_layer >= 0 && press->selects(press_layer);
  const bool as_llama_cpp = attends_as_llama_cpp(l, want_probs);
  const float llama_cpp_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Short caches stay serial: waking the thread pool would cost more than the attention itself.
  constexpr int64_t kParallelMinWork = int64_t{1} << 15;
  // Query heads [begin, end) of KV head kv's group over the head's entries (its own keys, or
  // PoD's segments).
  const auto decode_query_heads = [&](int kv, int64_t begin, int64_t end) {
    const HeadCache& head = layer_cache.heads[static_cast<size_t>(kv)];
    const int64_t first = static_cast<int64_t>(kv) * group;  // first query head of the group
    const float* log_weights = head.has_log_weights() ? head.log_weights().data() : nullptr;
    // PoD: the keys of the head's distant entries are those of its block's lowest layer (and
    // with scores=lower, their logits use that layer's query too, PoD Eq. 3).
    const float* lender_queries = head.shares_keys() && head.uses_lender_query()
                                      ? step_queries.data() + lender_layer(head) * q_dim
                                      : nullptr;
    // Rotated rows (KvCacheType::hadamard): the kernels dot the stored H k' with H q (and H of
    // the lender's query), and their output sum p H v' is rotated back (H = H^-1). Presses and
    // observers see q and the output unrotated.
    thread_local std::vector<float> rotated_queries, rotated_lender_queries;
    const float* queries = q;
    if (head.key_rotation() != 0) {
      const auto rotated = [&](const float* rows, std::vector<float>& out) {
        out.assign(rows, rows + q_dim);
        hadamard_rows(out.data() + begin * hd, end - begin, hd, head.key_rotation());
        return out.data();
      };
      queries = rotated(q, rotated_queries);
      if (lender_queries != nullptr)
        lender_queries = rotated(lender_queries, rotated_lender_queries);
    }
    std::array<KeySegment, 3> segments;
    const HeadCache& lender = head.shares_keys()
                                  ? cache.layer(lender_layer(head)).heads[static_cast<size_t>(kv)]
                                  : head;  // a dense head's one segment is its own keys
    const int segment_count = head.key_segments(
        lender, segments, lender_queries != nullptr ? lender_queries + begin * hd : nullptr);
    const std::span<const KeySegment> key_segments(segments.data(),
                                                   static_cast<size_t>(segment_count));
    const ValueRows values(head.value_rows(), head.type().value);
    const auto rotate_output_back = [&] {
      hadamard_rows(att + begin * hd, end - begin, hd, head.value_rotation());
    };
    const bool plain_rows = !head.shares_keys() && segment_count == 1 &&
                            segments[0].query == nullptr && log_weights == nullptr &&
                            head.key_rotation() == 0 && head.value_rotation() == 0;
    if (as_llama_cpp && plain_rows && !selecting) {  // the head's own F32 (or F16) rows
      const int64_t n = head.size();
      const float* keys = static_cast<const float*>(segments[0].keys);
      const float* value_rows = static_cast<const float*>(values.data);
      if (options.llama_cpp_flash_attention) {  // the cache's F32 or F16 rows
        const ValueRows key_rows(segments[0].keys, head.type().key);
        for (int64_t h = begin; h < end; ++h)
          kernels::flash_attention_as_llama_cpp(queries + h * hd, key_rows, values, n, hd,
                                                llama_cpp_scale, flash_decode, att + h * hd);
        return;
      }
      for (int64_t h = begin; h < end; ++h)
        kernels::attention_as_llama_cpp(queries + h * hd, keys, value_rows, n, hd, llama_cpp_scale,
                                        /*batched=*/false, att + h * hd);
      return;
    }
    if (!selecting) {
      kernels::attention_decode_group_segments(
          queries + begin * hd, static_cast<int>(end - begin), key_segments, values, log_weights,
          hd, att + begin * hd,
          // The group's rows of probabilities are packed at the head's length from its first
          // query head's row (DecodeStep::group_probs).
          want_probs ? probs.data() + first * probs_stride + (begin - first) * head.size()
                     : nullptr);
      rotate_output_back();
      return;
    }
    for (int64_t h = begin; h < end; ++h) {
      std::vector<int32_t>& chosen = selections[static_cast<size_t>(h)];
      press->select(press_layer, static_cast<int>(h), q + h * hd, head, chosen);
      float* head_probs = want_probs ? probs.data() + h * probs_stride : nullptr;
      // The lender's query of this very query head (the group segment holds the group's).
      for (KeySegment& segment : segments)
        if (segment.query != nullptr) segment.query = lender_queries + h * hd;
      kernels::attention_decode_gathered_segments(queries + h * hd, key_segments, values,
                                                  log_weights, chosen, hd, att + h * hd,
                                                  head_probs);
    }
    rotate_output_back();
  };
  // One pass over each KV head's entries for its whole group of query heads; in parallel with
  // fewer KV heads than threads (Gemma 3 270M: one) each group is cut into parts so that every
  // thread works, each part reading the head's entries once (from cache after the first). Each
  // query head's result does not depend on the parts (tests/test_engine.cpp).
  const bool parallel = longest * hd * n_heads >= kParallelMinWork;
  const int threads = num_threads();
  const int parts = parallel && n_kv < threads ? std::min(group, (threads + n_kv - 1) / n_kv) : 1;
  // A press's select() and the key sharing's checks may throw: never out of the parallel region.
  ParallelErrors errors;
#pragma omp parallel for schedule(static) if (parallel)
  for (int item = 0; item < n_kv * parts; ++item) {
    const int kv = item / parts, part = item % parts;
    const int64_t first = static_cast<int64_t>(kv) * group;
    errors.run([&] {
      decode_query_heads(kv, first + group * part / parts, first + group * (part + 1) / parts);
    });
  }
  errors.rethrow();
  // Bytes of keys and values this layer's attention read, per KV head's worth of query heads, in
  // the cache type's rows.
  const size_t entry_bytes =
      dtype_row_bytes(cache.type().key, hd) + dtype_row_bytes(cache.type().value, hd);
  for (int h = 0; h < n_heads; ++h) {
    const int64_t entries = selecting
                                ? static_cast<int64_t>(selections[static_cast<size_t>(h)].size())
                                : layer_cache.heads[static_cast<size_t>(h / group)].size();
    st.attended_bytes += static_cast<size_t>(entries) * entry_bytes;
  }

  DecodeStep decode_step{.layer = l,
                         .n_heads = n_heads,
                         .head_dim = hd,
                         .position = pos,
                         .q = q,
                         .attention_output = att,
                         .cache = &layer_cache,
                         .probs_data = want_probs ? probs.data() : nullptr,
                         .probs_stride = probs_stride,
                         .selections = selecting ? selections.data() : nullptr};
  if (observer != nullptr) observer->on_decode(decode_step);
  // The press sees the step after this layer's attention, so what it evicts affects later
  // steps only; it numbers the layers it compresses on its own.
  if (press != nullptr && press_layer >= 0) {
    decode_step.layer = press_layer;
    press->on_decode(decode_step);
  }
  if (config.is_local_layer(l)) forget_out_of_window(l, pos + 1);
}

void Session::Impl::end_decode(DecodeState& st) {
  stats.decode_attended_kv_bytes = st.attended_bytes / static_cast<size_t>(config.group_size());
  ++n_past;
}

std::span<const float> Session::Impl::decode(int32_t token) {
  DecodeState st = begin_decode(token);
  RowBuffers& s = step;
  embed(std::span<const int32_t>(&token, 1), s);
  for (int l = 0; l < config.n_layers; ++l) {
    attention_inputs(l, 1, &st.position, s);
    decode_attention(l, st, s.q.data(), s.k.data(), s.v.data(), s.att.data());
    attention_output_and_ffn(weights.layers[static_cast<size_t>(l)], 1, s);
  }
  output_logits(s.x.data(), s.xb.data());
  end_decode(st);
  return logits;
}

std::vector<std::span<const float>> decode_batch(std::span<Session* const> sessions,
                                                 std::span<const int32_t> tokens) {
  PROTOKV_CHECK(sessions.size() == tokens.size(), "decode_batch: {} sessions but {} tokens",
                sessions.size(), tokens.size());
  if (sessions.empty()) return {};
  if (sessions.size() == 1) return {sessions[0]->decode(tokens[0])};
  Session::Impl& first = *sessions[0]->impl_;
  const ModelConfig& config = first.config;
  const auto n = static_cast<int64_t>(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) {
    PROTOKV_CHECK(&sessions[i]->impl_->weights == &first.weights,
                  "decode_batch: the sessions must share one model's weights");
    for (size_t j = 0; j < i; ++j)
      PROTOKV_CHECK(sessions[j] != sessions[i], "decode_batch: session {} is given twice", i);
  }
  std::vector<Session::Impl::DecodeState> states;
  states.reserve(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i)
    states.push_back(sessions[i]->impl_->begin_decode(tokens[i]));  // throws before any change

  for (size_t i = 1; i < sessions.size(); ++i)
    PROTOKV_CHECK(
        sessions[i]->impl_->options.llama_cpp_arithmetic == first.options.llama_cpp_arithmetic,
        "decode_batch: the sessions must all compute with llama.cpp's arithmetic or "
        "none (session {} differs from session 0)",
        i);
  RowBuffers b(n, config);
  b.independent_rows = true;
  b.llama_cpp_arithmetic = first.options.llama_cpp_arithmetic;  // each row as decode's
  std::vector<int32_t> positions;
  positions.reserve(states.size());
  for (const auto& st : states) positions.push_back(st.position);
  const int64_t q_dim = static_cast<int64_t>(config.n_heads) * config.head_dim();
  const int64_t kv_dim = static_cast<int64_t>(config.n_kv_heads) * config.head_dim();
  std::vector<float> logits(static_cast<size_t>(n * config.vocab_size));
  try {
    first.embed(tokens, b);
    for (int l = 0; l < config.n_layers; ++l) {
      first.attention_inputs(l, n, positions.data(), b);
      for (int64_t i = 0; i < n; ++i)
        sessions[static_cast<size_t>(i)]->impl_->decode_attention(
            l, states[static_cast<size_t>(i)], b.q.data() + i * q_dim, b.k.data() + i * kv_dim,
            b.v.data() + i * kv_dim, b.att.data() + i * q_dim);
      first.attention_output_and_ffn(first.weights.layers[static_cast<size_t>(l)], n, b);
    }
    // The output projection once for all rows, each as output_logits computes it.
    for (int64_t i = 0; i < n; ++i)
      kernels::rmsnorm(b.xb.data() + i * config.dim, b.x.data() + i * config.dim,
                       first.weights.output_norm, config.dim, config.norm_eps);
    if (first.options.llama_cpp_arithmetic)
      kernels::matmul_as_llama_cpp(first.weights.output, b.xb.data(), n, logits.data(), false);
    else
      kernels::matvec_rows(first.weights.output, b.xb.data(), n, logits.data());
  } catch (...) {
    // A failure part-way through the layers leaves the caches inconsistent.
    for (Session* s : sessions) s->impl_->reset();
    throw;
  }
  std::vector<std::span<const float>> out;
  for (int64_t i = 0; i < n; ++i) {
    Session::Impl& impl = *sessions[static_cast<size_t>(i)]->impl_;
    std::copy(logits.begin() + i * config.vocab_size, logits.begin() + (i + 1) * config.vocab_size,
              impl.logits.begin());
    impl.softcap_logits();
    impl.end_decode(states[static_cast<size_t>(i)]);
    out.push_back(impl.logits);
  }
  return out;
}

}  // namespace protokv
