// SPDX-License-Identifier: Apache-2.0
#pragma once
// StreamingLLM (Xiao et al.): keep the first `sinks` tokens (attention sinks) and the most recent
// B - sinks tokens of the prompt. Position-only: no scores, no allocator.
#include <nlohmann/json.hpp>
#include "press/entry.h"
#include "protokv/press.h"

namespace protokv::press {

class StreamingLlmPress final : public Press {
 public:
  static constexpr int64_t kDefaultSinks = 4;

  explicit StreamingLlmPress(int64_t sinks) : sinks_(sinks) {}
  std::string name() const override { return "streaming_llm"; }
  nlohmann::json config() const override;
  void begin(const SequenceInfo& info, const Budget& budget) override;
  void compress_prefill(const LayerView& layer, LayerCache& out) override;

 private:
  int64_t sinks_;
  Budget budget_;
};

extern const PressEntry kStreamingLlmEntry;

}  // namespace protokv::press
