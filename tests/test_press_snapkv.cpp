// SPDX-License-Identifier: Apache-2.0
// SnapKV (and the shared observation-window scores) against a naive implementation of DESIGN §5's
// formulas, written independently here in double precision.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "protokv/error.h"
#include "protokv/press/scores.h"
#include "protokv/press/window_scores.h"
#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

// s(j) for prefix keys j < n - w of KV head h: per query head, the window queries' softmax rows
// (causal), summed; pooled with stride 1 and padding k/2; reduced over the group (or, with
// reduce_first, reduced over the group and then pooled).
std::vector<double> naive_window_scores(const SyntheticLayer& layer, int h, int64_t w, int pool,
                                        const std::string& pool_type, const std::string& gqa,
                                        bool reduce_first = false) {
  const int64_t n = layer.n, prefix = n - w;
  const int group = layer.n_heads / layer.n_kv_heads;
  auto pooled = [&](const std::vector<double>& sums) {
    std::vector<double> out(static_cast<size_t>(prefix));
    for (int64_t j = 0; j < prefix; ++j) {
      double value = pool_type == "max" ? -INFINITY : 0.0;
      for (int64_t t = j - pool / 2; t <= j + pool / 2; ++t) {
        const bool inside = t >= 0 && t < prefix;
        if (pool_type == "max") {
          if (inside) value = std::max(value, sums[static_cast<size_t>(t)]);
        } else {
          value += inside ? sums[static_cast<size_t>(t)] : 0.0;  // zero padding counts
        }
      }
      out[static_cast<size_t>(j)] = pool_type == "avg" ? value / pool : value;
    }
    return out;
  };
  auto reduce_into = [&](std::vector<double>& reduced, const std::vector<double>& row) {
    for (int64_t j = 0; j < prefix; ++j) {
      double& r = reduced[static_cast<size_t>(j)];
      r = gqa == "max" ? std::max(r, row[static_cast<size_t>(j)]) : r + row[static_cast<size_t>(j)];
    }
  };
  std::vector<double> reduced(static_cast<size_t>(prefix), gqa == "max" ? -INFINITY : 0.0);
  for (int g = 0; g < group; ++g) {
    const int qh = h * group + g;
    std::vector<double> sums(static_cast<size_t>(prefix), 0.0);
    for (int64_t i = prefix; i < n; ++i) {
      std::vector<double> logits(static_cast<size_t>(i + 1));
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int c = 0; c < layer.d; ++c)
          dot += static_cast<double>(layer.q[static_cast<size_t>((qh * n + i) * layer.d + c)]) *
                 layer.k[static_cast<size_t>((h * n + j) * layer.d + c)];
        logits[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(layer.d));
      }
      const double max = *std::max_element(logits.begin(), logits.end());
      double total = 0.0;
      for (double& x : logits) total += (x = std::exp(x - max));
      for (int64_t j = 0; j < prefix; ++j)
        sums[static_cast<size_t>(j)] += logits[static_cast<size_t>(j)] / total;
    }
    reduce_into(reduced, reduce_first ? sums : pooled(sums));
  }
  if (gqa == "mean")
    for (double& r : reduced) r /= group;
  return reduce_first ? pooled(reduced) : reduced;
}

std::vector<int32_t> naive_kept(const std::vector<double>& scores, int64_t budget, int64_t w) {
  const auto prefix = static_cast<int64_t>(scores.size());
  std::vector<int32_t> order(static_cast<size_t>(prefix));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return scores[static_cast<size_t>(a)] > scores[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(budget - w));
  for (int64_t j = prefix; j < prefix + w; ++j) order.push_back(static_cast<int32_t>(j));
  std::sort(order.begin(), order.end());
  return order;
}

struct SnapCase {
  int pool;
  std::string pool_type;
  std::string gqa;
};

class SnapKvVsNaive : public ::testing::TestWithParam<SnapCase> {};

