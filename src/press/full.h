#pragma once
#include "protokv/press.h"

namespace protokv {

// No compression: keeps every prefill entry. The reference for every fidelity metric.
class FullPress final : public Press {
 public:
  std::string name() const override { return "full"; }
  nlohmann::json config() const override { return {{"name", "full"}}; }
  void begin(const SequenceInfo&, const Budget&) override {}
  void compress_prefill(const LayerView& layer, LayerCache& out) override;
};

}  // namespace protokv
