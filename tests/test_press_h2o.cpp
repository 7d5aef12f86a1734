// SPDX-License-Identifier: Apache-2.0
// H2O: the tiled column sums against a naive full-attention reference, the kept set, and the
// decode-time eviction policy (decode=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/kernels.h"
#include "press/h2o.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

// Full causal attention of query head qh, column sums over keys [0, limit), in double.
std::vector<double> naive_column_sums(const SyntheticLayer& layer, int qh, int64_t limit) {
  const int group = layer.n_heads / layer.n_kv_heads;
  const int kv = qh / group;
  const int64_t n = layer.n;
  std::vector<double> sums(static_cast<size_t>(limit), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> row(static_cast<size_t>(i + 1));
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (int c = 0; c < layer.d; ++c)
        dot += static_cast<double>(layer.q[static_cast<size_t>((qh * n + i) * layer.d + c)]) *
               layer.k[static_cast<size_t>((kv * n + j) * layer.d + c)];
      row[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(layer.d));
    }
    const double max = *std::max_element(row.begin(), row.end());
    double total = 0.0;
    for (double& x : row) total += (x = std::exp(x - max));
    for (int64_t j = 0; j <= i && j < limit; ++j)
      sums[static_cast<size_t>(j)] += row[static_cast<size_t>(j)] / total;
  }
  return sums;
}

TEST(H2o, TiledColumnSumsMatchNaiveWhenNIsNotAMultipleOfTheTile) {
  SyntheticLayer layer(50, 2, 1, 8);
  layer.fill_random(21, 2.0f);
  for (const int64_t tile : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    for (const int64_t limit : {int64_t{42}, int64_t{50}}) {
      std::vector<float> sums(static_cast<size_t>(limit));
      press::h2o_column_sums(layer.q.data(), layer.k.data(), layer.n, layer.d, limit, tile,
                             sums.data());
      const auto expected = naive_column_sums(layer, 0, limit);
      for (int64_t j = 0; j < limit; ++j)
        ASSERT_NEAR(sums[static_cast<size_t>(j)], expected[static_cast<size_t>(j)], 1e-4)
            << "tile " << tile << " key " << j;
      // Every query's row sums to 1, so the column sums add up to n minus what the window took.
      double total = std::accumulate(expected.begin(), expected.end(), 0.0);
      if (limit == layer.n) {
        EXPECT_NEAR(total, static_cast<double>(layer.n), 1e-9);
      }
    }
  }
}

TEST(H2o, KeepsTheTopColumnSumsOfTheGroupMeanPlusTheWindow) {
  constexpr int64_t kWindow = 8, kBudget = 30;
  SyntheticLayer layer(150, 4, 2, 16);  // 150 tokens: tiles of 64 leave a partial tile
  layer.fill_random(33, 2.0f);
  auto press = make_press("h2o");
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  const int64_t prefix = layer.n - kWindow;
  for (int h = 0; h < 2; ++h) {
    std::vector<double> mean(static_cast<size_t>(prefix), 0.0);
    for (int g = 0; g < 2; ++g) {
      const auto sums = naive_column_sums(layer, h * 2 + g, prefix);
      for (int64_t j = 0; j < prefix; ++j)
        mean[static_cast<size_t>(j)] += sums[static_cast<size_t>(j)] / 2;
    }
    std::vector<int32_t> order(static_cast<size_t>(prefix));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return mean[static_cast<size_t>(a)] > mean[static_cast<size_t>(b)];
    });
    order.resize(kBudget - kWindow);
    for (int64_t j = prefix; j < layer.n; ++j) order.push_back(static_cast<int32_t>(j));
    std::sort(order.begin(), order.end());
    EXPECT_EQ(testing::kept_positions(cache.heads[static_cast<size_t>(h)]), order) << "head " << h;
    testing::expect_valid_head(layer, cache.heads[static_cast<size_t>(h)], h, kWindow);
  }
}