TEST_P(SnapKvVsNaive, SameScoresAndSameKeptSet) {
  const SnapCase& c = GetParam();
  constexpr int64_t kWindow = 8, kBudget = 40;
  SyntheticLayer layer(130, 8, 2, 16);
  layer.fill_random(42, 2.0f);
  const std::string spec =
      "snapkv:pool=" + std::to_string(c.pool) + ",pool_type=" + c.pool_type + ",gqa=" + c.gqa;
  SCOPED_TRACE(spec);

  press::WindowScoreConfig config;
  config.window = kWindow;
  config.pool = c.pool;
  config.pool_type = c.pool_type == "max" ? press::PoolType::Max : press::PoolType::Avg;
  config.gqa = c.gqa == "max"   ? press::GqaReduce::Max
               : c.gqa == "sum" ? press::GqaReduce::Sum
                                : press::GqaReduce::Mean;
  const int64_t prefix = layer.n - kWindow;
  std::vector<float> scores(static_cast<size_t>(layer.n_kv_heads * prefix));
  press::window_scores(layer.view(), config, scores.data());

  auto press = make_press(spec);
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);

  for (int h = 0; h < layer.n_kv_heads; ++h) {
    const auto expected = naive_window_scores(layer, h, kWindow, c.pool, c.pool_type, c.gqa);
    for (int64_t j = 0; j < prefix; ++j)
      ASSERT_NEAR(scores[static_cast<size_t>(h * prefix + j)], expected[static_cast<size_t>(j)],
                  1e-5 * std::max(1.0, std::abs(expected[static_cast<size_t>(j)])))
          << "head " << h << " key " << j;
    EXPECT_EQ(testing::kept_positions(cache.heads[static_cast<size_t>(h)]),
              naive_kept(expected, kBudget, kWindow))
        << "head " << h;
  }
}

INSTANTIATE_TEST_SUITE_P(Press, SnapKvVsNaive,
                         ::testing::Values(SnapCase{7, "max", "mean"}, SnapCase{7, "max", "max"},
                                           SnapCase{7, "max", "sum"}, SnapCase{7, "avg", "mean"},
                                           SnapCase{7, "avg", "max"}, SnapCase{7, "avg", "sum"},
                                           SnapCase{5, "avg", "mean"}, SnapCase{1, "max", "mean"}),
                         [](const ::testing::TestParamInfo<SnapCase>& info) {
                           return info.param.pool_type + std::to_string(info.param.pool) + "_" +
                                  info.param.gqa;
                         });

TEST(Pooling, MaxPadsWithMinusInfinityAndAvgCountsZeroPadding) {
  const std::vector<float> in = {1, 5, 2, 0, 3};
  std::vector<float> out(in.size());
  press::pool1d(in.data(), out.data(), 5, 3, press::PoolType::Max);
  EXPECT_EQ(out, (std::vector<float>{5, 5, 5, 3, 3}));
  press::pool1d(in.data(), out.data(), 5, 3, press::PoolType::Avg);
  const std::vector<float> avg = {6.0f / 3, 8.0f / 3, 7.0f / 3, 5.0f / 3, 3.0f / 3};
  for (size_t i = 0; i < avg.size(); ++i) EXPECT_FLOAT_EQ(out[i], avg[i]) << i;
}

TEST(SnapKv, KeepsTheKeysTheWindowAttendsTo) {
  // Keys are orthogonal one-hot directions; every window query points at keys 10 and 50, so with
  // no pooling those two must be kept (plus the window) at budget w + 2.
  constexpr int64_t kWindow = 4;
  SyntheticLayer layer(64, 2, 1, 64);
  for (int64_t t = 0; t < layer.n; ++t) layer.key(0, t)[t] = 1.0f;
  for (int qh = 0; qh < 2; ++qh)
    for (int64_t t = layer.n - kWindow; t < layer.n; ++t) {
      layer.query(qh, t)[10] = 20.0f;
      layer.query(qh, t)[50] = 19.0f;
    }
  auto press = make_press("snapkv:window=4,pool=1");
  press->begin(layer.info(), testing::entries(kWindow + 2));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  EXPECT_EQ(testing::kept_positions(cache.heads[0]),
            (std::vector<int32_t>{10, 50, 60, 61, 62, 63}));
}

