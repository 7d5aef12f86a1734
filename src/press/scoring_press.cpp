// SPDX-License-Identifier: Apache-2.0
#include "protokv/press/scoring_press.h"
#include "core/parallel.h"

#include <nlohmann/json.hpp>

#include <numeric>

#include "protokv/error.h"

namespace protokv::press {

nlohmann::json Scorer::diagnostics() const {
  return nullptr;
}

void keep_all(const LayerView& layer, LayerCache& out) {
  std::vector<int32_t> all(static_cast<size_t>(layer.n_tokens));
  std::iota(all.begin(), all.end(), 0);
  for (int h = 0; h < layer.n_kv_heads; ++h)
    out.heads[static_cast<size_t>(h)].assign_rows(layer.k_head(h), layer.v_head(h), layer.positions,
                                                  all);
}

ScoringPress::ScoringPress(std::string name, std::unique_ptr<Scorer> scorer, int64_t window,
                           AllocatorConfig allocator)
    : name_(std::move(name)), scorer_(std::move(scorer)), window_(window), allocator_(allocator) {}

nlohmann::json ScoringPress::config() const {
  nlohmann::json out;
  out["name"] = name_;
  out["scorer"] = scorer_->name();
  out["window"] = window_;
  add_allocator_config(allocator_, out);
  scorer_->add_config(out);
  return out;
}

void ScoringPress::begin(const SequenceInfo& info, const Budget& budget) {
  info_ = info;
  budget_ = budget;
  const int64_t keep = budget.resolve(info.n_tokens);
  // Nothing is compressed when the budget covers the prompt, so only a compressing budget must
  // leave room for the window.
  if (keep < info.n_tokens && keep < window_)
    fail(
        "press '{}': budget {} is smaller than its window {} (the window is kept inside the "
        "budget)",
        name_, keep, window_);
  scorer_->begin(info);
}

void ScoringPress::compress_prefill(const LayerView& layer, LayerCache& out) {
  const int64_t n = layer.n_tokens;
  const int64_t keep = budget_.resolve(n);
  if (keep >= n) {
    keep_all(layer, out);
    return;
  }
  if (keep < window_)
    fail("press '{}': budget {} is smaller than its window {}", name_, keep, window_);
  scores_.n_kv_heads = layer.n_kv_heads;
  scores_.n_prefix = n - window_;
  scorer_->score(layer, window_, scores_);
  scores_.sanitise();
  const int n_layers = layer.n_layers > 0 ? layer.n_layers : std::max(1, info_.n_layers);
  const std::vector<int64_t> prefix_budgets =
      allocate_prefix_budgets(allocator_, keep, window_, n, layer.layer, n_layers, scores_);
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    errors.run([&] {
      std::vector<int32_t> kept =
          keep_with_window(layer, h, select_top(scores_, h, prefix_budgets[static_cast<size_t>(h)]),
                           window_, out.heads[static_cast<size_t>(h)]);
      scorer_->on_kept(layer.layer, h, kept);
      on_kept(layer.layer, h, kept);
    });
  }
  errors.rethrow();
}

}  // namespace protokv::press
