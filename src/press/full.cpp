#include "press/full.h"

#include <numeric>
#include <vector>

namespace protokv {

void FullPress::compress_prefill(const LayerView& layer, LayerCache& out) {
  std::vector<int32_t> all(static_cast<size_t>(layer.n_tokens));
  std::iota(all.begin(), all.end(), 0);
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    out.heads[static_cast<size_t>(h)].assign_rows(layer.k_head(h), layer.v_head(h), layer.positions,
                                                  all);
  }
}

}  // namespace protokv
