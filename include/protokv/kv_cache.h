// SPDX-License-Identifier: Apache-2.0
#pragma once
// KV cache (docs/DESIGN.md §4): per layer, per KV head, ragged. Each head holds its own entries:
// post-RoPE keys, values, the original token position and a log-weight added to the attention logit
// (0 for an ordinary entry, log(#merged tokens) for a merged one, Chelsea Eq. 2). Keys and values
// are stored as rows of a KV cache type each (llama.cpp's --cache-type-k / --cache-type-v: f32,
// f16, bf16, q8_0, q4_0; F32 by default): written through the type's quantiser, read back as F32
// (read_keys / read_values) or by the attention kernels from the typed rows directly.
// A head may hold its values for every entry but its keys for some entries only: the keys of a
// range of entries are then read from the same KV head of a lower layer (PoD, DESIGN §5 pod).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <string>
#include <string_view>

#include "protokv/dtype.h"
#include "protokv/key_segment.h"

namespace protokv {

// The storage types of a cache's keys and of its values (llama.cpp's -ctk / -ctv).
//
// `hadamard`: a quantised type (q8_0, q4_0) stores rotated rows, as llama.cpp does by default
// (its attn_rot_k / attn_rot_v, src/llama-kv-cache.cpp; off with LLAMA_ATTN_ROT_DISABLE=1): with a
// head width divisible by 64, a key is stored as Q(H k) with H the orthonormal Walsh-Hadamard
// matrix of the largest power of two (>= 64) dividing the width, applied to each such slice, and
// a value as Q(H v) with 64-wide slices. The rotation spreads a head's outlier channels over all
// of its slice, so a block of 32 no longer spends its levels on one channel (SmolLM2, q4_0 keys:
// perplexity 22.05 unrotated, llama.cpp 19.47 rotated and 22.59 with its rotation off;
// docs/results/kv_cache_types.md). Every reader sees the unrotated rows H Q^-1(stored): float
// reads rotate back, the decode attention rotates its query (q . H k' = (H q) . k') and its output
// (sum p H v' = H sum p v') instead. F32, F16 and BF16 rows are stored as they are.
struct KvCacheType {
  DType key = DType::F32;
  DType value = DType::F32;
  bool hadamard = true;
  bool operator==(const KvCacheType&) const = default;
};
// Width of the Walsh-Hadamard slices of a head's keys / values under `type` (KvCacheType), 0 for
// rows stored unrotated.
int key_rotation_width(const KvCacheType& type, int head_dim);
int value_rotation_width(const KvCacheType& type, int head_dim);
// Multiplies each `width`-value slice of each of `n_rows` rows [head_dim] by the orthonormal
// Walsh-Hadamard matrix H of that size (H = H^T = H^-1; llama.cpp's ggml_gen_hadamard: Sylvester
// order, scaled by 1 / sqrt(width)); nothing for width 0.
void hadamard_rows(float* rows, int64_t n_rows, int head_dim, int width);
// The types a cache can store: f32, f16, bf16, q8_0, q4_0 (llama.cpp's common -ctk/-ctv values).
std::string kv_cache_type_names();
// Parses one of kv_cache_type_names(); throws Error naming them otherwise.
DType kv_cache_type_from_name(std::string_view name);
// Throws Error unless `type` is a cache type whose blocks divide head_dim (q8_0 and q4_0 store
// blocks of 32 values: a head of 8 cannot hold them).
void check_kv_cache_type(DType type, int head_dim, std::string_view what);
// Replaces each of `n_rows` rows [head_dim] by what a cache of `type` reads back once it stores
// it (rotate by `rotation` (a *_rotation_width), quantise, dequantise, rotate back); nothing for
// F32.
void round_trip_to_cache_type(DType type, int rotation, float* rows, int64_t n_rows, int head_dim);

class HeadCache {
 public:
  explicit HeadCache(int head_dim = 0, KvCacheType type = {});

  int head_dim() const { return head_dim_; }
  int64_t size() const { return static_cast<int64_t>(positions_.size()); }
  bool empty() const { return positions_.empty(); }
  KvCacheType type() const { return type_; }
  // Walsh-Hadamard slice widths of the stored rows (key_rotation_width / value_rotation_width):
  // key_rows(), value_rows() and key_segments() hand out rotated rows when these are not 0.
  int key_rotation() const { return key_rotation_; }
  int value_rotation() const { return value_rotation_; }

  // Entries [begin, begin + count) as F32 rows [count, head_dim] in `out`: keys only of entries
  // whose key this head holds (!key_is_shared); values of any. Dequantised for a quantised type.
  void read_keys(int64_t begin, int64_t count, float* out) const;
  void read_values(int64_t begin, int64_t count, float* out) const;
  // The same rows without a copy when the type is F32 (a pointer into the head), else dequantised
  // into `scratch`; valid until the head or `scratch` changes.
  const float* keys_as_f32(int64_t begin, int64_t count, std::vector<float>& scratch) const;
  const float* values_as_f32(int64_t begin, int64_t count, std::vector<float>& scratch) const;
  // One entry's key / value as F32 (a copy).
  std::vector<float> key_floats(int64_t i) const;
  std::vector<float> value_floats(int64_t i) const;
  // Overwrites entry i's key / value (quantised to the cache type): a merging press's means.
  void write_key(int64_t i, const float* key);
  void write_value(int64_t i, const float* value);
  // Typed rows: [size, head_dim] of type().key when the head holds every key (!shares_keys(); use
  // key_segments() otherwise), values [size, head_dim] of type().value. For the attention kernels.
  const void* key_rows() const { return keys_.data(); }
  const void* value_rows() const { return values_.data(); }
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
  // Reorders entries [begin, begin + order.size()) in place: entry begin + i becomes the former
  // entry begin + order[i] (order: a permutation of 0..size-1). Keys, values, positions and
  // log-weights move together; memory is not reallocated. Throws Error for a range past the end,
  // a non-permutation or a head that shares keys (a recall press's cluster-contiguous layout).
  void reorder(int64_t begin, std::span<const int32_t> order);
  // Keeps only entries `kept` (strictly ascending) in place, keeping the capacity: for a head that
  // grows back during decode (Chelsea's re-runs), no allocation and no copy of the rows before
  // the first one dropped. Throws Error for indices that are not ascending or out of range.
  void compact(std::span<const int32_t> kept);
  // Drops the entries at positions below `min_position` (a sliding-window layer's entries that no
  // later query can see), keeping the others in order and the capacity; returns how many went.
  // Throws Error for a head that shares keys.
  int64_t drop_positions_before(int32_t min_position);
  void set_log_weight(int64_t i, float log_weight);
  void release_unused();
  // Shrinks the capacity to `rows` entries (at least size()) when it holds more than twice that:
  // a sliding-window layer's head, filled with a whole prompt chunk, then cut to its window.
  // Throws Error for a head that shares keys.
  void trim_capacity(int64_t rows);

