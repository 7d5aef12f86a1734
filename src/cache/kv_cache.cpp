// SPDX-License-Identifier: Apache-2.0
#include "protokv/kv_cache.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "protokv/error.h"

namespace protokv {
namespace {

// llama.cpp's usual -ctk/-ctv values (common/arg.cpp kv_cache_types lists also q4_1, q5_0, q5_1
// and iq4_nl): the plain types and the two 32-value block types protokv has quantisers for.
constexpr std::array kCacheTypes = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};

size_t row_bytes_of(DType type, int head_dim) {
  return head_dim > 0 ? dtype_row_bytes(type, head_dim) : 0;
}

// `count` stored rows of `type` as F32: in place for F32, else dequantised (and rotated back)
// into `scratch`.
const float* rows_as_f32(DType type, int rotation, const uint8_t* rows, int64_t count, int head_dim,
                         std::vector<float>& scratch) {
  if (type == DType::F32) return reinterpret_cast<const float*>(rows);
  scratch.resize(static_cast<size_t>(count * head_dim));
  if (count > 0) dequantize_row(type, rows, scratch.data(), count * head_dim);
  hadamard_rows(scratch.data(), count, head_dim, rotation);
  return scratch.data();
}

// The rotation width of rows of `type` in a head of `head_dim` with slices of `width` (0 for
// none): the quantised types only, and only heads divisible by 64, as llama.cpp.
int rotation_width(const KvCacheType& cache, DType type, int head_dim, int width) {
  if (!cache.hadamard || dtype_block_size(type) == 1 || head_dim <= 0 || head_dim % 64 != 0)
    return 0;
  return width;
}

// Quantises a row through a rotated copy (the calling thread's scratch) when rotation is set.
void store_row(DType type, int rotation, const float* row, uint8_t* out, int head_dim) {
  if (rotation == 0) {
    quantize_row(type, row, out, head_dim);
    return;
  }
  thread_local std::vector<float> rotated;
  rotated.assign(row, row + head_dim);
  hadamard_rows(rotated.data(), 1, head_dim, rotation);
  quantize_row(type, rotated.data(), out, head_dim);
}

}  // namespace

std::string kv_cache_type_names() {
  std::array<std::string_view, kCacheTypes.size()> names;
  std::transform(kCacheTypes.begin(), kCacheTypes.end(), names.begin(), dtype_name);
  return fmt::format("{}", fmt::join(names, ", "));
}

DType kv_cache_type_from_name(std::string_view name) {
  for (const DType type : kCacheTypes)
    if (dtype_name(type) == name) return type;
  fail("unknown KV cache type '{}' (types: {})", name, kv_cache_type_names());
}

void check_kv_cache_type(DType type, int head_dim, std::string_view what) {
  if (std::find(kCacheTypes.begin(), kCacheTypes.end(), type) == kCacheTypes.end())
    fail("{}: {} is not a KV cache type (types: {})", what, dtype_name(type),
         kv_cache_type_names());
  const int64_t block = dtype_block_size(type);
  if (head_dim % block != 0)
    fail("{}: {} stores blocks of {} values, which do not divide this model's head width of {}",
         what, dtype_name(type), block, head_dim);
}

int key_rotation_width(const KvCacheType& type, int head_dim) {
  if (head_dim <= 0) return 0;
  int width = 64;  // llama.cpp's build_input_k_rot: the largest power of two dividing the width
  while (head_dim % (2 * width) == 0) width *= 2;
  return rotation_width(type, type.key, head_dim, width);
}

int value_rotation_width(const KvCacheType& type, int head_dim) {
  return rotation_width(type, type.value, head_dim, 64);  // llama.cpp's build_input_v_rot
}

void hadamard_rows(float* rows, int64_t n_rows, int head_dim, int width) {
  if (width == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(width));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int begin = 0; begin < head_dim; begin += width) {
      float* x = rows + r * head_dim + begin;
      // The fast Walsh-Hadamard transform in Sylvester (natural) order: y_i = sum_j (-1)^
      // popcount(i & j) x_j, the unscaled matrix llama.cpp builds.
      for (int half = 1; half < width; half *= 2)
        for (int block = 0; block < width; block += 2 * half)
          for (int i = block; i < block + half; ++i) {
            const float a = x[i], b = x[i + half];
            x[i] = a + b;
            x[i + half] = a - b;
          }
      for (int i = 0; i < width; ++i) x[i] *= scale;
    }
  }
}

void round_trip_to_cache_type(DType type, int rotation, float* rows, int64_t n_rows, int head_dim) {
  if (type == DType::F32 || n_rows <= 0) return;
  std::vector<uint8_t> stored(dtype_row_bytes(type, head_dim));
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = rows + r * head_dim;
    store_row(type, rotation, row, stored.data(), head_dim);
    dequantize_row(type, stored.data(), row, head_dim);
    hadamard_rows(row, 1, head_dim, rotation);
  }
}

