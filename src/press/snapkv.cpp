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
          return fmt::format(
              "score = observation-window attention (last w queries, fp32 softmax over\n"
              "the whole causal row, summed over the window rows; SnapKV Eq. 4), pooled\n"
              "per query head (stride 1, padding pool/2; max pads -inf, avg zero-pads and\n"
              "divides by pool), then reduced over the GQA group; keep the top B-w prefix\n"
              "entries (ties: lower position) plus the window.\n"
              "window={} pool={} pool_type=max|avg (max) gqa=mean|max|sum (mean).\n"
              "gqa_order=pool_first|reduce_first (pool_first): pool each query head, then\n"
              "reduce (as kvpress does), or reduce the group, then pool (FFY0/\n"
              "AdaKV, KVCache-Factory's kv_head mode). Also for pyramidkv and adakv.\n",
              WindowScoreConfig::kDefaultWindow, WindowScoreConfig::kDefaultPool);
        },
    .make = make_snapkv_family,
};

const PressEntry kPyramidKvEntry{
    .name = "pyramidkv",
    .allocator_role = AllocatorRole::Is,
    .fixed_allocator = AllocatorKind::Pyramid,
    .compresses = true,
    .help =
        [] {
          return fmt::format(
              "snapkv scores + the pyramid allocator: b = B-w, min = b//beta,\n"
              "max = 2b-min; if max >= n-w: max = n-w, min = 2b-max;\n"
              "step = (max-min)//(L-1); layer l keeps max - l*step + w. Uniform B when\n"
              "n < 2b or L = 1. beta={} plus the snapkv options. Like the reference, the\n"
              "layers' total can exceed L*B slightly (integer steps).\n",
              AllocatorConfig::kDefaultBeta);
        },
    .make = make_snapkv_family,
};

const PressEntry kAdaKvEntry{
    .name = "adakv",
    .allocator_role = AllocatorRole::Is,
    .fixed_allocator = AllocatorKind::AdaKv,
    .compresses = true,
    .help =
        [] {
          return fmt::format(
              "snapkv scores + the adakv allocator, per layer: global top H*b over all KV\n"
              "heads' scores (b = B-w); cnt_h = head h's share; head h keeps\n"
              "cnt_h*(1-f) + floor(f*b) + w, apportioned by largest remainder so the heads\n"
              "sum exactly to H*B (plain rounding can miss by up to H entries).\n"
              "floor={} normalise=0 (1: multiply each head's scores by its top-b mass over\n"
              "its total mass before the global ranking, as the reference code does) plus\n"
              "the snapkv options. Heads get different lengths.\n",
              AllocatorConfig::kDefaultFloor);
        },
    .make = make_snapkv_family,
};

}  // namespace protokv::press
