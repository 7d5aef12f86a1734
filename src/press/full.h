// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <nlohmann/json.hpp>
#include "press/entry.h"
#include "protokv/press.h"

namespace protokv::press {

// No compression: keeps every prefill entry. The reference for every fidelity metric.
class FullPress final : public Press {
 public:
  std::string name() const override { return "full"; }
  nlohmann::json config() const override { return {{"name", "full"}}; }
  void begin(const SequenceInfo&, const Budget&) override {}
  void compress_prefill(const LayerView& layer, LayerCache& out) override;
};

extern const PressEntry kFullEntry;

}  // namespace protokv::press