TEST(SnapKv, ParallelBranchAboveTheThresholdMatchesNaive) {
  // 1024 tokens x 8 heads x 32 dims = 2^18 floats: the per-head loops take their OpenMP branch.
  constexpr int64_t kWindow = 8, kBudget = 64;
  SyntheticLayer layer(1024, 8, 2, 32);
  layer.fill_random(2718, 2.0f);
  ASSERT_TRUE(press::worth_parallel(layer.view()));
  auto press = make_press("snapkv");
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  for (int h = 0; h < 2; ++h)
    EXPECT_EQ(
        testing::kept_positions(cache.heads[static_cast<size_t>(h)]),
        naive_kept(naive_window_scores(layer, h, kWindow, 7, "max", "mean"), kBudget, kWindow))
        << "head " << h;
}

TEST(SnapKv, GqaOrderPoolsBeforeOrAfterTheGroupReduction) {
  // Two query heads' rows [1, 0, 2] and [0, 3, 0], max-pool 3, mean over the group:
  //   pool_first:   pooled rows [1, 2, 2] and [3, 3, 3] -> mean [2, 2.5, 2.5]
  //   reduce_first: mean [0.5, 1.5, 1] -> pooled [1.5, 1.5, 1.5]
  const float rows[] = {1.0f, 0.0f, 2.0f, 0.0f, 3.0f, 0.0f};
  press::WindowScoreConfig config;
  config.pool = 3;
  std::vector<float> out(3);
  press::pool_and_reduce(rows, 2, 3, config, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.0f, 2.5f, 2.5f}));
  config.gqa_order = press::GqaOrder::ReduceFirst;
  press::pool_and_reduce(rows, 2, 3, config, out.data());
  EXPECT_EQ(out, (std::vector<float>{1.5f, 1.5f, 1.5f}));

  // On a GQA layer, each order keeps the top of its own naive scores, and here they differ.
  constexpr int64_t kWindow = 8, kBudget = 24;
  SyntheticLayer layer(96, 8, 2, 16);
  layer.fill_random(41, 2.0f);
  std::vector<std::vector<int32_t>> kept_by_order;
  for (const bool reduce_first : {false, true}) {
    auto made = make_press(std::string("snapkv:gqa_order=") +
                           (reduce_first ? "reduce_first" : "pool_first"));
    EXPECT_EQ(made->config()["gqa_order"], reduce_first ? "reduce_first" : "pool_first");
    made->begin(layer.info(), testing::entries(kBudget));
    LayerCache cache = layer.empty_cache();
    made->compress_prefill(layer.view(), cache);
    for (int h = 0; h < 2; ++h) {
      const auto expected = naive_kept(
          naive_window_scores(layer, h, kWindow, 7, "max", "mean", reduce_first), kBudget, kWindow);
      EXPECT_EQ(testing::kept_positions(cache.heads[static_cast<size_t>(h)]), expected)
          << "reduce_first " << reduce_first << " head " << h;
    }
    kept_by_order.push_back(testing::kept_positions(cache.heads[0]));
  }
  EXPECT_NE(kept_by_order[0], kept_by_order[1]);

  // The option is shared by snapkv's allocator variants; the default is pool_first.
  EXPECT_EQ(make_press("snapkv")->config()["gqa_order"], "pool_first");
  EXPECT_EQ(make_press("adakv:gqa_order=reduce_first")->config()["gqa_order"], "reduce_first");
  EXPECT_EQ(make_press("pyramidkv:gqa_order=reduce_first")->config()["gqa_order"], "reduce_first");
  EXPECT_THROW(make_press("snapkv:gqa_order=mean_first"), Error);
}

}  // namespace
}  // namespace protokv
