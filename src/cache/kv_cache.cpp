#include "protokv/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace protokv {

void HeadCache::reserve(int64_t n) {
  keys_.reserve(static_cast<size_t>(n * head_dim_));
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
}

void HeadCache::keep(std::span<const int32_t> indices) {
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

void HeadCache::set_log_weight(int64_t i, float log_weight) {
  log_weights_[static_cast<size_t>(i)] = log_weight;
  any_log_weight_ = any_log_weight_ || log_weight != 0.0f;
}

void HeadCache::release_unused() {
  keys_.shrink_to_fit();
  values_.shrink_to_fit();
  positions_.shrink_to_fit();
  log_weights_.shrink_to_fit();
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
