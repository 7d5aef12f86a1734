// SPDX-License-Identifier: Apache-2.0
#include "press/knorm.h"

#include <cmath>

#include "kernels/kernels.h"

namespace protokv::press {

void KnormScorer::score(const LayerView& layer, int64_t window, LayerScores& out) {
  out.reset(layer.n_kv_heads, layer.n_tokens - window, false, false);
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    const float* keys = layer.k_head(h);
    float* score = out.head_score(h);
    for (int64_t j = 0; j < out.n_prefix; ++j) {
      const float* key = keys + j * layer.head_dim;
      score[j] = -std::sqrt(kernels::dot(key, key, layer.head_dim));
    }
  }
}

const PressEntry kKnormEntry{
    .name = "knorm",
    .allocator_role = AllocatorRole::Composes,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "score = -||k||, the L2 norm of each key (per KV head; Knorm, as kvpress's\n"
              "KnormPress): keep the B-w entries with the smallest key norms plus the last w.\n"
              "Query-agnostic: the same cache whatever question follows.\n");
        },
    .options =
        [] {
          return std::vector<OptionSpec>{
              int_option("window", 0, 0, int64_t{1} << 30,
                         "the last w tokens, always kept (kvpress keeps no window)")};
        },
    .make = [](const PressEntry& entry, OptionReader& options,
               const AllocatorConfig& allocator) -> std::unique_ptr<Press> {
      const int64_t window = options.get_int("window");
      return std::make_unique<ScoringPress>(std::string(entry.name),
                                            std::make_unique<KnormScorer>(), window, allocator);
    },
};

}  // namespace protokv::press
