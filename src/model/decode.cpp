// Decode (docs/DESIGN.md §3.2): one token at position n_past through the shared block steps
// (forward.cpp) with N = 1. Its K/V are appended to every KV head of each layer, each query head
// attends over all entries of its KV head (heads may hold different numbers of entries after
// compression), then the press sees the step.
#include <algorithm>
#include <array>

#include "kernels/kernels.h"
#include "model/session_impl.h"
#include "protokv/error.h"

namespace protokv {

std::span<const float> Session::Impl::decode(int32_t token) {
  check_token(token);
  PROTOKV_CHECK(n_past < config.context_length,
                "context is full: position {} is past the model's context of {} tokens", n_past,
                config.context_length);
  const auto pos = static_cast<int32_t>(n_past);
  const int hd = config.head_dim();
  const int n_heads = config.n_heads;
  const int n_kv = config.n_kv_heads;
  const int group = config.group_size();
  RowBuffers& s = step;
  Press* press = this->press.get();
  const bool want_probs = (observer != nullptr && observer->wants_probabilities()) ||
                          (press != nullptr && press->wants_decode_probabilities());
  if (selections.size() != static_cast<size_t>(n_heads))
    selections.resize(static_cast<size_t>(n_heads));
  size_t attended_bytes = 0;

  embed(std::span<const int32_t>(&token, 1), s);
  const int64_t q_dim = static_cast<int64_t>(n_heads) * hd;
  // Only a head that scores borrowed keys with its lender layer's query (PoD, scores=lower) reads
  // other layers' queries; only a press sets up sharing, and the cache says whether any does.
  bool keep_queries = false;
  for (int l = 0; press != nullptr && l < config.n_layers && !keep_queries; ++l)
    for (const HeadCache& head : cache.layer(l).heads)
      keep_queries = keep_queries || (head.shares_keys() && head.uses_lender_query());
  if (keep_queries) step_queries.resize(static_cast<size_t>(config.n_layers * q_dim));

  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& lw = weights.layers[static_cast<size_t>(l)];
    LayerCache& layer_cache = cache.layer(l);
    attention_inputs(l, 1, &pos, s);
    const int press_layer = press_index[static_cast<size_t>(l)];
    if (keep_queries) std::copy(s.q.begin(), s.q.begin() + q_dim, step_queries.begin() + l * q_dim);

    int64_t longest = 0;
    for (int h = 0; h < n_kv; ++h) {
      HeadCache& head = layer_cache.heads[static_cast<size_t>(h)];
      head.append(s.k.data() + static_cast<int64_t>(h) * hd,
                  s.v.data() + static_cast<int64_t>(h) * hd, pos);
      longest = std::max(longest, head.size());
    }
    if (want_probs) ensure_probs_capacity(longest);

    // A recall press picks each query head's entries before attention (DESIGN §4).
    const bool selecting = press != nullptr && press_layer >= 0 && press->selects(press_layer);
    // One pass over each KV head's entries for its whole group of query heads. Short caches stay
    // serial: waking the thread pool would cost more than the attention itself.
    constexpr int64_t kParallelMinWork = int64_t{1} << 15;
#pragma omp parallel for schedule(static) if (longest * hd * n_heads >= kParallelMinWork)
    for (int kv = 0; kv < n_kv; ++kv) {
      const HeadCache& head = layer_cache.heads[static_cast<size_t>(kv)];
      const int64_t first = static_cast<int64_t>(kv) * group;  // first query head of the group
      const float* log_weights = head.has_log_weights() ? head.log_weights().data() : nullptr;
      // PoD: the keys of the head's distant entries are those of its block's lowest layer (and
      // with scores=lower, their logits use that layer's query too, PoD Eq. 3).
      std::array<KeySegment, 3> segments;
      const float* lender_queries = head.shares_keys() && head.uses_lender_query()
                                        ? step_queries.data() + lender_layer(head) * q_dim
                                        : nullptr;
      const int segment_count =
          head.shares_keys()
              ? head.key_segments(cache.layer(lender_layer(head)).heads[static_cast<size_t>(kv)],
                                  segments,
                                  lender_queries != nullptr ? lender_queries + first * hd : nullptr)
              : 0;
      const std::span<const KeySegment> key_segments(segments.data(),
                                                     static_cast<size_t>(segment_count));
      if (!selecting && head.shares_keys()) {
        kernels::attention_decode_group_segments(
            s.q.data() + first * hd, group, key_segments, head.values(), log_weights, hd,
            s.att.data() + first * hd, want_probs ? probs.data() + first * probs_stride : nullptr);
        continue;
      }
      if (!selecting) {
        kernels::attention_decode_group(s.q.data() + first * hd, group, head.keys(), head.values(),
                                        log_weights, head.size(), hd, s.att.data() + first * hd,
                                        want_probs ? probs.data() + first * probs_stride : nullptr);
        continue;
      }
      for (int64_t h = first; h < first + group; ++h) {
        std::vector<int32_t>& chosen = selections[static_cast<size_t>(h)];
        press->select(press_layer, static_cast<int>(h), s.q.data() + h * hd, head, chosen);
        float* head_probs = want_probs ? probs.data() + h * probs_stride : nullptr;
        // The lender's query of this very query head (the group segment holds the group's).
        for (KeySegment& segment : segments)
          if (segment.query != nullptr) segment.query = lender_queries + h * hd;
        if (head.shares_keys())
          kernels::attention_decode_gathered_segments(s.q.data() + h * hd, key_segments,
                                                      head.values(), log_weights, chosen, hd,
                                                      s.att.data() + h * hd, head_probs);
        else
          kernels::attention_decode_gathered(s.q.data() + h * hd, head.keys(), head.values(),
                                             log_weights, chosen, hd, s.att.data() + h * hd,
                                             head_probs);
      }
    }
    // Bytes of keys and values this layer's attention read, per KV head's worth of query heads.
    for (int h = 0; h < n_heads; ++h) {
      const int64_t entries = selecting
                                  ? static_cast<int64_t>(selections[static_cast<size_t>(h)].size())
                                  : layer_cache.heads[static_cast<size_t>(h / group)].size();
      attended_bytes += static_cast<size_t>(entries) * static_cast<size_t>(hd) * 2 * sizeof(float);
    }

    DecodeStep decode_step{.layer = l,
                           .n_heads = n_heads,
                           .head_dim = hd,
                           .position = pos,
                           .q = s.q.data(),
                           .attention_output = s.att.data(),
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

    attention_output_and_ffn(lw, 1, s);
  }

  output_logits(s.x.data(), s.xb.data());
  stats.decode_attended_kv_bytes = attended_bytes / static_cast<size_t>(group);
  ++n_past;
  return logits;
}

}  // namespace protokv
