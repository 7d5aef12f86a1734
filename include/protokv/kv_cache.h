#pragma once
// KV cache (docs/DESIGN.md §4): per layer, per KV head, ragged. Each head holds its own entries:
// post-RoPE keys, values, the original token position and a log-weight added to the attention logit
// (0 for an ordinary entry, log(#merged tokens) for a merged one, Chelsea Eq. 2). Storage is F32.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace protokv {

class HeadCache {
 public:
  explicit HeadCache(int head_dim = 0) : head_dim_(head_dim) {}

  int head_dim() const { return head_dim_; }
  int64_t size() const { return static_cast<int64_t>(positions_.size()); }
  bool empty() const { return positions_.empty(); }

  const float* key(int64_t i) const { return keys_.data() + i * head_dim_; }
  const float* value(int64_t i) const { return values_.data() + i * head_dim_; }
  float* mutable_key(int64_t i) { return keys_.data() + i * head_dim_; }
  float* mutable_value(int64_t i) { return values_.data() + i * head_dim_; }
  const float* keys() const { return keys_.data(); }      // [size, head_dim]
  const float* values() const { return values_.data(); }  // [size, head_dim]
  std::span<const int32_t> positions() const { return positions_; }
  std::span<const float> log_weights() const { return log_weights_; }
  bool has_log_weights() const { return any_log_weight_; }

  void reserve(int64_t n);
  void clear();
  void append(const float* key, const float* value, int32_t position, float log_weight = 0.0f);
  // Replaces the content by rows `indices` (into `keys`/`values`, both [*, head_dim]) of a
  // full-layer tensor, in the given order, then releases unused capacity.
  void assign_rows(const float* keys, const float* values, const int32_t* positions,
                   std::span<const int32_t> indices);
  // Keeps only entries `indices` of this cache (in that order) and releases memory.
  void keep(std::span<const int32_t> indices);
  void set_log_weight(int64_t i, float log_weight);
  void release_unused();

  size_t kv_bytes() const;    // keys + values actually held (size * head_dim * 2 * 4)
  size_t meta_bytes() const;  // positions + log-weights
  size_t capacity_bytes() const;

 private:
  int head_dim_;
  std::vector<float> keys_;    // [size, head_dim]
  std::vector<float> values_;  // [size, head_dim]
  std::vector<int32_t> positions_;
  std::vector<float> log_weights_;
  bool any_log_weight_ = false;
};

struct LayerCache {
  std::vector<HeadCache> heads;  // [n_kv_heads]
  size_t kv_bytes() const;
  size_t meta_bytes() const;
};

class KvCache {
 public:
  KvCache() = default;
  KvCache(int n_layers, int n_kv_heads, int head_dim);

  int n_layers() const { return static_cast<int>(layers_.size()); }
  int n_kv_heads() const { return layers_.empty() ? 0 : static_cast<int>(layers_[0].heads.size()); }
  int head_dim() const { return head_dim_; }
  LayerCache& layer(int l) { return layers_[l]; }
  const LayerCache& layer(int l) const { return layers_[l]; }
  void clear();

  size_t kv_bytes() const;    // exact bytes of keys + values held, all layers and heads
  size_t meta_bytes() const;  // positions and log-weights
  int64_t total_entries() const;

 private:
  int head_dim_ = 0;
  std::vector<LayerCache> layers_;
};

}  // namespace protokv
