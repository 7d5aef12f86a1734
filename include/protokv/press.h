// SPDX-License-Identifier: Apache-2.0
#pragma once
// Press interface (docs/DESIGN.md §5): a KV-cache compression method. The engine calls it inside
// prefill, right after each layer's attention, with that layer's full post-RoPE tensors, and during
// decode after each new token's K/V are appended. A press never calls the model; the engine never
// names a concrete press (they are created by name through the registry, press/registry.h).
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>  // the full header where config() is built or read
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protokv/kv_cache.h"

namespace protokv {

// A layer's rotary embedding, for a press that models queries at positions not yet seen
// (expected_attention): pair i of a head turns by position * inv_freq[i] radians; the pairs are
// (2i, 2i + 1), or (i, i + rot_dims / 2) when neox; coordinates from rot_dims on do not turn.
struct RopeView {
  std::span<const double> inv_freq;  // [rot_dims / 2]; empty when the caller did not say
  int rot_dims = 0;
  bool neox = false;
};

// One layer's prefill tensors, all F32, keys and queries post-RoPE.
struct LayerView {
  int layer = 0;
  int n_layers = 0;
  int64_t n_tokens = 0;
  int head_dim = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  const float* q = nullptr;            // [n_heads, n_tokens, head_dim]
  const float* k = nullptr;            // [n_kv_heads, n_tokens, head_dim]
  const float* v = nullptr;            // [n_kv_heads, n_tokens, head_dim]
  const int32_t* positions = nullptr;  // [n_tokens] original token positions
  RopeView rope;                       // how q and k were rotated (the engine always says)

  int group_size() const { return n_heads / n_kv_heads; }
  const float* q_head(int h) const { return q + static_cast<int64_t>(h) * n_tokens * head_dim; }
  const float* k_head(int h) const { return k + static_cast<int64_t>(h) * n_tokens * head_dim; }
  const float* v_head(int h) const { return v + static_cast<int64_t>(h) * n_tokens * head_dim; }
};

// Entries kept per KV head per layer: an absolute count or a ratio of the prompt.
struct Budget {
  int64_t entries = 0;  // > 0: absolute
  double ratio = 0.0;   // in (0, 1]: kept = max(1, floor(n * ratio))
  // Entries per head for a prompt of n tokens (may exceed n: then nothing is compressed).
  int64_t resolve(int64_t n_tokens) const;
  bool is_set() const { return entries > 0 || ratio > 0.0; }
  std::string to_string() const;
  // Throws Error for budget <= 0 or ratio outside (0, 1].
  void validate() const;
};

struct SequenceInfo {
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int64_t n_tokens = 0;  // tokens being prefilled (and compressed)
};

// One layer of one decode step, as the engine hands it to a press's on_decode and to observers,
// after that layer's attention.
struct DecodeStep {
  int layer = 0;
  int n_heads = 0;
  int head_dim = 0;
  int32_t position = 0;                     // the new token's position
  const float* q = nullptr;                 // [n_heads, head_dim] post-RoPE queries
  const float* attention_output = nullptr;  // [n_heads, head_dim] before wo; null in append()
  LayerCache* cache = nullptr;              // the layer's cache, new token appended

