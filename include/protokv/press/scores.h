// SPDX-License-Identifier: Apache-2.0
#pragma once
// Per-layer scores that a scorer hands to the allocator and the selector, and the selector itself
// (DESIGN §5: scorer -> allocator -> selector).
#include <cstdint>
#include <span>
#include <vector>

#include "protokv/kv_cache.h"
#include "protokv/press.h"

namespace protokv::press {

// Per-head loops run in parallel only when a layer's tensors hold at least this many floats:
// below it, waking threads costs more than the work (and a tiny model's prefill must not stall
// on a loaded machine).
constexpr int64_t kParallelMinElements = int64_t{1} << 18;

inline bool worth_parallel(const LayerView& layer) {
  return layer.n_tokens * layer.n_heads * layer.head_dim >= kParallelMinElements;
}

// Scores of the prefix entries [0, n_prefix) of every KV head of one layer. Higher = keep first.
// Entries are ranked by (score desc, group asc, tie desc, index asc): `group` keeps a cluster's
// members together when clusters are selected whole; `tie` breaks equal scores (e.g. ProtoKV's
// cluster-mean scores by the token's own score); the lower index wins what remains.
struct LayerScores {
  int n_kv_heads = 0;
  int64_t n_prefix = 0;
  std::vector<float> score;    // [n_kv_heads, n_prefix]
  std::vector<float> tie;      // [n_kv_heads, n_prefix], or empty
  std::vector<int32_t> group;  // [n_kv_heads, n_prefix], or empty

  void reset(int heads, int64_t prefix, bool with_tie, bool with_group);
  float* head_score(int h) { return score.data() + static_cast<int64_t>(h) * n_prefix; }
  const float* head_score(int h) const { return score.data() + static_cast<int64_t>(h) * n_prefix; }
  float* head_tie(int h) { return tie.data() + static_cast<int64_t>(h) * n_prefix; }
  int32_t* head_group(int h) { return group.data() + static_cast<int64_t>(h) * n_prefix; }
  // Replaces NaN by -inf so that ranking is a strict weak order whatever the input.
  void sanitise();
  // True when entry i of head h ranks before entry j of head h.
  bool ranks_before(int h, int64_t i, int64_t j) const;
};

// The `count` best prefix entries of head h, in ascending index order.
std::vector<int32_t> select_top(const LayerScores& scores, int h, int64_t count);

// Writes prefix entries `prefix_kept` (ascending) followed by the last `window` tokens of KV head
// h of `layer` into `out`. Returns the kept token indices.
std::vector<int32_t> keep_with_window(const LayerView& layer, int h,
                                      std::vector<int32_t> prefix_kept, int64_t window,
                                      HeadCache& out);

}  // namespace protokv::press
