// SPDX-License-Identifier: Apache-2.0
// The calibration measures of chelsea and pod (DESIGN §5) on hand-made inputs with known answers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "press/calibration_measures.h"
#include "protokv/error.h"

namespace protokv {
namespace {

using press::ChelseaLayout;
using press::SoftLink;

TEST(CalibrationMeasures, LinkChunkLinksEachOddEntryToItsMostSimilarEvenEntry) {
  // Entries 0..4 (d = 2): B = {0, 2, 4}, A = {1, 3}.
  const std::vector<float> keys = {
      1,  0,  // 0 (B)
      0,  5,  // 1 (A): parallel to 4
      -1, 0,  // 2 (B)
      -3, 1,  // 3 (A): closest to 2
      0,  2,  // 4 (B)
  };
  std::vector<SoftLink> links;
  press::link_chunk(keys.data(), 2, 0, 5, links);
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].a, 1);
  EXPECT_EQ(links[0].b, 4);
  EXPECT_FLOAT_EQ(links[0].similarity, 1.0f);
  EXPECT_EQ(links[1].a, 3);
  EXPECT_EQ(links[1].b, 2);
  EXPECT_NEAR(links[1].similarity, 3.0 / std::sqrt(10.0), 1e-6);
}

TEST(CalibrationMeasures, LinkChunkTakesTheFirstOfEqualBestMatchesAndNeverANaN) {
  // Chunk [3, 40) of d = 2 keys: 19 B entries (more than one SIMD width, with a tail), 18 A.
  // B number j (entry 3 + 2j): (0, 1) for j < 5, (1, 0) from j = 5, (1, 1) at j = 18.
  constexpr int64_t kBegin = 3, kEnd = 40;
  std::vector<float> keys(static_cast<size_t>(kEnd * 2), 0.0f);
  const auto set = [&](int64_t e, float x, float y) {
    keys[static_cast<size_t>(2 * e)] = x;
    keys[static_cast<size_t>(2 * e + 1)] = y;
  };
  for (int64_t j = 0; j < 19; ++j)
    if (j < 5)
      set(kBegin + 2 * j, 0, 1);
    else if (j < 18)
      set(kBegin + 2 * j, 1, 0);
    else
      set(kBegin + 2 * j, 1, 1);
  for (int64_t i = 0; i < 18; ++i) set(kBegin + 2 * i + 1, 3, 0);  // ties: B 5..17, similarity 1
  set(kBegin + 3, 0, 2);                                           // ties: B 0..4
  set(kBegin + 5, std::nanf(""), 0);                               // NaN similarities: no link
  set(kBegin + 7, 0, 0);                                           // all 0: the first B
  set(kBegin + 9, 2, 2);                                           // the last B alone
  std::vector<SoftLink> links;
  press::link_chunk(keys.data(), 2, kBegin, kEnd, links);
  ASSERT_EQ(links.size(), 18u);
  for (size_t i = 0; i < links.size(); ++i) {
    SCOPED_TRACE("A number " + std::to_string(i));
    EXPECT_EQ(links[i].a, kBegin + 2 * static_cast<int64_t>(i) + 1);
    switch (i) {
      case 1:
        EXPECT_EQ(links[i].b, kBegin);
        EXPECT_EQ(links[i].similarity, 1.0f);
        break;
      case 2:
        EXPECT_EQ(links[i].b, kBegin);
        EXPECT_EQ(links[i].similarity, -2.0f);
        break;
      case 3:
        EXPECT_EQ(links[i].b, kBegin);
        EXPECT_EQ(links[i].similarity, 0.0f);
        break;
      case 4:
        EXPECT_EQ(links[i].b, kBegin + 36);
        EXPECT_NEAR(links[i].similarity, 1.0, 1e-6);
        break;
      default:
        EXPECT_EQ(links[i].b, kBegin + 10);
        EXPECT_EQ(links[i].similarity, 1.0f);
    }
  }
}

