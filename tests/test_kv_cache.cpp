// SPDX-License-Identifier: Apache-2.0
// The ragged KV cache (src/cache/kv_cache.cpp), head by head, on entries whose rows encode their
// token: entry t of a fresh head has key {t, t + 0.5}, value {-t, 10 t} and position 100 + t.
#include "protokv/kv_cache.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "protokv/error.h"

namespace protokv {
namespace {

constexpr int kDim = 2;

HeadCache head_of(int n, int weighted = -1) {
  HeadCache head(kDim);
  for (int t = 0; t < n; ++t) {
    const std::vector<float> k = {float(t), float(t) + 0.5f}, v = {-float(t), 10.0f * t};
    head.append(k.data(), v.data(), 100 + t, t == weighted ? 0.25f : 0.0f);
  }
  return head;
}

// The tokens of the entries, read back from positions, keys and values (which must agree).
std::vector<int> tokens_of(const HeadCache& head) {
  std::vector<int> out;
  for (int64_t e = 0; e < head.size(); ++e) {
    const int t = head.positions()[static_cast<size_t>(e)] - 100;
    if (!head.key_is_shared(e)) {
      EXPECT_EQ(head.key(e)[0], float(t));
      EXPECT_EQ(head.key(e)[1], float(t) + 0.5f);
    }
    EXPECT_EQ(head.value(e)[0], -float(t));
    EXPECT_EQ(head.value(e)[1], 10.0f * t);
    out.push_back(t);
  }
  return out;
}

TEST(HeadCache, AppendKeepAndBytes) {
  HeadCache head = head_of(5, 3);
  EXPECT_EQ(head.size(), 5);
  EXPECT_TRUE(head.has_log_weights());
  EXPECT_EQ(head.kv_bytes(), 5u * kDim * 2 * sizeof(float));
  EXPECT_EQ(head.meta_bytes(), 5u * (sizeof(int32_t) + sizeof(float)));
  head.keep(std::vector<int32_t>{4, 1, 2});  // any order, kept as given
  EXPECT_EQ(tokens_of(head), (std::vector<int>{4, 1, 2}));
  EXPECT_FALSE(head.has_log_weights());  // entry 3, the weighted one, went
  EXPECT_EQ(head.kv_bytes(), 3u * kDim * 2 * sizeof(float));
  head.clear();
  EXPECT_TRUE(head.empty());
  EXPECT_EQ(head.kv_bytes(), 0u);
}

TEST(HeadCache, AssignRowsTakesRowsOfALayerTensor) {
  const std::vector<float> keys = {0, 0.5f, 1, 1.5f, 2, 2.5f}, values = {0, 0, -1, 10, -2, 20};
  const std::vector<int32_t> positions = {100, 101, 102};
  HeadCache head = head_of(1, 0);
  head.assign_rows(keys.data(), values.data(), positions.data(), std::vector<int32_t>{2, 0});
  EXPECT_EQ(tokens_of(head), (std::vector<int>{2, 0}));
  EXPECT_FALSE(head.has_log_weights());
  EXPECT_EQ(head.log_weights().size(), 2u);
}

TEST(HeadCache, ReorderPermutesRowsPositionsAndWeightsInPlace) {
  HeadCache head = head_of(6, 4);
  const float* keys_before = head.keys();
  head.reorder(2, std::vector<int32_t>{2, 0, 3, 1});  // entries 2..5 become 4, 2, 5, 3
  EXPECT_EQ(head.keys(), keys_before);                // in place
  const std::vector<int32_t> expected = {100, 101, 104, 102, 105, 103};
  EXPECT_EQ(std::vector<int32_t>(head.positions().begin(), head.positions().end()), expected);
  for (int64_t e = 0; e < 6; ++e) {
    const float t = static_cast<float>(expected[static_cast<size_t>(e)] - 100);
    EXPECT_EQ(head.key(e)[0], t);
    EXPECT_EQ(head.key(e)[1], t + 0.5f);
    EXPECT_EQ(head.value(e)[0], -t);
    EXPECT_EQ(head.value(e)[1], 10.0f * t);
    EXPECT_EQ(head.log_weights()[static_cast<size_t>(e)], t == 4 ? 0.25f : 0.0f);
  }
  EXPECT_THROW(head.reorder(3, std::vector<int32_t>{0, 1, 2, 3}), Error);  // past the end
  EXPECT_THROW(head.reorder(0, std::vector<int32_t>{0, 0}), Error);        // not a permutation
  EXPECT_THROW(head.reorder(0, std::vector<int32_t>{0, 2}), Error);
}

TEST(HeadCache, CompactKeepsAscendingEntriesInPlace) {
  HeadCache head = head_of(6, 4);
  const float* keys_before = head.keys();
  head.compact(std::vector<int32_t>{1, 4, 5});
  EXPECT_EQ(head.keys(), keys_before);  // no reallocation
  EXPECT_EQ(tokens_of(head), (std::vector<int>{1, 4, 5}));
  EXPECT_TRUE(head.has_log_weights());
  EXPECT_EQ(head.log_weights()[1], 0.25f);
  // A rejected call leaves the head as it was.
  EXPECT_THROW(head.compact(std::vector<int32_t>{2, 1}), Error);  // not ascending
  EXPECT_THROW(head.compact(std::vector<int32_t>{0, 3}), Error);  // out of range
  EXPECT_EQ(tokens_of(head), (std::vector<int>{1, 4, 5}));
}

TEST(HeadCache, DropPositionsBeforeAWindow) {
  HeadCache head = head_of(6);
  head.keep(std::vector<int32_t>{5, 0, 3, 1});
  EXPECT_EQ(head.drop_positions_before(103), 2);  // tokens 0 and 1
  EXPECT_EQ(tokens_of(head), (std::vector<int>{5, 3}));
  EXPECT_EQ(head.drop_positions_before(103), 0);
}

TEST(HeadCache, SharedKeysAreReadFromTheLenderAsThreeSegments) {
  const HeadCache lender = head_of(6);
  HeadCache head = head_of(6);
  head.share_keys(/*lender=*/0, 2, 4);
  EXPECT_TRUE(head.shares_keys());
  EXPECT_EQ(head.key_lender(), 0);
  EXPECT_EQ(head.kv_bytes(), (4u + 6u) * kDim * sizeof(float));  // 2 keys fewer
  EXPECT_EQ(tokens_of(head), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  std::array<KeySegment, 3> segments;
  const float query[kDim] = {1, 1};
  ASSERT_EQ(head.key_segments(lender, segments, query), 3);
  EXPECT_EQ(segments[0].count, 2);
  EXPECT_EQ(segments[0].keys[2], 1.0f);  // held: tokens 0, 1
  EXPECT_EQ(segments[1].count, 2);
  EXPECT_EQ(segments[1].keys, lender.key(2));  // borrowed: tokens 2, 3
  EXPECT_EQ(segments[1].query, nullptr);       // the head did not ask for the lender's query
  EXPECT_EQ(segments[2].count, 2);
  EXPECT_EQ(segments[2].keys[0], 4.0f);  // held: tokens 4, 5
  // Decode: tokens leaving a recent window join the shared range (released in batches).
  head.extend_shared_keys(5);
  ASSERT_EQ(head.key_segments(lender, segments), 3);
  EXPECT_EQ(segments[1].count, 3);
  EXPECT_EQ(segments[2].count, 1);
  EXPECT_EQ(segments[2].keys[0], 5.0f);
  EXPECT_THROW(head.extend_shared_keys(4), Error);  // shrinking
  EXPECT_THROW(head.keep(std::vector<int32_t>{0}), Error);
  EXPECT_THROW(head.share_keys(0, 0, 1), Error);  // shares already
  // A lender too short, or sharing keys itself, cannot lend.
  EXPECT_THROW(head.key_segments(head_of(3), segments), Error);
  EXPECT_THROW(head.key_segments(head, segments), Error);
}

TEST(HeadCache, LenderQueryGoesWithTheBorrowedSegmentOnly) {
  const HeadCache lender = head_of(4);
  HeadCache head = head_of(4);
  head.share_keys(0, 0, 4, /*lender_query=*/true);
  EXPECT_TRUE(head.uses_lender_query());
  std::array<KeySegment, 3> segments;
  const float query[kDim] = {1, 1};
  ASSERT_EQ(head.key_segments(lender, segments, query), 1);
  EXPECT_EQ(segments[0].keys, lender.keys());
  EXPECT_EQ(segments[0].count, 4);
  EXPECT_EQ(segments[0].query, query);
  EXPECT_EQ(head.kv_bytes(), 4u * kDim * sizeof(float));  // values only
  EXPECT_THROW(head_of(2).share_keys(0, 1, 3), Error);    // past the end
}

TEST(KvCache, TotalsOverLayersAndHeads) {
  KvCache cache(3, 2, kDim);
  EXPECT_EQ(cache.n_layers(), 3);
  EXPECT_EQ(cache.n_kv_heads(), 2);
  cache.layer(1).heads[0] = head_of(4);
  cache.layer(2).heads[1] = head_of(2);
  EXPECT_EQ(cache.total_entries(), 6);
  EXPECT_EQ(cache.kv_bytes(), 6u * kDim * 2 * sizeof(float));
  EXPECT_EQ(cache.meta_bytes(), 6u * (sizeof(int32_t) + sizeof(float)));
  EXPECT_EQ(cache.layer(1).kv_bytes(), 4u * kDim * 2 * sizeof(float));
  cache.clear();
  EXPECT_EQ(cache.total_entries(), 0);
  EXPECT_EQ(cache.n_layers(), 3);
}

}  // namespace
}  // namespace protokv
