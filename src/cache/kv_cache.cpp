// SPDX-License-Identifier: Apache-2.0
#include "protokv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "protokv/error.h"

namespace protokv {

void HeadCache::reserve(int64_t n) {
  // Shared entries hold no key: reserving them would bring the released memory back.
  const int64_t key_rows = std::max<int64_t>(0, n - (shared_end_ - shared_begin_) + dead_key_rows_);
  keys_.reserve(static_cast<size_t>(key_rows * head_dim_));
  values_.reserve(static_cast<size_t>(n * head_dim_));
  positions_.reserve(static_cast<size_t>(n));
  log_weights_.reserve(static_cast<size_t>(n));
}

void HeadCache::clear() {
  keys_.clear();
  values_.clear();
  positions_.clear();
  log_weights_.clear();
  any_log_weight_ = false;
  reset_sharing();
}

void HeadCache::reset_sharing() {
  key_lender_ = -1;
  shared_begin_ = shared_end_ = dead_key_rows_ = 0;
  lender_query_ = false;
}

void HeadCache::append(const float* key, const float* value, int32_t position, float log_weight) {
  keys_.insert(keys_.end(), key, key + head_dim_);
  values_.insert(values_.end(), value, value + head_dim_);
  positions_.push_back(position);
  log_weights_.push_back(log_weight);
  any_log_weight_ = any_log_weight_ || log_weight != 0.0f;
}

void HeadCache::assign_rows(const float* keys, const float* values, const int32_t* positions,
                            std::span<const int32_t> indices) {
  const size_t n = indices.size();
  const size_t d = static_cast<size_t>(head_dim_);
  std::vector<float> new_keys(n * d), new_values(n * d);
  std::vector<int32_t> new_positions(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t src = static_cast<size_t>(indices[i]);
    std::memcpy(new_keys.data() + i * d, keys + src * d, d * sizeof(float));
    std::memcpy(new_values.data() + i * d, values + src * d, d * sizeof(float));
    new_positions[i] = positions[src];
  }
  keys_ = std::move(new_keys);
  values_ = std::move(new_values);
  positions_ = std::move(new_positions);
  log_weights_.assign(n, 0.0f);
  log_weights_.shrink_to_fit();
  any_log_weight_ = false;
  reset_sharing();
}

void HeadCache::keep(std::span<const int32_t> indices) {
  if (shares_keys()) fail("kv cache: cannot keep a subset of a head that shares keys");
  const size_t n = indices.size();
  const size_t d = static_cast<size_t>(head_dim_);
  std::vector<float> new_keys(n * d), new_values(n * d), new_log_weights(n);
  std::vector<int32_t> new_positions(n);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const size_t src = static_cast<size_t>(indices[i]);
    std::memcpy(new_keys.data() + i * d, keys_.data() + src * d, d * sizeof(float));
    std::memcpy(new_values.data() + i * d, values_.data() + src * d, d * sizeof(float));
    new_positions[i] = positions_[src];
    new_log_weights[i] = log_weights_[src];
    any = any || new_log_weights[i] != 0.0f;
  }
  keys_ = std::move(new_keys);
  values_ = std::move(new_values);
  positions_ = std::move(new_positions);
  log_weights_ = std::move(new_log_weights);
  any_log_weight_ = any;
}

void HeadCache::reorder(int64_t begin, std::span<const int32_t> order) {
  if (shares_keys()) fail("kv cache: cannot reorder the entries of a head that shares keys");
  const auto count = static_cast<int64_t>(order.size());
  if (begin < 0 || begin + count > size())
    fail("kv cache: cannot reorder entries [{}, {}) of {}", begin, begin + count, size());
  std::vector<char> seen(order.size(), 0);
  for (const int32_t i : order) {
    if (i < 0 || i >= count || seen[static_cast<size_t>(i)] != 0)
      fail("kv cache: reorder needs a permutation of 0..{}, got {}", count - 1, i);
    seen[static_cast<size_t>(i)] = 1;
  }
  const size_t d = static_cast<size_t>(head_dim_);
  // Through copies of the range: rows of a cycle would otherwise overwrite each other.
  auto permute_rows = [&](std::vector<float>& rows) {
    const auto first = rows.begin() + static_cast<int64_t>(static_cast<size_t>(begin) * d);
    const std::vector<float> old(first, first + static_cast<int64_t>(order.size() * d));
    for (size_t i = 0; i < order.size(); ++i)
      std::memcpy(&*first + i * d, old.data() + static_cast<size_t>(order[i]) * d,
                  d * sizeof(float));
  };
  permute_rows(keys_);
  permute_rows(values_);
  auto permute = [&](auto& items) {
    const auto first = items.begin() + begin;
    const std::vector<typename std::decay_t<decltype(items)>::value_type> old(first, first + count);
    for (size_t i = 0; i < order.size(); ++i)
      first[static_cast<int64_t>(i)] = old[static_cast<size_t>(order[i])];
  };
  permute(positions_);
  permute(log_weights_);
}

