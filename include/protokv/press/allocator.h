// SPDX-License-Identifier: Apache-2.0
#pragma once
// Budget allocators (DESIGN §5): turn one budget B (entries per KV head per layer, window
// included) into per-(layer, head) budgets. Any scorer composes with any allocator.
//   uniform - every head of every layer keeps B.
//   pyramid - PyramidKV's layer rule (more in lower layers, fewer in upper ones).
//   adakv   - Ada-KV's head-wise split of one layer's total by a global top-k over all heads.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "protokv/press/options.h"
#include "protokv/press/scores.h"

namespace protokv::press {

enum class AllocatorKind { Uniform, Pyramid, AdaKv };

struct AllocatorConfig {
  static constexpr int kDefaultBeta = 20;
  static constexpr double kDefaultFloor = 0.2;

  AllocatorKind kind = AllocatorKind::Uniform;
  int beta = kDefaultBeta;       // pyramid: min = b // beta
  double floor = kDefaultFloor;  // adakv: share of b every head is guaranteed
  bool normalise = false;        // adakv: scale each head's scores by top-b mass / total mass
};

// "uniform" | "pyramid" | "adakv"; throws Error for anything else.
AllocatorKind parse_allocator(std::string_view name);
std::string to_string(AllocatorKind kind);
// The schema rows of the options that belong to `kind` (beta= for pyramid; floor=, normalise= for
// adakv; none for uniform).
std::vector<OptionSpec> allocator_option_specs(AllocatorKind kind);
// Reads them.
AllocatorConfig read_allocator_options(AllocatorKind kind, OptionReader& options);
void add_allocator_config(const AllocatorConfig& config, nlohmann::json& out);

// PyramidKV (with beta as given): entries kept per head at each layer, window included.
//   b = B - w; min = b // beta; max = 2b - min; if max >= n - w: max = n - w, min = 2b - max;
//   step = (max - min) // (L - 1); layer l keeps max - l * step + w.
// Uniform B when n < 2b (the reference's fallback) or when there is a single layer.
std::vector<int64_t> pyramid_layer_budgets(int64_t budget, int64_t window, int64_t n_tokens,
                                           int n_layers, int beta);

// Ada-KV head budgets of one layer, window excluded (each head then keeps its count + w).
// cnt_h = entries of head h among the global top H*b of all heads' scores; head h gets
// cnt_h * (1 - f) + floor(f * b) (DESIGN §5), apportioned by largest remainder so that the
// counts are integers summing exactly to H*b (the plain rounding of DESIGN can miss the total by
// up to H entries, and the budget is a memory promise). With `normalise`, head h's scores are
// first multiplied by (sum of its b largest scores) / (sum of all its scores), as FFY0/AdaKV and
// KVCache-Factory do.
std::vector<int64_t> adakv_head_budgets(const LayerScores& scores, int64_t prefix_budget,
                                        double floor, bool normalise);

// Prefix entries (window excluded) to keep per KV head of `layer`. `budget` is B (window
// included), already < n_tokens.
std::vector<int64_t> allocate_prefix_budgets(const AllocatorConfig& config, int64_t budget,
                                             int64_t window, int64_t n_tokens, int layer,
                                             int n_layers, const LayerScores& scores);

}  // namespace protokv::press