  // Shared keys (PoD, DESIGN §5 pod): the keys of entries [shared_begin, shared_end) are not held
  // here but read from the same entries of this KV head at layer key_lender(), which holds all of
  // its keys (the lowest layer of the head's block). Values, positions and log-weights stay.
  bool shares_keys() const { return shared_end_ > shared_begin_; }
  int key_lender() const { return key_lender_; }  // -1 when every key is held
  int64_t shared_begin() const { return shared_begin_; }
  int64_t shared_end() const { return shared_end_; }
  bool key_is_shared(int64_t i) const { return i >= shared_begin_ && i < shared_end_; }
  // Releases the keys of entries [begin, end) of a head that shares none yet; they are read from
  // layer `lender` from now on. With `lender_query`, their logits also use the lender layer's
  // query (its attention scores, PoD Eq. 3). Throws Error on a bad range.
  void share_keys(int lender, int64_t begin, int64_t end, bool lender_query = false);
  bool uses_lender_query() const { return lender_query_; }
  // Grows the shared range to end at `end` (decode: tokens leaving the recent window). The rows
  // are released in batches (at most max(64, held / 8) rows wait), so a step costs O(head_dim)
  // amortised instead of moving every recent key.
  void extend_shared_keys(int64_t end);
  // The keys of all entries in entry order as at most 3 consecutive segments (held, borrowed from
  // `lender` = this KV head at layer key_lender(), held); returns how many are non-empty. When the
  // head uses the lender's query, `lender_query` (if given) is set on the borrowed segment.
  int key_segments(const HeadCache& lender, std::array<KeySegment, 3>& out,
                   const float* lender_query = nullptr) const;

  // Key rows stored: those of held keys, and of shared keys still awaiting their batched release.
  int64_t key_rows_held() const {
    return key_row_bytes_ == 0 ? 0 : static_cast<int64_t>(keys_.size() / key_row_bytes_);
  }
  size_t kv_bytes() const;    // keys + values actually held (rows times their types' row bytes)
  size_t meta_bytes() const;  // positions + log-weights
  size_t capacity_bytes() const;

 private:
  // Row of keys_ holding entry i's key.
  int64_t key_row(int64_t i) const {
    return i < shared_end_ ? i : i - (shared_end_ - shared_begin_) + dead_key_rows_;
  }
  void reset_sharing();
  // First byte of the rows of entries [begin, begin + count); throws Error for a range past the
  // end or, for keys, one that includes shared entries.
  const uint8_t* checked_key_rows(int64_t begin, int64_t count) const;
  const uint8_t* checked_value_rows(int64_t begin, int64_t count) const;

  // Stores a row in the cache type (rotated first when the type says so).
  void store_key(const float* key, uint8_t* out) const;
  void store_value(const float* value, uint8_t* out) const;

  int head_dim_;
  KvCacheType type_;
  int key_rotation_;
  int value_rotation_;
  size_t key_row_bytes_;    // bytes of one key row of type_.key
  size_t value_row_bytes_;  // bytes of one value row of type_.value
  // Shared keys: entries [shared_begin_, shared_end_) have no key here; the first dead_key_rows_
  // rows after row shared_begin_ are keys of shared entries not yet released (batched release).
  int key_lender_ = -1;
  int64_t shared_begin_ = 0;
  int64_t shared_end_ = 0;
  int64_t dead_key_rows_ = 0;
  bool lender_query_ = false;
  std::vector<uint8_t> keys_;    // [key rows, key_row_bytes_]
  std::vector<uint8_t> values_;  // [size, value_row_bytes_]
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
  // Throws Error for a type check_kv_cache_type refuses.
  KvCache(int n_layers, int n_kv_heads, int head_dim, KvCacheType type = {});

  int n_layers() const { return static_cast<int>(layers_.size()); }
  int n_kv_heads() const { return layers_.empty() ? 0 : static_cast<int>(layers_[0].heads.size()); }
  int head_dim() const { return head_dim_; }
  KvCacheType type() const { return type_; }
  LayerCache& layer(int l) { return layers_[l]; }
  const LayerCache& layer(int l) const { return layers_[l]; }
  void clear();

  size_t kv_bytes() const;    // exact bytes of keys + values held, all layers and heads
  size_t meta_bytes() const;  // positions and log-weights
  int64_t total_entries() const;

 private:
  int head_dim_ = 0;
  KvCacheType type_;
  std::vector<LayerCache> layers_;
};

}  // namespace protokv