void HeadCache::compact(std::span<const int32_t> kept) {
  if (shares_keys() || dead_key_rows_ != 0)
    fail("kv cache: cannot compact a head that shares keys");
  const size_t n = kept.size();
  for (size_t i = 0; i < n; ++i)  // checked first: a rejected call leaves the head as it was
    if (kept[i] < 0 || kept[i] >= static_cast<int64_t>(positions_.size()) ||
        (i > 0 && kept[i] <= kept[i - 1]))
      fail("kv cache: compact needs strictly ascending entries of the head (entry {} at {} of {})",
           kept[i], i, positions_.size());
  const auto d = static_cast<size_t>(head_dim_);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const auto src = static_cast<size_t>(kept[i]);
    if (src != i) {  // src > i (ascending): rows i and src do not overlap
      std::memcpy(keys_.data() + i * d, keys_.data() + src * d, d * sizeof(float));
      std::memcpy(values_.data() + i * d, values_.data() + src * d, d * sizeof(float));
      positions_[i] = positions_[src];
      log_weights_[i] = log_weights_[src];
    }
    any = any || log_weights_[i] != 0.0f;
  }
  keys_.resize(n * d);
  values_.resize(n * d);
  positions_.resize(n);
  log_weights_.resize(n);
  any_log_weight_ = any;
}

int64_t HeadCache::drop_positions_before(int32_t min_position) {
  std::vector<int32_t> kept;
  kept.reserve(positions_.size());
  for (size_t i = 0; i < positions_.size(); ++i)
    if (positions_[i] >= min_position) kept.push_back(static_cast<int32_t>(i));
  const auto dropped = static_cast<int64_t>(positions_.size() - kept.size());
  if (dropped > 0) compact(kept);
  return dropped;
}

void HeadCache::set_log_weight(int64_t i, float log_weight) {
  log_weights_[static_cast<size_t>(i)] = log_weight;
  any_log_weight_ = any_log_weight_ || log_weight != 0.0f;
}

void HeadCache::share_keys(int lender, int64_t begin, int64_t end, bool lender_query) {
  if (shares_keys() || dead_key_rows_ != 0)
    fail("kv cache: the head already shares keys [{}, {})", shared_begin_, shared_end_);
  if (lender < 0 || begin < 0 || begin > end || end > size())
    fail("kv cache: cannot share the keys of entries [{}, {}) of {} from layer {}", begin, end,
         size(), lender);
  if (begin == end) return;
  const size_t d = static_cast<size_t>(head_dim_);
  std::vector<float> held(keys_.size() - static_cast<size_t>(end - begin) * d);
  std::copy(keys_.begin(), keys_.begin() + static_cast<int64_t>(begin * head_dim_), held.begin());
  std::copy(keys_.begin() + static_cast<int64_t>(end * head_dim_), keys_.end(),
            held.begin() + static_cast<int64_t>(begin * head_dim_));
  keys_ = std::move(held);  // a fresh vector: the shared rows' memory is released now
  key_lender_ = lender;
  lender_query_ = lender_query;
  shared_begin_ = begin;
  shared_end_ = end;
}

