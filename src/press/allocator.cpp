// SPDX-License-Identifier: Apache-2.0
#include "protokv/press/allocator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "protokv/error.h"
#include "protokv/press/options.h"

namespace protokv::press {

AllocatorKind parse_allocator(std::string_view name) {
  if (name == "uniform") return AllocatorKind::Uniform;
  if (name == "pyramid") return AllocatorKind::Pyramid;
  if (name == "adakv") return AllocatorKind::AdaKv;
  fail("unknown allocator '{}' (available: uniform, pyramid, adakv)", name);
}

std::string to_string(AllocatorKind kind) {
  switch (kind) {
    case AllocatorKind::Pyramid:
      return "pyramid";
    case AllocatorKind::AdaKv:
      return "adakv";
    case AllocatorKind::Uniform:
      break;
  }
  return "uniform";
}

std::vector<OptionSpec> allocator_option_specs(AllocatorKind kind) {
  switch (kind) {
    case AllocatorKind::Pyramid:
      return {int_option("beta", AllocatorConfig::kDefaultBeta, 1, 1000000,
                         "pyramid allocator: the top layer keeps (B-w)//beta, the bottom "
                         "2(B-w) minus that",
                         "PyramidKV")};
    case AllocatorKind::AdaKv:
      return {
          double_option("floor", AllocatorConfig::kDefaultFloor, 0.0, 1.0,
                        "adakv allocator: share f of b = B-w every head is guaranteed", "Ada-KV"),
          bool_option("normalise", false,
                      "adakv allocator: multiply each head's scores by its top-b mass over "
                      "its total mass before the global ranking, as the reference code does")};
    case AllocatorKind::Uniform:
      break;
  }
  return {};
}

AllocatorConfig read_allocator_options(AllocatorKind kind, OptionReader& options) {
  AllocatorConfig config;
  config.kind = kind;
  if (kind == AllocatorKind::Pyramid) config.beta = static_cast<int>(options.get_int("beta"));
  if (kind == AllocatorKind::AdaKv) {
    config.floor = options.get_double("floor");
    config.normalise = options.get_bool("normalise");
  }
  return config;
}

void add_allocator_config(const AllocatorConfig& config, nlohmann::json& out) {
  out["allocator"] = to_string(config.kind);
  if (config.kind == AllocatorKind::Pyramid) out["beta"] = config.beta;
  if (config.kind == AllocatorKind::AdaKv) {
    out["floor"] = config.floor;
    out["normalise"] = config.normalise;
  }
}

std::vector<int64_t> pyramid_layer_budgets(int64_t budget, int64_t window, int64_t n_tokens,
                                           int n_layers, int beta) {
  std::vector<int64_t> budgets(static_cast<size_t>(n_layers), budget);
  const int64_t b = budget - window;
  if (n_layers < 2 || n_tokens < 2 * b) return budgets;
  int64_t min_keep = b / beta;
  int64_t max_keep = 2 * b - min_keep;
  if (max_keep >= n_tokens - window) {
    max_keep = n_tokens - window;
    min_keep = 2 * b - max_keep;
  }
  const int64_t step = (max_keep - min_keep) / (n_layers - 1);
  for (int l = 0; l < n_layers; ++l) budgets[static_cast<size_t>(l)] = max_keep - l * step + window;
  return budgets;
}

std::vector<int64_t> adakv_head_budgets(const LayerScores& scores, int64_t prefix_budget,
                                        double floor, bool normalise) {
  const int heads = scores.n_kv_heads;
  const int64_t n = scores.n_prefix;
  const int64_t b = std::clamp<int64_t>(prefix_budget, 0, n);
  std::vector<int64_t> budgets(static_cast<size_t>(heads), b);
  if (heads <= 1 || b == 0 || b == n) return budgets;

  // Global ranking of all heads' entries: by (possibly normalised) score, then head, then the
  // head's own order, so that equal scores resolve deterministically.
  // normalise=1 follows both reference implementations (FFY0/AdaKV and KVCache-Factory): each
  // head's scores are multiplied by (mass of its own top b) / (its total mass), which boosts
  // concentrated heads, whose top b hold nearly all their attention, over flat ones.
  std::vector<float> scale(static_cast<size_t>(heads), 1.0f);
  if (normalise) {
    std::vector<float> finite;
    for (int h = 0; h < heads; ++h) {
      const float* s = scores.head_score(h);
      finite.clear();
      for (int64_t j = 0; j < n; ++j)
        if (std::isfinite(s[j])) finite.push_back(s[j]);
      const auto top_end = finite.begin() + std::min<int64_t>(b, std::ssize(finite));
      std::partial_sort(finite.begin(), top_end, finite.end(), std::greater<float>());
      const double top_mass = std::accumulate(finite.begin(), top_end, 0.0);
      const double total_mass = std::accumulate(finite.begin(), finite.end(), 0.0);
      if (total_mass > 0.0)
        scale[static_cast<size_t>(h)] = static_cast<float>(top_mass / total_mass);
    }
  }
  const int64_t total = static_cast<int64_t>(heads) * b;
  std::vector<int64_t> entries(static_cast<size_t>(heads) * static_cast<size_t>(n));
  std::iota(entries.begin(), entries.end(), 0);
  auto value = [&](int64_t e) {
    const int h = static_cast<int>(e / n);
    return scores.score[static_cast<size_t>(e)] * scale[static_cast<size_t>(h)];
  };
  std::nth_element(entries.begin(), entries.begin() + total, entries.end(),
                   [&](int64_t a, int64_t c) {
                     const float va = value(a), vc = value(c);
                     if (va != vc) return va > vc;
                     const int64_t ha = a / n, hc = c / n;
                     if (ha != hc) return ha < hc;
                     return scores.ranks_before(static_cast<int>(ha), a % n, c % n);
                   });
  std::vector<int64_t> count(static_cast<size_t>(heads), 0);
  for (int64_t i = 0; i < total; ++i)
    ++count[static_cast<size_t>(entries[static_cast<size_t>(i)] / n)];

  // Every head is guaranteed floor(f*b); the rest, H*b - H*floor(f*b), is shared in proportion to
  // cnt_h: quota_h = cnt_h * (1 - floor(f*b)/b), which is cnt_h * (1 - f) when f*b is an integer.
  const int64_t guaranteed = static_cast<int64_t>(std::floor(floor * static_cast<double>(b)));
  const int64_t shared = total - static_cast<int64_t>(heads) * guaranteed;
  std::vector<double> remainder(static_cast<size_t>(heads));
  int64_t assigned = 0;
  for (int h = 0; h < heads; ++h) {
    const double quota = static_cast<double>(count[static_cast<size_t>(h)]) *
                         static_cast<double>(shared) / static_cast<double>(total);
    const auto whole = static_cast<int64_t>(std::floor(quota));
    budgets[static_cast<size_t>(h)] = guaranteed + whole;
    remainder[static_cast<size_t>(h)] = quota - static_cast<double>(whole);
    assigned += whole;
  }
  std::vector<int> order(static_cast<size_t>(heads));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) {
    return remainder[static_cast<size_t>(a)] > remainder[static_cast<size_t>(c)];
  });
  for (int64_t i = 0; i < shared - assigned; ++i)
    ++budgets[static_cast<size_t>(order[static_cast<size_t>(i % heads)])];
  for (auto& budget : budgets) budget = std::min(budget, n);
  return budgets;
}

std::vector<int64_t> allocate_prefix_budgets(const AllocatorConfig& config, int64_t budget,
                                             int64_t window, int64_t n_tokens, int layer,
                                             int n_layers, const LayerScores& scores) {
  const int heads = scores.n_kv_heads;
  const int64_t n_prefix = n_tokens - window;
  switch (config.kind) {
    case AllocatorKind::Pyramid: {
      const auto layers = pyramid_layer_budgets(budget, window, n_tokens, n_layers, config.beta);
      const int64_t keep = layers[static_cast<size_t>(std::clamp(layer, 0, n_layers - 1))];
      return std::vector<int64_t>(static_cast<size_t>(heads),
                                  std::clamp<int64_t>(keep - window, 0, n_prefix));
    }
    case AllocatorKind::AdaKv:
      return adakv_head_budgets(scores, budget - window, config.floor, config.normalise);
    case AllocatorKind::Uniform:
      break;
  }
  return std::vector<int64_t>(static_cast<size_t>(heads),
                              std::clamp<int64_t>(budget - window, 0, n_prefix));
}

}  // namespace protokv::press
