// SPDX-License-Identifier: Apache-2.0
#include "press/streaming_llm.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "protokv/error.h"
#include "protokv/press/scoring_press.h"

namespace protokv::press {

nlohmann::json StreamingLlmPress::config() const {
  return {{"name", "streaming_llm"}, {"sinks", sinks_}, {"allocator", "uniform"}};
}

void StreamingLlmPress::begin(const SequenceInfo& info, const Budget& budget) {
  budget_ = budget;
  const int64_t keep = budget.resolve(info.n_tokens);
  // At least the newest prompt token must survive next to the sinks.
  if (keep < info.n_tokens && keep < sinks_ + 1)
    fail("press 'streaming_llm': budget {} is smaller than sinks {} + 1 recent token", keep,
         sinks_);
}

void StreamingLlmPress::compress_prefill(const LayerView& layer, LayerCache& out) {
  const int64_t n = layer.n_tokens;
  const int64_t keep = budget_.resolve(n);
  if (keep >= n) {
    keep_all(layer, out);
    return;
  }
  if (keep < sinks_ + 1)
    fail("press 'streaming_llm': budget {} is smaller than sinks {} + 1 recent token", keep,
         sinks_);
  std::vector<int32_t> kept;
  kept.reserve(static_cast<size_t>(keep));
  for (int64_t j = 0; j < sinks_; ++j) kept.push_back(static_cast<int32_t>(j));
  for (int64_t j = n - (keep - sinks_); j < n; ++j) kept.push_back(static_cast<int32_t>(j));
  for (int h = 0; h < layer.n_kv_heads; ++h)
    out.heads[static_cast<size_t>(h)].assign_rows(layer.k_head(h), layer.v_head(h), layer.positions,
                                                  kept);
}

const PressEntry kStreamingLlmEntry{
    .name = "streaming_llm",
    .allocator_role = AllocatorRole::None,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "keep the first `sinks` tokens and the last B - sinks. Needs B >= sinks + 1.\n"
              "No allocator.\n");
        },
    .options =
        [] {
          return std::vector<OptionSpec>{
              int_option("sinks", StreamingLlmPress::kDefaultSinks, 0, int64_t{1} << 30,
                         "attention sinks: the first tokens, always kept", "StreamingLLM")};
        },
    .make = [](const PressEntry&, OptionReader& options,
               const AllocatorConfig&) -> std::unique_ptr<Press> {
      const int64_t sinks = options.get_int("sinks");
      return std::make_unique<StreamingLlmPress>(sinks);
    },
};

}  // namespace protokv::press