TEST(H2o, DecodeEvictsTheLowestAccumulatedScoreOutsideTheRecentWindow) {
  constexpr int64_t kWindow = 4, kBudget = 12;
  SyntheticLayer layer(40, 2, 1, 8);  // MHA-like group of 2 on one KV head
  layer.fill_random(5, 1.5f);
  auto made = make_press("h2o:decode=1,recent=4");
  auto* press = dynamic_cast<press::H2oPress*>(made.get());
  ASSERT_NE(press, nullptr);
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  HeadCache& head = cache.heads[0];
  ASSERT_EQ(head.size(), kBudget);

  // Prefill state: each kept entry carries its full-prompt column sum (mean over the group).
  const auto col0 = naive_column_sums(layer, 0, layer.n),
             col1 = naive_column_sums(layer, 1, layer.n);
  std::vector<double> expected;
  for (const int32_t p : head.positions())
    expected.push_back((col0[static_cast<size_t>(p)] + col1[static_cast<size_t>(p)]) / 2);
  for (size_t e = 0; e < expected.size(); ++e)
    ASSERT_NEAR(press->decode_scores(0, 0)[e], expected[e], 1e-4) << e;

  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (int step = 0; step < 6; ++step) {
    const int32_t position = static_cast<int32_t>(layer.n + step);
    std::vector<float> key(8), value(8), q(2 * 8);
    for (float& x : key) x = normal(rng);
    for (float& x : value) x = normal(rng);
    for (float& x : q) x = normal(rng);
    head.append(key.data(), value.data(), position);
    // Expected: add the mean over the group of the new query's softmax over all entries.
    expected.push_back(0.0);
    const int64_t size = head.size();
    for (int g = 0; g < 2; ++g) {
      std::vector<double> row(static_cast<size_t>(size));
      for (int64_t e = 0; e < size; ++e) {
        double dot = 0.0;
        for (int c = 0; c < 8; ++c)
          dot += static_cast<double>(q[static_cast<size_t>(g * 8 + c)]) * head.key_floats(e)[c];
        row[static_cast<size_t>(e)] = dot / std::sqrt(8.0);
      }
      const double max = *std::max_element(row.begin(), row.end());
      double total = 0.0;
      for (double& x : row) total += (x = std::exp(x - max));
      for (int64_t e = 0; e < size; ++e)
        expected[static_cast<size_t>(e)] += row[static_cast<size_t>(e)] / total / 2;
    }
    int64_t victim = 0;
    for (int64_t e = 1; e < size - kWindow; ++e)
      if (expected[static_cast<size_t>(e)] < expected[static_cast<size_t>(victim)]) victim = e;
    std::vector<int32_t> positions_after(head.positions().begin(), head.positions().end());
    positions_after.erase(positions_after.begin() + victim);
    expected.erase(expected.begin() + victim);

    // Even steps: the attention weights come with the step, as the engine's decode kernel wrote
    // them ([group, size] rows); odd steps: none (an append() row), H2O computes them.
    DecodeStep decode = testing::decode_step(layer, q.data(), position, cache);
    std::vector<float> kernel_probs(static_cast<size_t>(2 * head.size())), out(2 * 8);
    if (step % 2 == 0) {
      kernels::attention_decode_group(q.data(), 2, testing::cache_keys(head).data(),
                                      testing::cache_values(head).data(), nullptr, head.size(), 8,
                                      out.data(), kernel_probs.data());
      decode.probs_data = kernel_probs.data();
      decode.probs_stride = head.size();
    }
    press->on_decode(decode);
    ASSERT_EQ(head.size(), kBudget) << "step " << step;
    EXPECT_EQ(testing::kept_positions(head), positions_after) << "step " << step;
    for (int64_t e = 0; e < kBudget; ++e)
      ASSERT_NEAR(press->decode_scores(0, 0)[static_cast<size_t>(e)],
                  expected[static_cast<size_t>(e)], 1e-4);
    // The most recent window entries are never evicted.
    EXPECT_EQ(head.positions()[kBudget - 1], position);
  }
}

