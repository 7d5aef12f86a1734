// SPDX-License-Identifier: Apache-2.0
#pragma once
// Knorm (Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression"): keys with a small L2 norm draw high attention, so score = -||k||, per KV head
// (RoPE rotates pairs of coordinates and leaves the norm unchanged, so pre- or post-RoPE keys
// rank alike). As kvpress's KnormPress: query-agnostic, no observation window by default.
#include <nlohmann/json.hpp>

#include "press/entry.h"
#include "protokv/press/scoring_press.h"

namespace protokv::press {

class KnormScorer final : public Scorer {
 public:
  std::string name() const override { return "knorm"; }
  void add_config(nlohmann::json&) const override {}
  void score(const LayerView& layer, int64_t window, LayerScores& out) override;
};

extern const PressEntry kKnormEntry;

}  // namespace protokv::press
