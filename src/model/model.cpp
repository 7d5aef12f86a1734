// SPDX-License-Identifier: Apache-2.0
#include "protokv/model.h"
#include "protokv/limits.h"

#include <algorithm>
#include <cmath>

#include "model/tensor_table.h"
#include "protokv/error.h"

namespace protokv {

void ModelConfig::validate() const {
  using limits::kMaxContext, limits::kMaxLayers, limits::kMaxVocab;
  constexpr int kMaxDim = limits::kMaxModelDim;
  PROTOKV_CHECK(dim > 0 && dim <= kMaxDim, "invalid embedding length {} (1 to {})", dim, kMaxDim);
  PROTOKV_CHECK(hidden_dim > 0 && hidden_dim <= 8 * kMaxDim,
                "invalid feed-forward length {} (1 to {})", hidden_dim, 8 * kMaxDim);
  PROTOKV_CHECK(n_layers > 0 && n_layers <= kMaxLayers, "invalid layer count {} (1 to {})",
                n_layers, kMaxLayers);
  PROTOKV_CHECK(n_heads > 0 && n_heads <= dim, "invalid head count {} for embedding length {}",
                n_heads, dim);
  PROTOKV_CHECK(explicit_head_dim > 0 || dim % n_heads == 0,
                "head count {} does not divide embedding length {}", n_heads, dim);
  PROTOKV_CHECK(explicit_head_dim >= 0 && explicit_head_dim <= kMaxDim,
                "invalid head dimension (key length) {} (at most {})", explicit_head_dim, kMaxDim);
  PROTOKV_CHECK(n_kv_heads > 0 && n_kv_heads <= n_heads && n_heads % n_kv_heads == 0,
                "invalid KV head count {} for {} heads", n_kv_heads, n_heads);
  PROTOKV_CHECK(head_dim() % 2 == 0, "head dimension {} must be even for RoPE", head_dim());
  PROTOKV_CHECK(n_rot >= 0 && n_rot <= head_dim() && n_rot % 2 == 0,
                "invalid RoPE dimension count {}: must be even and at most the head dimension {}",
                n_rot, head_dim());
  PROTOKV_CHECK(rope_linear_factor >= 1.0f / 1024 && rope_linear_factor <= 1024.0f,
                "invalid linear RoPE scaling factor {}", rope_linear_factor);
  PROTOKV_CHECK(vocab_size > 0 && vocab_size <= kMaxVocab, "invalid vocabulary size {} (1 to {})",
                vocab_size, kMaxVocab);
  PROTOKV_CHECK(context_length > 0 && context_length <= kMaxContext,
                "invalid context length {} (1 to {})", context_length, kMaxContext);
  PROTOKV_CHECK(rope_theta > 0.0f, "invalid RoPE base {}", rope_theta);
  PROTOKV_CHECK(norm_eps > 0.0f && norm_eps < 1.0f, "invalid RMS norm epsilon {}", norm_eps);
  PROTOKV_CHECK(local_layers.empty() || static_cast<int>(local_layers.size()) == n_layers,
                "sliding-window layer pattern has {} entries for {} layers", local_layers.size(),
                n_layers);
  PROTOKV_CHECK(!has_local_layers() || (sliding_window > 0 && sliding_window <= kMaxContext),
                "invalid sliding window {} for a model with sliding-window layers", sliding_window);
  PROTOKV_CHECK(rope_theta_local > 0.0f, "invalid local-layer RoPE base {}", rope_theta_local);
  PROTOKV_CHECK(std::isfinite(embedding_scale) && embedding_scale > 0.0f,
                "invalid embedding scale {}", embedding_scale);
  PROTOKV_CHECK(std::isfinite(final_logit_softcap) && final_logit_softcap >= 0.0f,
                "invalid final logit soft-capping {}", final_logit_softcap);
  PROTOKV_CHECK(std::isfinite(attention_scale) && attention_scale >= 0.0f,
                "invalid attention scale {}", attention_scale);
}

bool ModelConfig::has_local_layers() const {
  for (uint8_t local : local_layers)
    if (local != 0) return true;
  return false;
}

size_t ModelWeights::weight_bytes() const {
  size_t total = 0;
  for_each_tensor(config, *this, [&](const TensorSlot<const ModelWeights>& t) {
    if (t.present()) total += t.view().bytes();
  });
  return total;
}

int64_t ModelWeights::parameter_count() const {
  int64_t total = 0;
  for_each_tensor(config, *this, [&](const TensorSlot<const ModelWeights>& t) {
    if (t.present()) total += t.spec.rows * t.spec.cols;
  });
  return total;
}

namespace {

// Entries (per KV head) that a full cache holds over all layers for `tokens` positions: every
// global layer all of them, a sliding-window layer at most its window.
uint64_t full_cache_entries(const ModelConfig& config, int64_t tokens) {
  uint64_t total = 0;
  for (int l = 0; l < config.n_layers; ++l) {
    const int64_t held = config.is_local_layer(l) && config.sliding_window > 0
                             ? std::min<int64_t>(tokens, config.sliding_window)
                             : tokens;
    total += static_cast<uint64_t>(std::max<int64_t>(0, held));
  }
  return total;
}

}  // namespace

size_t full_kv_bytes(const ModelConfig& config, int64_t tokens, KvCacheType type) {
  const int d = config.head_dim();
  const auto per_entry = static_cast<size_t>(config.n_kv_heads) *
                         (dtype_row_bytes(type.key, d) + dtype_row_bytes(type.value, d));
  return static_cast<size_t>(full_cache_entries(config, tokens)) * per_entry;
}

uint64_t kv_cache_bytes(const ModelConfig& config, int64_t tokens, KvCacheType type) {
  // Per entry and KV head, besides the key and value rows: a position (int32) and a log-weight.
  const uint64_t meta_bytes = (sizeof(int32_t) + sizeof(float)) * config.n_kv_heads;
  return full_kv_bytes(config, tokens, type) + full_cache_entries(config, tokens) * meta_bytes;
}

}  // namespace protokv
