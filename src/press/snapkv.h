// SPDX-License-Identifier: Apache-2.0
#pragma once
// SnapKV (ProtoKV paper Eqs. 4-5): score = observation-window attention, pooled, reduced over the
// GQA group. Also the scorer of pyramidkv and adakv, which differ only in their allocator.
#include <nlohmann/json.hpp>
#include "press/entry.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press/window_scores.h"

namespace protokv::press {

class SnapKvScorer final : public Scorer {
 public:
  explicit SnapKvScorer(WindowScoreConfig config) : config_(config) {}
  std::string name() const override { return "snapkv"; }
  void add_config(nlohmann::json& out) const override { add_window_score_config(config_, out); }
  void score(const LayerView& layer, int64_t window, LayerScores& out) override;

 private:
  WindowScoreConfig config_;
};

extern const PressEntry kSnapKvEntry;
// snapkv scores with their own allocator.
extern const PressEntry kPyramidKvEntry;
extern const PressEntry kAdaKvEntry;

}  // namespace protokv::press
