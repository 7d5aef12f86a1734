// SPDX-License-Identifier: Apache-2.0
#include "protokv/press/scores.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>

namespace protokv::press {

void LayerScores::reset(int heads, int64_t prefix, bool with_tie, bool with_group) {
  n_kv_heads = heads;
  n_prefix = prefix;
  const auto size = static_cast<size_t>(static_cast<int64_t>(heads) * prefix);
  score.assign(size, 0.0f);
  tie.assign(with_tie ? size : 0, 0.0f);
  group.assign(with_group ? size : 0, 0);
}

void LayerScores::sanitise() {
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  for (float& s : score)
    if (std::isnan(s)) s = kLowest;
  for (float& s : tie)
    if (std::isnan(s)) s = kLowest;
}

bool LayerScores::ranks_before(int h, int64_t i, int64_t j) const {
  const int64_t base = static_cast<int64_t>(h) * n_prefix;
  const float si = score[static_cast<size_t>(base + i)], sj = score[static_cast<size_t>(base + j)];
  if (si != sj) return si > sj;
  if (!group.empty()) {
    const int32_t gi = group[static_cast<size_t>(base + i)],
                  gj = group[static_cast<size_t>(base + j)];
    if (gi != gj) return gi < gj;
  }
  if (!tie.empty()) {
    const float ti = tie[static_cast<size_t>(base + i)], tj = tie[static_cast<size_t>(base + j)];
    if (ti != tj) return ti > tj;
  }
  return i < j;
}

namespace {

// A float's bits mapped so that unsigned order is descending float order (-0 taken as +0, which
// compares equal to it): ranking on one integer instead of a comparator that reads two arrays.
uint32_t descending_key(float x) {
  x += 0.0f;  // -0 -> +0
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return ~ascending;
}

}  // namespace

std::vector<int32_t> select_top(const LayerScores& scores, int h, int64_t count) {
  const int64_t n = scores.n_prefix;
  count = std::clamp<int64_t>(count, 0, n);
  std::vector<int32_t> order;
  if (count < n && scores.group.empty()) {
    // ranks_before's order (score, then tie score, both descending, then lower index) as one
    // 64-bit key and the index: the same set, selected over contiguous entries.
    struct Ranked {
      uint64_t key;
      int32_t index;
    };
    thread_local std::vector<Ranked> ranked;
    ranked.resize(static_cast<size_t>(n));
    const int64_t base = static_cast<int64_t>(h) * n;
    const float* score = scores.score.data() + base;
    const float* tie = scores.tie.empty() ? nullptr : scores.tie.data() + base;
    for (int64_t i = 0; i < n; ++i)
      ranked[static_cast<size_t>(i)] = {static_cast<uint64_t>(descending_key(score[i])) << 32 |
                                            (tie != nullptr ? descending_key(tie[i]) : 0u),
                                        static_cast<int32_t>(i)};
    std::nth_element(ranked.begin(), ranked.begin() + count, ranked.end(),
                     [](const Ranked& a, const Ranked& b) {
                       return a.key != b.key ? a.key < b.key : a.index < b.index;
                     });
    order.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) order.push_back(ranked[static_cast<size_t>(i)].index);
  } else {
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    if (count < n) {
      std::nth_element(order.begin(), order.begin() + count, order.end(),
                       [&](int32_t a, int32_t b) { return scores.ranks_before(h, a, b); });
      order.resize(static_cast<size_t>(count));
    }
  }
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> keep_with_window(const LayerView& layer, int h,
                                      std::vector<int32_t> prefix_kept, int64_t window,
                                      HeadCache& out) {
  const int64_t n = layer.n_tokens;
  for (int64_t j = n - window; j < n; ++j) prefix_kept.push_back(static_cast<int32_t>(j));
  out.assign_rows(layer.k_head(h), layer.v_head(h), layer.positions, prefix_kept);
  return prefix_kept;
}

}  // namespace protokv::press
