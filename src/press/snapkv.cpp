// SPDX-License-Identifier: Apache-2.0
#include "press/snapkv.h"

#include <fmt/format.h>

namespace protokv::press {

void SnapKvScorer::score(const LayerView& layer, int64_t window, LayerScores& out) {
  out.reset(layer.n_kv_heads, layer.n_tokens - window, false, false);
  WindowScoreConfig config = config_;
  config.window = window;
  window_scores(layer, config, out.score.data());
}

namespace {

// snapkv, pyramidkv and adakv: the same scorer, their allocators differ.
std::unique_ptr<Press> make_snapkv_family(const PressEntry& entry, OptionReader& options,
                                          const AllocatorConfig& allocator) {
  const WindowScoreConfig scores = read_window_score_options(options);
  return std::make_unique<ScoringPress>(
      std::string(entry.name), std::make_unique<SnapKvScorer>(scores), scores.window, allocator);
}

}  // namespace

const PressEntry kSnapKvEntry{
    .name = "snapkv",
    .allocator_role = AllocatorRole::Composes,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "score = observation-window attention (last w queries, fp32 softmax over\n"
              "the whole causal row, summed over the window rows; SnapKV Eq. 4), pooled\n"
              "per query head (SnapKV Eq. 5), then reduced over the GQA group; keep the top\n"
              "B-w prefix entries (ties: lower position) plus the window.\n");
        },
    .options = [] { return window_score_option_specs(); },
    .make = make_snapkv_family,
};

const PressEntry kPyramidKvEntry{
    .name = "pyramidkv",
    .allocator_role = AllocatorRole::Is,
    .fixed_allocator = AllocatorKind::Pyramid,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "snapkv scores + the pyramid allocator: b = B-w, min = b//beta,\n"
              "max = 2b-min; if max >= n-w: max = n-w, min = 2b-max;\n"
              "step = (max-min)//(L-1); layer l keeps max - l*step + w. Uniform B when\n"
              "n < 2b or L = 1. Like the reference, the layers' total can exceed L*B\n"
              "slightly (integer steps).\n");
        },
    .options = [] { return window_score_option_specs(); },
    .options_of = "snapkv",
    .make = make_snapkv_family,
};

const PressEntry kAdaKvEntry{
    .name = "adakv",
    .allocator_role = AllocatorRole::Is,
    .fixed_allocator = AllocatorKind::AdaKv,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "snapkv scores + the adakv allocator, per layer: global top H*b over all KV\n"
              "heads' scores (b = B-w); cnt_h = head h's share; head h keeps\n"
              "cnt_h*(1-f) + floor(f*b) + w (f = floor=), apportioned by largest remainder so\n"
              "the heads sum exactly to H*B (plain rounding can miss by up to H entries).\n"
              "Heads get different lengths.\n");
        },
    .options = [] { return window_score_option_specs(); },
    .options_of = "snapkv",
    .make = make_snapkv_family,
};

}  // namespace protokv::press