HeadCache::HeadCache(int head_dim, KvCacheType type)
    : head_dim_(head_dim),
      type_(type),
      key_rotation_(key_rotation_width(type, head_dim)),
      value_rotation_(value_rotation_width(type, head_dim)),
      key_row_bytes_(row_bytes_of(type.key, head_dim)),
      value_row_bytes_(row_bytes_of(type.value, head_dim)) {}

void HeadCache::reserve(int64_t n) {
  // Shared entries hold no key: reserving them would bring the released memory back.
  const int64_t key_rows = std::max<int64_t>(0, n - (shared_end_ - shared_begin_) + dead_key_rows_);
  keys_.reserve(static_cast<size_t>(key_rows) * key_row_bytes_);
  values_.reserve(static_cast<size_t>(n) * value_row_bytes_);
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

const uint8_t* HeadCache::checked_key_rows(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > size())
    fail("kv cache: cannot read keys [{}, {}) of {}", begin, begin + count, size());
  // Rows on one side of the shared range are consecutive in keys_.
  if (count > 0 && shares_keys() && begin < shared_end_ && begin + count > shared_begin_)
    fail("kv cache: keys [{}, {}) include shared ones [{}, {})", begin, begin + count,
         shared_begin_, shared_end_);
  return keys_.data() + static_cast<size_t>(key_row(begin)) * key_row_bytes_;
}

const uint8_t* HeadCache::checked_value_rows(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > size())
    fail("kv cache: cannot read values [{}, {}) of {}", begin, begin + count, size());
  return values_.data() + static_cast<size_t>(begin) * value_row_bytes_;
}

void HeadCache::read_keys(int64_t begin, int64_t count, float* out) const {
  const uint8_t* rows = checked_key_rows(begin, count);
  if (count > 0) dequantize_row(type_.key, rows, out, count * head_dim_);
  hadamard_rows(out, count, head_dim_, key_rotation_);
}

void HeadCache::read_values(int64_t begin, int64_t count, float* out) const {
  const uint8_t* rows = checked_value_rows(begin, count);
  if (count > 0) dequantize_row(type_.value, rows, out, count * head_dim_);
  hadamard_rows(out, count, head_dim_, value_rotation_);
}

const float* HeadCache::keys_as_f32(int64_t begin, int64_t count,
                                    std::vector<float>& scratch) const {
  return rows_as_f32(type_.key, key_rotation_, checked_key_rows(begin, count), count, head_dim_,
                     scratch);
}

const float* HeadCache::values_as_f32(int64_t begin, int64_t count,
                                      std::vector<float>& scratch) const {
  return rows_as_f32(type_.value, value_rotation_, checked_value_rows(begin, count), count,
                     head_dim_, scratch);
}

void HeadCache::store_key(const float* key, uint8_t* out) const {
  store_row(type_.key, key_rotation_, key, out, head_dim_);
}

void HeadCache::store_value(const float* value, uint8_t* out) const {
  store_row(type_.value, value_rotation_, value, out, head_dim_);
}

std::vector<float> HeadCache::key_floats(int64_t i) const {
  std::vector<float> out(static_cast<size_t>(head_dim_));
  read_keys(i, 1, out.data());
  return out;
}

std::vector<float> HeadCache::value_floats(int64_t i) const {
  std::vector<float> out(static_cast<size_t>(head_dim_));
  read_values(i, 1, out.data());
  return out;
}

void HeadCache::write_key(int64_t i, const float* key) {
  if (i < 0 || i >= size() || key_is_shared(i))
    fail("kv cache: cannot write key {} of {}", i, size());
  store_key(key, keys_.data() + static_cast<size_t>(key_row(i)) * key_row_bytes_);
}

void HeadCache::write_value(int64_t i, const float* value) {
  if (i < 0 || i >= size()) fail("kv cache: cannot write value {} of {}", i, size());
  store_value(value, values_.data() + static_cast<size_t>(i) * value_row_bytes_);
}

void HeadCache::append(const float* key, const float* value, int32_t position, float log_weight) {
  keys_.resize(keys_.size() + key_row_bytes_);
  store_key(key, keys_.data() + keys_.size() - key_row_bytes_);
  values_.resize(values_.size() + value_row_bytes_);
  store_value(value, values_.data() + values_.size() - value_row_bytes_);
  positions_.push_back(position);
  log_weights_.push_back(log_weight);
  any_log_weight_ = any_log_weight_ || log_weight != 0.0f;
}

