// SPDX-License-Identifier: Apache-2.0
#pragma once
// Observation-window scores (SnapKV Eq. 4, DESIGN §5 "Shared utility"): how much attention the last
// `window` prompt queries pay to each prefix key, pooled along the sequence (SnapKV Eq. 5) and
// reduced over the query heads that share a KV head (GQA), so that selection is per KV head.
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "protokv/press.h"
#include "protokv/press/options.h"

namespace protokv::press {

enum class PoolType { Max, Avg };
enum class GqaReduce { Mean, Max, Sum };
// Under GQA: pool each query head's row, then reduce over the group (PoolFirst, as kvpress does),
// or reduce the group's rows, then pool once (ReduceFirst, as FFY0/AdaKV and KVCache-Factory's
// kv_head mode do).
enum class GqaOrder { PoolFirst, ReduceFirst };

struct WindowScoreConfig {
  static constexpr int64_t kDefaultWindow = 8;
  static constexpr int kDefaultPool = 7;

  int64_t window = kDefaultWindow;  // observation window w (also always kept)
  int pool = kDefaultPool;          // odd kernel size; 1 = no pooling
  PoolType pool_type = PoolType::Max;
  GqaReduce gqa = GqaReduce::Mean;
  GqaOrder gqa_order = GqaOrder::PoolFirst;
};

// The schema rows of window=, pool=, pool_type=, gqa=, gqa_order= (snapkv's; protokv's pool
// default differs, Eq. 18), and of window= and gqa= alone.
std::vector<OptionSpec> window_score_option_specs(
    int default_pool = WindowScoreConfig::kDefaultPool);
OptionSpec window_option_spec();
OptionSpec gqa_option_spec();
// Reads window=, pool=, pool_type=, gqa=, gqa_order= (all optional; defaults from the schema).
WindowScoreConfig read_window_score_options(OptionReader& options);
void add_window_score_config(const WindowScoreConfig& config, nlohmann::json& out);
// Reads only window= (methods that keep a recent window but do not pool).
int64_t read_window_option(OptionReader& options);
GqaReduce read_gqa_option(OptionReader& options);
std::string to_string(PoolType type);
std::string to_string(GqaReduce reduce);
std::string to_string(GqaOrder order);

// 1-D pooling with stride 1 and padding kernel/2: max-pool pads with -inf, avg-pool pads with
// zeros and divides by `kernel` (the padding counts). in, out: [n]; they must not alias.
void pool1d(const float* in, float* out, int64_t n, int kernel, PoolType type);

// Reduces `group` rows of `n` scores (rows [group, n]) into out [n].
void reduce_group(const float* rows, int group, int64_t n, GqaReduce reduce, float* out);

// Pools and group-reduces a KV head's unpooled rows `sums` [group, n] into out [n], in the order
// config.gqa_order says (SnapKV Eq. 5 pooling, then/after the GQA reduction).
void pool_and_reduce(const float* sums, int group, int64_t n, const WindowScoreConfig& config,
                     float* out);

// Unpooled per-query-head window attention sums for KV head `kv_head`:
//   s_g(j) = sum_i softmax_fp32(q_i . k_j / sqrt(d))  over the last w queries i of head g,
// softmax over the whole causal row (keys 0 .. position of i), for prefix keys j < n - w.
// out: [group, n - w] (query heads of the group in order).
// The logits are computed block by block over the keys (kWindowKeyBlock keys per GEMM call, the
// same per-element sums as one single-threaded GEMM over all keys; BLAS runs on the calling
// thread, so the result does not depend on the thread count); `visit_keys`, if given, is called
// with each block [begin, end) of key rows right after its GEMM, while those rows are still in
// cache, so that a caller can compute its own per-key statistics without reading the keys again.
using KeyBlockVisitor = std::function<void(int64_t begin, int64_t end)>;
inline constexpr int64_t kWindowKeyBlock = 256;
void window_attention_sums(const LayerView& layer, int kv_head, int64_t window, float* out,
                           const KeyBlockVisitor& visit_keys = {});

// Pooled, GQA-reduced window scores of KV head `kv_head`: out [n - w].
void window_scores_kv_head(const LayerView& layer, int kv_head, const WindowScoreConfig& config,
                           float* out, const KeyBlockVisitor& visit_keys = {});

// All KV heads, in parallel: out [n_kv_heads, n - w].
void window_scores(const LayerView& layer, const WindowScoreConfig& config, float* out);

}  // namespace protokv::press
