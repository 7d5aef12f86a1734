// SPDX-License-Identifier: Apache-2.0
#include "press/full.h"

#include <numeric>
#include <vector>

namespace protokv::press {

void FullPress::compress_prefill(const LayerView& layer, LayerCache& out) {
  std::vector<int32_t> all(static_cast<size_t>(layer.n_tokens));
  std::iota(all.begin(), all.end(), 0);
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    out.heads[static_cast<size_t>(h)].assign_rows(layer.k_head(h), layer.v_head(h), layer.positions,
                                                  all);
  }
}

const PressEntry kFullEntry{
    .name = "full",
    .allocator_role = AllocatorRole::None,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = false,
    .help =
        [] { return std::string("no compression (the reference for every fidelity metric).\n"); },
    .make = [](const PressEntry&, OptionReader&, const AllocatorConfig&) -> std::unique_ptr<Press> {
      return std::make_unique<FullPress>();
    },
};

}  // namespace protokv::press
