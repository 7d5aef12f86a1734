#include "press/snapkv.h"

namespace protokv::press {

void SnapKvScorer::score(const LayerView& layer, int64_t window, LayerScores& out) {
  out.reset(layer.n_kv_heads, layer.n_tokens - window, false, false);
  WindowScoreConfig config = config_;
  config.window = window;
  window_scores(layer, config, out.score.data());
}

}  // namespace protokv::press