TEST(CalibrationMeasures, UnlinkedShareCountsOnlyTheMatchedMiddleInChunks) {
  // 2 sinks, 2 recent, chunks of 4 over entries [2, 10): chunk [2, 6) and [6, 10).
  // d = 1 keys: signs decide similarity (+1 or -1).
  const std::vector<float> keys = {
      9,  9,           // sinks: ignored
      1,  1,  1,  -1,  // chunk 1: A=3 (sim 1 with 2), A=5 (-1 with both 2 and 4 -> unlinked)
      1,  -1, -1, -1,  // chunk 2: A=7 (-1 links to 8, sim 1), A=9 (links to 8, sim 1)
      -9, -9,          // recent: ignored
  };
  const ChelseaLayout layout{.sinks = 2, .recent = 2, .chunk = 4};
  EXPECT_DOUBLE_EQ(press::chelsea_unlinked_share(keys.data(), 12, 1, layout, 0.8), 0.25);
  // Nothing between sinks and recent: nothing to match.
  EXPECT_DOUBLE_EQ(press::chelsea_unlinked_share(keys.data(), 4, 1, layout, 0.8), 0.0);
}

TEST(CalibrationMeasures, OutlierHeadsAreTheTopFractionOverAllLayers) {
  const std::vector<std::vector<float>> share = {{0.1f, 0.9f}, {0.5f, 0.9f}, {0.2f, 0.3f}};
  const auto mask = press::chelsea_outlier_heads(share, 2.0 / 6.0);
  const std::vector<std::vector<uint8_t>> expected = {{0, 1}, {0, 1}, {0, 0}};
  EXPECT_EQ(mask, expected);
  EXPECT_EQ(press::chelsea_outlier_heads(share, 0.0),
            (std::vector<std::vector<uint8_t>>{{0, 0}, {0, 0}, {0, 0}}));
  EXPECT_THROW(press::chelsea_outlier_heads(share, 1.5), Error);
}

TEST(CalibrationMeasures, AttentionSimilarityIsOneMinusJensenShannonInBits) {
  const std::vector<float> p = {1, 0, 0.5f, 0.5f};
  const std::vector<float> q = {0, 1, 0.5f, 0.5f};
  // Row 1: disjoint supports -> JS = 1 bit, similarity 0; row 2: identical -> similarity 1.
  EXPECT_NEAR(press::attention_similarity(p, q, 2, 2), 0.5, 1e-12);
  EXPECT_NEAR(press::attention_similarity(p, p, 2, 2), 1.0, 1e-12);
  // JS([1, 0], [0.5, 0.5]) = H(0.75, 0.25) - 0.5 * H(0.5, 0.5) = 0.811278 - 0.5 bits.
  const std::vector<float> a = {1, 0}, b = {0.5f, 0.5f};
  const double h = -(0.75 * std::log2(0.75) + 0.25 * std::log2(0.25));
  EXPECT_NEAR(press::attention_similarity(a, b, 1, 2), 1.0 - (h - 0.5), 1e-7);
  EXPECT_THROW(press::attention_similarity(a, p, 1, 2), Error);
}

TEST(CalibrationMeasures, GreedyGroupingRequiresSimilarityToEveryLayerOfTheBlock) {
  // Layers 0-1-2 chain: 1~0, 2~1 but 2 not ~0 -> 2 opens a block; 3~2 joins it; 4~nothing.
  const auto similarity = [](int x, int y) {
    const int lo = std::min(x, y), hi = std::max(x, y);
    if (hi - lo == 1 && hi != 4) return 0.9;
    return 0.1;
  };
  EXPECT_EQ(press::pod_block_starts(5, similarity, 0.5), (std::vector<int>{0, 0, 2, 2, 4}));
  EXPECT_EQ(press::pod_block_starts(5, similarity, 0.0), (std::vector<int>{0, 0, 0, 0, 0}));
  EXPECT_EQ(press::pod_block_starts(1, similarity, 0.5), (std::vector<int>{0}));
}

}  // namespace
}  // namespace protokv
