// SPDX-License-Identifier: Apache-2.0
// Budget allocators: the PyramidKV layer rule on DESIGN's worked example and its two special
// cases, and Ada-KV's head-wise split on a constructed layer (one concentrated head, one flat).
#include <gtest/gtest.h>

#include <numeric>

#include "protokv/press/allocator.h"
#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

TEST(PyramidAllocator, WorkedExampleC512Window8Layers32) {
  // b = 512 - 8 = 504; min = 504 // 20 = 25; max = 2*504 - 25 = 983 (< n - w for n = 4096);
  // step = (983 - 25) // 31 = 30; layer l keeps 983 - 30 l + 8, i.e. 991, 961, ..., 61.
  const auto budgets = press::pyramid_layer_budgets(512, 8, 4096, 32, 20);
  ASSERT_EQ(budgets.size(), 32u);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(budgets[static_cast<size_t>(l)], 983 - 30 * l + 8) << l;
  EXPECT_EQ(budgets.front(), 991);
  EXPECT_EQ(budgets.back(), 53 + 8);
}

TEST(PyramidAllocator, ShortPromptFallsBackToUniform) {
  // n = 1000 < 2b = 1008: every layer keeps B.
  for (const int64_t keep : press::pyramid_layer_budgets(512, 8, 1000, 32, 20))
    EXPECT_EQ(keep, 512);
  // A single layer has no pyramid either.
  EXPECT_EQ(press::pyramid_layer_budgets(512, 8, 4096, 1, 20), std::vector<int64_t>{512});
}

TEST(PyramidAllocator, MaxIsClampedToThePrefix) {
  // B = 40, w = 8: b = 32, n = 64 (not < 2b): min = 1, max = 63 >= n - w = 56, so max = 56 and
  // min = 64 - 56 = 8; step = (56 - 8) // 3 = 16: layers keep 56, 40, 24, 8 (+ w).
  EXPECT_EQ(press::pyramid_layer_budgets(40, 8, 64, 4, 20), (std::vector<int64_t>{64, 48, 32, 16}));
}

TEST(PyramidAllocator, PressKeepsTheLayerBudgetInEveryHead) {
  constexpr int kLayers = 4;
  auto press = make_press("pyramidkv");
  SyntheticLayer shape(64, 4, 2, 8);
  shape.n_layers = kLayers;
  press->begin(shape.info(), testing::entries(40));
  const std::vector<int64_t> expected = {64, 48, 32, 16};
  for (int l = 0; l < kLayers; ++l) {
    SyntheticLayer layer(64, 4, 2, 8);
    layer.layer = l;
    layer.n_layers = kLayers;
    layer.fill_random(static_cast<uint64_t>(l));
    LayerCache cache = layer.empty_cache();
    press->compress_prefill(layer.view(), cache);
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(cache.heads[static_cast<size_t>(h)].size(), expected[static_cast<size_t>(l)]);
      testing::expect_valid_head(layer, cache.heads[static_cast<size_t>(h)], h, 8);
    }
  }
}

press::LayerScores concentrated_and_flat(int64_t prefix) {
  press::LayerScores scores;
  scores.reset(2, prefix, false, false);
  // Head 0: five heavy hitters, the rest near zero. Head 1: flat.
  for (int64_t j = 0; j < prefix; ++j) {
    scores.head_score(0)[j] = j % 20 == 3 ? 1.0f : 0.001f;
    scores.head_score(1)[j] = 0.1f;
  }
  return scores;
}

TEST(AdaKvAllocator, ConcentratedHeadGivesBudgetToTheFlatHead) {
  // prefix 100, b = 20, f = 0.2: the global top 40 holds head 0's 5 heavy hitters and 35 of head
  // 1's flat entries (0.1 > 0.001), so cnt = (5, 35); head h gets cnt*(1-f) + floor(f*b):
  // 5*0.8 + 4 = 8 and 35*0.8 + 4 = 32, summing to H*b = 40.
  const auto scores = concentrated_and_flat(100);
  EXPECT_EQ(press::adakv_head_budgets(scores, 20, 0.2, false), (std::vector<int64_t>{8, 32}));
  // Floor 1: every head gets b whatever its scores.
  EXPECT_EQ(press::adakv_head_budgets(scores, 20, 1.0, false), (std::vector<int64_t>{20, 20}));
  // Floor 0: budgets equal the global top-k counts.
  EXPECT_EQ(press::adakv_head_budgets(scores, 20, 0.0, false), (std::vector<int64_t>{5, 35}));
}

