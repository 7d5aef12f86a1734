// SPDX-License-Identifier: Apache-2.0
// The point of ProtoKV (ProtoKV §1, §4): a semantically coherent multi-token span far from the
// observation window, attended moderately and evenly by the window queries, is kept whole by the
// cluster mean (Eq. 18), while SnapKV's max-pooled scores spend the same budget on the
// neighbourhoods of its strongest isolated peaks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "protokv/press/scoring_press.h"
#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

constexpr int kDim = 32;
constexpr int64_t kPrefix = 400, kWindow = 8;
constexpr int64_t kSpanBegin = 104, kSpanEnd = 116;  // 12 tokens, across the chunk boundary 112
const std::vector<int64_t> kPeaks = {40, 220, 330};

// Keys: local drift (a unit vector turning slowly in the (e0, e1) plane, period 400 tokens, plus
// noise); the span shares direction e5; three isolated peaks point along e7. Window queries:
// 12 * e5 + 30 * e7 (logits 12/sqrt(32) for every span token, 30/sqrt(32) for the peaks, about
// 0 for the drift), so each peak draws ~25x the attention of a span token, and a span token ~8x
// that of a drift token.
SyntheticLayer span_layer() {
  SyntheticLayer layer(kPrefix + kWindow, 2, 1, kDim);
  std::mt19937_64 rng(21);
  std::normal_distribution<float> noise(0.0f, 0.03f);
  const double step = 2.0 * M_PI / 400.0;
  for (int64_t t = 0; t < layer.n; ++t) {
    float* k = layer.key(0, t);
    for (int c = 0; c < kDim; ++c) k[c] = noise(rng);
    if (t >= kSpanBegin && t < kSpanEnd) {
      k[5] += 1.0f;
    } else if (std::find(kPeaks.begin(), kPeaks.end(), t) != kPeaks.end()) {
      k[7] += 1.0f;
    } else {
      k[0] += static_cast<float>(std::cos(step * static_cast<double>(t)));
      k[1] += static_cast<float>(std::sin(step * static_cast<double>(t)));
    }
  }
  for (int qh = 0; qh < 2; ++qh)
    for (int64_t t = kPrefix; t < layer.n; ++t) {
      float* q = layer.query(qh, t);
      for (int c = 0; c < kDim; ++c) q[c] = noise(rng);
      q[5] += 12.0f;
      q[7] += 30.0f;
    }
  for (size_t i = 0; i < layer.v.size(); ++i) layer.v[i] = static_cast<float>(i % 11);
  return layer;
}

std::vector<int32_t> kept_prefix(const std::string& spec, const SyntheticLayer& layer,
                                 int64_t budget) {
  auto press = make_press(spec);
  press->begin(layer.info(), testing::entries(budget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  testing::expect_valid_head(layer, cache.heads[0], 0, kWindow);
  std::vector<int32_t> prefix;
  for (const int32_t p : testing::kept_positions(cache.heads[0]))
    if (p < kPrefix) prefix.push_back(p);
  return prefix;
}

int64_t span_tokens(const std::vector<int32_t>& kept) {
  return std::count_if(kept.begin(), kept.end(),
                       [](int32_t p) { return p >= kSpanBegin && p < kSpanEnd; });
}

TEST(ProtoKvPlantedSpan, ProtoKvKeepsTheWholeSpanWhereSnapKvKeepsOnlyItsPeakFragments) {
  const SyntheticLayer layer = span_layer();
  // Room for the three peaks and the span: 15 prefix entries.
  const int64_t budget = kWindow + 3 + (kSpanEnd - kSpanBegin);

  // SnapKV (max-pool 7): every kept entry is a peak or one of its +-3 neighbours; no span token.
  const auto snap = kept_prefix("snapkv", layer, budget);
  ASSERT_EQ(snap.size(), 15u);
  for (const int32_t p : snap) {
    const bool near_peak = std::any_of(kPeaks.begin(), kPeaks.end(),
                                       [&](int64_t peak) { return std::abs(p - peak) <= 3; });
    EXPECT_TRUE(near_peak) << "snapkv kept " << p;
  }
  EXPECT_EQ(span_tokens(snap), 0);

  // ProtoKV (defaults and the paper-002 variants): the whole span and the peaks, nothing else.
  std::vector<int32_t> expected(kPeaks.begin(), kPeaks.end());
  for (int64_t t = kSpanBegin; t < kSpanEnd; ++t) expected.push_back(static_cast<int32_t>(t));
  std::sort(expected.begin(), expected.end());
  for (const std::string spec : {"protokv", "protokv:seed=3", "protokv:deviation=neighbourhood",
                                 "protokv:select=clusters"}) {
    SCOPED_TRACE(spec);
    EXPECT_EQ(kept_prefix(spec, layer, budget), expected);
  }

  // The diagnostics say why: the budget went to whole clusters (the span and the peaks' bucket),
  // and the span's tokens from the next chunk joined the cluster of their own direction.
  auto press = make_press("protokv");
  press->begin(layer.info(), testing::entries(budget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  auto* scoring = dynamic_cast<press::ScoringPress*>(press.get());
  ASSERT_NE(scoring, nullptr);
  const nlohmann::json diagnostics = scoring->scorer().diagnostics();
  ASSERT_EQ(diagnostics.size(), 1u);
  const auto& layer0 = diagnostics[0];
  EXPECT_EQ(layer0["whole_cluster_budget_share"].get<double>(), 1.0);
  EXPECT_EQ(layer0["irregular"].get<double>(), 12.0);
  EXPECT_GT(layer0["outside_own_chunk"].get<double>(), 0.0);
  EXPECT_LT(layer0["outside_own_chunk"].get<double>(), 1.0);
  EXPECT_GE(layer0["cluster_size_max"].get<double>(), 12.0);
  EXPECT_NEAR(layer0["cluster_size_mean"].get<double>() * layer0["clusters"].get<double>(),
              static_cast<double>(kPrefix), 1e-9);  // one head: exact
}

}  // namespace
}  // namespace protokv
