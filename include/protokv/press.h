#pragma once
// Press interface (docs/DESIGN.md §5): a KV-cache compression method. The engine calls it inside
// prefill, right after each layer's attention, with that layer's full post-RoPE tensors, and during
// decode after each new token's K/V are appended. A press never calls the model; the engine never
// names a concrete press (they are created by name through the registry, press/registry.h).
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "protokv/kv_cache.h"

namespace protokv {

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

class Press {
 public:
  virtual ~Press() = default;
  virtual std::string name() const = 0;
  // Every option with its resolved value (recorded in --json output).
  virtual nlohmann::json config() const = 0;

  // Before prefill of a sequence. Throws Error for a budget the method cannot honour (e.g.
  // smaller than its window + sinks). `budget` is already validated.
  virtual void begin(const SequenceInfo& info, const Budget& budget) = 0;

  // Writes the entries to keep for this layer into `out` (its heads are empty on entry).
  // Only called when the resolved budget is smaller than the prompt.
  virtual void compress_prefill(const LayerView& layer, LayerCache& out) = 0;

  // After a decode step appended the new token's K/V to every head of `cache`.
  // q: [n_heads, head_dim] post-RoPE query of the new token.
  virtual void on_decode(int /*layer*/, const float* /*q*/, int32_t /*position*/,
                         LayerCache& /*cache*/) {}
};

}  // namespace protokv