void HeadCache::extend_shared_keys(int64_t end) {
  if (!shares_keys() || end < shared_end_ || end > size())
    fail("kv cache: cannot extend shared keys [{}, {}) to end at {} of {}", shared_begin_,
         shared_end_, end, size());
  dead_key_rows_ += end - shared_end_;
  shared_end_ = end;
  const int64_t held = static_cast<int64_t>(keys_.size()) / head_dim_ - dead_key_rows_;
  if (dead_key_rows_ < std::max<int64_t>(64, held / 8)) return;
  const auto first = keys_.begin() + static_cast<int64_t>(shared_begin_ * head_dim_);
  keys_.erase(first, first + static_cast<int64_t>(dead_key_rows_ * head_dim_));
  dead_key_rows_ = 0;
}

int HeadCache::key_segments(const HeadCache& lender, std::array<KeySegment, 3>& out,
                            const float* lender_query) const {
  int count = 0;
  const int64_t d = head_dim_;
  if (!shares_keys()) {
    if (!empty()) out[count++] = {keys_.data(), size(), nullptr};
    return count;
  }
  if (lender.shares_keys() || lender.size() < shared_end_ || lender.head_dim_ != head_dim_)
    fail("kv cache: layer {} cannot lend keys [{}, {}) (it holds {} entries{})", key_lender_,
         shared_begin_, shared_end_, lender.size(),
         lender.shares_keys() ? " and shares keys itself" : "");
  if (shared_begin_ > 0) out[count++] = {keys_.data(), shared_begin_, nullptr};
  out[count++] = {lender.keys_.data() + shared_begin_ * d, shared_end_ - shared_begin_,
                  lender_query_ ? lender_query : nullptr};
  if (size() > shared_end_)
    out[count++] = {keys_.data() + (shared_begin_ + dead_key_rows_) * d, size() - shared_end_,
                    nullptr};
  return count;
}

void HeadCache::release_unused() {
  keys_.shrink_to_fit();
  values_.shrink_to_fit();
  positions_.shrink_to_fit();
  log_weights_.shrink_to_fit();
}

void HeadCache::trim_capacity(int64_t rows) {
  if (shares_keys()) fail("kv cache: cannot trim a head that shares keys");
  rows = std::max(rows, size());
  if (static_cast<int64_t>(positions_.capacity()) <= 2 * rows) return;
  auto refit = [](auto& v, size_t n) {
    std::remove_reference_t<decltype(v)> fitted;
    fitted.reserve(n);
    fitted.assign(v.begin(), v.end());
    v.swap(fitted);
  };
  const auto d = static_cast<size_t>(head_dim_);
  refit(keys_, static_cast<size_t>(rows) * d);
  refit(values_, static_cast<size_t>(rows) * d);
  refit(positions_, static_cast<size_t>(rows));
  refit(log_weights_, static_cast<size_t>(rows));
}

size_t HeadCache::kv_bytes() const {
  return (keys_.size() + values_.size()) * sizeof(float);
}
size_t HeadCache::meta_bytes() const {
  return positions_.size() * sizeof(int32_t) + log_weights_.size() * sizeof(float);
}
size_t HeadCache::capacity_bytes() const {
  return (keys_.capacity() + values_.capacity() + log_weights_.capacity()) * sizeof(float) +
         positions_.capacity() * sizeof(int32_t);
}

size_t LayerCache::kv_bytes() const {
  size_t total = 0;
  for (const auto& h : heads) total += h.kv_bytes();
  return total;
}
size_t LayerCache::meta_bytes() const {
  size_t total = 0;
  for (const auto& h : heads) total += h.meta_bytes();
  return total;
}

KvCache::KvCache(int n_layers, int n_kv_heads, int head_dim) : head_dim_(head_dim) {
  layers_.resize(static_cast<size_t>(n_layers));
  for (auto& layer : layers_)
    layer.heads.assign(static_cast<size_t>(n_kv_heads), HeadCache(head_dim));
}

void KvCache::clear() {
  for (auto& layer : layers_)
    for (auto& head : layer.heads) {
      head.clear();
      head.release_unused();
    }
}

size_t KvCache::kv_bytes() const {
  size_t total = 0;
  for (const auto& l : layers_) total += l.kv_bytes();
  return total;
}
size_t KvCache::meta_bytes() const {
  size_t total = 0;
  for (const auto& l : layers_) total += l.meta_bytes();
  return total;
}
int64_t KvCache::total_entries() const {
  int64_t total = 0;
  for (const auto& l : layers_)
    for (const auto& h : l.heads) total += h.size();
  return total;
}

}  // namespace protokv