  // Softmax weights, when a press or an observer asked for them (else probs(h) is empty): query
  // head h attended the entries attended(h) of its KV head (all of them in cache order when
  // attended(h) is empty) with weights probs(h). Merged entries (log-weight > 0) count once here:
  // their weight already includes the + log(count) bias, and attended_positions() gives the one
  // position each is stored under; the tokens a merged entry stands for come from
  // Press::merged_positions (one entry is not always one token).
  std::span<const float> probs(int q_head) const {
    if (probs_data == nullptr) return {};
    if (selections != nullptr)
      return {probs_data + q_head * probs_stride, selections[q_head].size()};
    const int group = n_heads / static_cast<int>(cache->heads.size());
    const int kv = q_head / group;
    const auto size = static_cast<size_t>(cache->heads[static_cast<size_t>(kv)].size());
    // The group kernel writes [group, size] rows from the group's first slot.
    return {probs_data + static_cast<int64_t>(kv) * group * probs_stride +
                static_cast<int64_t>(q_head - kv * group) * static_cast<int64_t>(size),
            size};
  }
  std::span<const int32_t> attended(int q_head) const {
    return selections == nullptr ? std::span<const int32_t>() : selections[q_head];
  }
  // Positions of the entries query head h attended, aligned with probs(h); gathered into
  // `scratch` when the press selected.
  std::span<const int32_t> attended_positions(int q_head, std::vector<int32_t>& scratch) const {
    const int group = n_heads / static_cast<int>(cache->heads.size());
    const HeadCache& head = cache->heads[static_cast<size_t>(q_head / group)];
    if (selections == nullptr) return head.positions();
    scratch.clear();
    for (int32_t e : selections[q_head])
      scratch.push_back(head.positions()[static_cast<size_t>(e)]);
    return scratch;
  }
  // All query heads of KV head `kv` attended every entry: their weights as [group, size] rows.
  const float* group_probs(int kv, int group) const {
    return probs_data == nullptr || selections != nullptr
               ? nullptr
               : probs_data + static_cast<int64_t>(kv) * group * probs_stride;
  }

  // Set by the engine.
  const float* probs_data = nullptr;
  int64_t probs_stride = 0;
  const std::vector<int32_t>* selections = nullptr;  // [n_heads], when the press selected
};

class Press {
 public:
  virtual ~Press() = default;
  virtual std::string name() const = 0;
  // Every option with its resolved value (recorded in --json output).
  virtual nlohmann::json config() const = 0;

  // Before prefill of a sequence. Throws Error for a budget the method cannot honour (e.g.
  // smaller than its window + sinks). `budget` is already validated.
  virtual void begin(const SequenceInfo& info, const Budget& budget) = 0;

  // Writes the entries to keep for this layer into `out` (its heads are empty on entry). A head
  // may release the keys of a range of entries and read them from a lower layer of the same
  // sequence (HeadCache::share_keys, PoD). Only called when the resolved budget is smaller than
  // the prompt.
  virtual void compress_prefill(const LayerView& layer, LayerCache& out) = 0;

  // Once per layer of every decode step, after that layer's attention (and for each row that
  // append() feeds after a compressed prefill). The one decode hook: observers get the same step.
  virtual void on_decode(const DecodeStep& /*step*/) {}
  // Whether on_decode needs step.probs (the attention kernel then writes them; no recomputation).
  virtual bool wants_decode_probabilities() const { return false; }

  // Recall (DESIGN §4): whether decode attention at `layer` attends a selection of the cached
  // entries (select()) instead of all of them. False by default: dense attention.
  virtual bool selects(int /*layer*/) const { return false; }
  // The entries of `head` (cache indices) that query head `q_head` attends at this decode step,
  // written to `out` (any order, no repeats). q: that head's post-RoPE query [head_dim]. Called
  // before the layer's attention, concurrently for different query heads (of one KV head too:
  // decode cuts a group across threads when there are fewer KV heads than threads).
  virtual void select(int /*layer*/, int /*q_head*/, const float* /*q*/, const HeadCache& /*head*/,
                      std::vector<int32_t>& /*out*/) {}

  // Merged entries (DESIGN §4, Chelsea Eq. 2): an entry with log-weight > 0 stands for several
  // tokens; the cache stores it under one of their positions (chelsea: the B token's). This gives
  // the token positions entry `entry` of (layer, kv_head) stands for, ascending, when it is a
  // merged entry, and an empty span for an ordinary entry (it stands for its own position only).
  // Valid after that layer's compress_prefill or on_decode, until the cache changes. Kept on the
  // press rather than in the cache: only a merging press pays for the member lists, and only
  // metrics (top-B recall) read them; attention needs the log-weight alone.
  virtual std::span<const int32_t> merged_positions(int /*layer*/, int /*kv_head*/,
                                                    int64_t /*entry*/) const {
    return {};
  }
};

}  // namespace protokv