TEST(AdaKvAllocator, NormalisationScalesByTopBMassOverTotalMass) {
  // normalise=1 as FFY0/AdaKV and KVCache-Factory: head h's scores times m_h = (sum of its b
  // largest) / (sum of all). Four heads, 80 prefix entries each, b = 23, f = 0.2:
  //   heads 0, 1: 40 x 0.5 and 40 x 0.1: top-23 mass 11.5, total 24, m = 0.4792 -> 0.2396, 0.0479
  //   head 2: 17 x 10 and 63 x 0.1: top-23 mass 170.6, total 176.3, m = 0.9677 -> 9.677, 0.0968
  //   head 3: 80 x 1.0: top-23 mass 23, total 80, m = 0.2875 -> 0.2875
  // The global top H*b = 92: head 2's 17 (9.677), then 75 of head 3's 80 (0.2875 > 0.2396):
  // cnt = (0, 0, 17, 75). floor(f*b) = 4 guaranteed; 92 - 16 = 76 shared as cnt*76/92 = (0, 0,
  // 14.04, 61.96) -> 14 and 61, the one left to the larger remainder (head 3): budgets
  // 4 / 4 / 18 / 66.
  press::LayerScores scores;
  scores.reset(4, 80, false, false);
  for (int64_t j = 0; j < 80; ++j) {
    scores.head_score(0)[j] = scores.head_score(1)[j] = j % 2 == 0 ? 0.5f : 0.1f;
    scores.head_score(2)[j] = j % 4 == 1 && j / 4 < 17 ? 10.0f : 0.1f;  // 17 heavy, spread out
    scores.head_score(3)[j] = 1.0f;
  }
  int heavy = 0;
  for (int64_t j = 0; j < 80; ++j) heavy += scores.head_score(2)[j] == 10.0f;
  ASSERT_EQ(heavy, 17);
  EXPECT_EQ(press::adakv_head_budgets(scores, 23, 0.2, true), (std::vector<int64_t>{4, 4, 18, 66}));
  // Dividing each head by its own sum instead (the earlier rule) ranks heads 0 and 1's 0.5/24 =
  // 0.0208 above head 3's 1/80 = 0.0125: cnt = (40, 35, 17, 0), budgets 37 / 33 / 18 / 4.
  // Unnormalised, the order is the same as the reference's here: 4 / 4 / 18 / 66.
  EXPECT_EQ(press::adakv_head_budgets(scores, 23, 0.2, false),
            (std::vector<int64_t>{4, 4, 18, 66}));
  // A constant factor on one head is not normalised away (m_h is scale-free, the scores are not):
  // head 3 times 0.5 (0.14375) now trails heads 0 and 1 (0.2396): their 40 + 35 take the rest.
  auto halved = scores;
  for (int64_t j = 0; j < 80; ++j) halved.head_score(3)[j] *= 0.5f;
  EXPECT_EQ(press::adakv_head_budgets(halved, 23, 0.2, true),
            (std::vector<int64_t>{37, 33, 18, 4}));
}

TEST(AdaKvAllocator, NormalisationKeepsTheConcentratedHeadsLead) {
  // concentrated_and_flat, b = 20: head 0's m = (5 + 15*0.001) / 5.095 = 0.984, head 1's m =
  // 2 / 10 = 0.2: heavy hitters 0.984 > flat 0.02 > head 0's rest 0.00098: cnt = (5, 35) as
  // without normalisation, budgets 8 and 32.
  const auto scores = concentrated_and_flat(100);
  EXPECT_EQ(press::adakv_head_budgets(scores, 20, 0.2, true), (std::vector<int64_t>{8, 32}));
}

TEST(AdaKvAllocator, FractionalFloorStillSumsExactlyToTheTotal) {
  // b = 17, f = 0.2: floor(3.4) = 3 guaranteed; 34 - 6 = 28 shared in proportion to cnt = (5, 29):
  // quotas 4.12 and 23.88 -> 4 and 24 by largest remainder: budgets (7, 27), sum 34.
  const auto scores = concentrated_and_flat(100);
  const auto budgets = press::adakv_head_budgets(scores, 17, 0.2, false);
  EXPECT_EQ(budgets, (std::vector<int64_t>{7, 27}));
  // Many heads, random scores, awkward numbers: always exactly H*b, each head >= floor(f*b).
  press::LayerScores random;
  random.reset(7, 53, false, false);
  for (size_t i = 0; i < random.score.size(); ++i)
    random.score[i] =
        static_cast<float>((i * 2654435761u) % 1000) / (1.0f + static_cast<float>(i % 7));
  for (const int64_t b : {1, 9, 13, 52}) {
    const auto split = press::adakv_head_budgets(random, b, 0.3, false);
    EXPECT_EQ(std::accumulate(split.begin(), split.end(), int64_t{0}), 7 * b) << b;
    for (const int64_t v : split) {
      EXPECT_GE(v, static_cast<int64_t>(0.3 * static_cast<double>(b))) << b;
      EXPECT_LE(v, 53) << b;
    }
  }
}

TEST(AdaKvAllocator, PressGivesHeadsDifferentLengthsSummingToTheBudget) {
  // KV head 0's window queries all point at one key; KV head 1's queries are zero (flat
  // attention). Head 0 should get fewer entries than head 1, and the layer exactly 2 * B.
  constexpr int64_t kWindow = 8, kBudget = 28;
  SyntheticLayer layer(100, 2, 2, 32);
  layer.fill_random(9);
  for (int64_t t = layer.n - kWindow; t < layer.n; ++t) {
    for (int c = 0; c < layer.d; ++c) {
      layer.query(0, t)[c] = 30.0f * layer.key(0, 17)[c];
      layer.query(1, t)[c] = 0.0f;
    }
  }
  auto press = make_press("adakv:pool=1");
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  EXPECT_LT(cache.heads[0].size(), cache.heads[1].size());
  EXPECT_EQ(cache.heads[0].size() + cache.heads[1].size(), 2 * kBudget);
  EXPECT_GE(cache.heads[0].size(), kWindow + 4);  // floor(0.2 * 20) = 4
  const auto kept = testing::kept_positions(cache.heads[0]);
  EXPECT_NE(std::find(kept.begin(), kept.end(), 17), kept.end());
  EXPECT_EQ(cache.kv_bytes(), static_cast<size_t>(2 * kBudget * 32 * 2 * 4));
  for (int h = 0; h < 2; ++h)
    testing::expect_valid_head(layer, cache.heads[static_cast<size_t>(h)], h, kWindow);
}

}  // namespace
}  // namespace protokv