void HeadCache::assign_rows(const float* keys, const float* values, const int32_t* positions,
                            std::span<const int32_t> indices) {
  const size_t n = indices.size();
  const size_t d = static_cast<size_t>(head_dim_);
  std::vector<uint8_t> new_keys(n * key_row_bytes_), new_values(n * value_row_bytes_);
  std::vector<int32_t> new_positions(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t src = static_cast<size_t>(indices[i]);
    store_key(keys + src * d, new_keys.data() + i * key_row_bytes_);
    store_value(values + src * d, new_values.data() + i * value_row_bytes_);
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
  const size_t kb = key_row_bytes_, vb = value_row_bytes_;
  std::vector<uint8_t> new_keys(n * kb), new_values(n * vb);
  std::vector<float> new_log_weights(n);
  std::vector<int32_t> new_positions(n);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const size_t src = static_cast<size_t>(indices[i]);
    std::memcpy(new_keys.data() + i * kb, keys_.data() + src * kb, kb);
    std::memcpy(new_values.data() + i * vb, values_.data() + src * vb, vb);
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
  // Through copies of the range: rows of a cycle would otherwise overwrite each other.
  auto permute_rows = [&](std::vector<uint8_t>& rows, size_t row_bytes) {
    if (count == 0) return;
    uint8_t* first = rows.data() + static_cast<size_t>(begin) * row_bytes;
    const std::vector<uint8_t> old(first, first + order.size() * row_bytes);
    for (size_t i = 0; i < order.size(); ++i)
      std::memcpy(first + i * row_bytes, old.data() + static_cast<size_t>(order[i]) * row_bytes,
                  row_bytes);
  };
  permute_rows(keys_, key_row_bytes_);
  permute_rows(values_, value_row_bytes_);
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
  const size_t kb = key_row_bytes_, vb = value_row_bytes_;
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const auto src = static_cast<size_t>(kept[i]);
    if (src != i) {  // src > i (ascending): rows i and src do not overlap
      std::memcpy(keys_.data() + i * kb, keys_.data() + src * kb, kb);
      std::memcpy(values_.data() + i * vb, values_.data() + src * vb, vb);
      positions_[i] = positions_[src];
      log_weights_[i] = log_weights_[src];
    }
    any = any || log_weights_[i] != 0.0f;
  }
  keys_.resize(n * kb);
  values_.resize(n * vb);
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
  const auto kb = static_cast<int64_t>(key_row_bytes_);
  std::vector<uint8_t> held(keys_.size() - static_cast<size_t>((end - begin) * kb));
  std::copy(keys_.begin(), keys_.begin() + begin * kb, held.begin());
  std::copy(keys_.begin() + end * kb, keys_.end(), held.begin() + begin * kb);
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
  const int64_t held = key_rows_held() - dead_key_rows_;
  if (dead_key_rows_ < std::max<int64_t>(64, held / 8)) return;
  const auto kb = static_cast<int64_t>(key_row_bytes_);
  const auto first = keys_.begin() + shared_begin_ * kb;
  keys_.erase(first, first + dead_key_rows_ * kb);
  dead_key_rows_ = 0;
}

int HeadCache::key_segments(const HeadCache& lender, std::array<KeySegment, 3>& out,
                            const float* lender_query) const {
  int count = 0;
  const auto kb = static_cast<int64_t>(key_row_bytes_);
  if (!shares_keys()) {
    if (!empty()) out[count++] = {keys_.data(), size(), nullptr, type_.key};
    return count;
  }
  if (lender.shares_keys() || lender.size() < shared_end_ || lender.head_dim_ != head_dim_ ||
      lender.type_.key != type_.key || lender.key_rotation_ != key_rotation_)
    fail("kv cache: layer {} cannot lend keys [{}, {}) (it holds {} entries{})", key_lender_,
         shared_begin_, shared_end_, lender.size(),
         lender.shares_keys() ? " and shares keys itself" : "");
  if (shared_begin_ > 0) out[count++] = {keys_.data(), shared_begin_, nullptr, type_.key};
  out[count++] = {lender.keys_.data() + shared_begin_ * kb, shared_end_ - shared_begin_,
                  lender_query_ ? lender_query : nullptr, type_.key};
  if (size() > shared_end_)
    out[count++] = {keys_.data() + (shared_begin_ + dead_key_rows_) * kb, size() - shared_end_,
                    nullptr, type_.key};
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
  refit(keys_, static_cast<size_t>(rows) * key_row_bytes_);
  refit(values_, static_cast<size_t>(rows) * value_row_bytes_);
  refit(positions_, static_cast<size_t>(rows));
  refit(log_weights_, static_cast<size_t>(rows));
}

size_t HeadCache::kv_bytes() const {
  return keys_.size() + values_.size();
}
size_t HeadCache::meta_bytes() const {
  return positions_.size() * sizeof(int32_t) + log_weights_.size() * sizeof(float);
}
size_t HeadCache::capacity_bytes() const {
  return keys_.capacity() + values_.capacity() + log_weights_.capacity() * sizeof(float) +
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

KvCache::KvCache(int n_layers, int n_kv_heads, int head_dim, KvCacheType type)
    : head_dim_(head_dim), type_(type) {
  check_kv_cache_type(type.key, head_dim, "--cache-type-k");
  check_kv_cache_type(type.value, head_dim, "--cache-type-v");
  layers_.resize(static_cast<size_t>(n_layers));
  for (auto& layer : layers_)
    layer.heads.assign(static_cast<size_t>(n_kv_heads), HeadCache(head_dim, type));
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