TEST(H2o, DecodeSplitsTheBudgetHalfHeavyHittersHalfRecentByDefault) {
  // H2O's code keeps heavy_budget + recent_budget with equal ratios in its scripts: at B = 12,
  // the last 6 tokens and the 6 best of the column sums over the rest.
  constexpr int64_t kBudget = 12, kRecent = kBudget / 2;
  SyntheticLayer layer(40, 2, 1, 8);
  layer.fill_random(9, 1.5f);
  auto press = make_press("h2o:decode=1");
  EXPECT_EQ(press->config()["recent"], "B/2");
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  const int64_t prefix = layer.n - kRecent;
  const auto col0 = naive_column_sums(layer, 0, prefix), col1 = naive_column_sums(layer, 1, prefix);
  std::vector<int32_t> order(static_cast<size_t>(prefix));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return col0[static_cast<size_t>(a)] + col1[static_cast<size_t>(a)] >
           col0[static_cast<size_t>(b)] + col1[static_cast<size_t>(b)];
  });
  order.resize(kBudget - kRecent);
  for (int64_t j = prefix; j < layer.n; ++j) order.push_back(static_cast<int32_t>(j));
  std::sort(order.begin(), order.end());
  EXPECT_EQ(testing::kept_positions(cache.heads[0]), order);

  // During decode the last B/2 entries are never evicted.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  HeadCache& head = cache.heads[0];
  for (int step = 0; step < 8; ++step) {
    const auto position = static_cast<int32_t>(layer.n + step);
    std::vector<float> key(8), q(16);
    for (float& x : key) x = normal(rng);
    for (float& x : q) x = normal(rng);
    head.append(key.data(), key.data(), position);
    press->on_decode(testing::decode_step(layer, q.data(), position, cache));
    ASSERT_EQ(head.size(), kBudget);
    for (int64_t r = 0; r < kRecent; ++r)
      EXPECT_EQ(head.positions()[static_cast<size_t>(kBudget - 1 - r)], position - r)
          << "step " << step;
  }
}

TEST(H2o, RecentAndWindowBelongToDifferentModes) {
  EXPECT_EQ(make_press("h2o:decode=1,recent=5")->config()["recent"], 5);
  EXPECT_THROW(make_press("h2o:decode=1,window=4"), Error);  // decode=1's window is recent=
  EXPECT_THROW(make_press("h2o:recent=4"), Error);           // prefill-only h2o takes window=
  EXPECT_THROW(make_press("h2o:decode=1,recent=0"), Error);
  // A recent window larger than the budget cannot be honoured.
  SyntheticLayer layer(40, 2, 1, 8);
  auto press = make_press("h2o:decode=1,recent=20");
  EXPECT_THROW(press->begin(layer.info(), testing::entries(12)), Error);
}

TEST(H2o, DecodeWithoutCompressedPrefillNeverEvicts) {
  SyntheticLayer layer(10, 2, 1, 8);
  layer.fill_random(8);
  auto press = make_press("h2o:decode=1,recent=4");
  press->begin(layer.info(), testing::entries(16));  // covers the prompt: no compression
  LayerCache cache = layer.empty_cache();
  for (int64_t t = 0; t < layer.n; ++t)
    cache.heads[0].append(layer.key(0, t), layer.key(0, t), static_cast<int32_t>(t));
  std::vector<float> q(16, 0.5f);
  for (int step = 0; step < 10; ++step) {
    cache.heads[0].append(q.data(), q.data(), static_cast<int32_t>(layer.n + step));
    press->on_decode(
        testing::decode_step(layer, q.data(), static_cast<int32_t>(layer.n + step), cache));
  }
  EXPECT_EQ(cache.heads[0].size(), 20);
}

}  // namespace
}  // namespace protokv
