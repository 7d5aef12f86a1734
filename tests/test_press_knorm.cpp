// SPDX-License-Identifier: Apache-2.0
// Knorm (kvpress's KnormPress): the entries with the smallest key norms, per KV head, on
// hand-made keys whose answer is known.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

// Key j of head h has norm norms[h][j] (all of it on one coordinate, sign alternating, so that
// only the norm, not the direction or the sign, can decide).
SyntheticLayer layer_with_key_norms(const std::vector<std::vector<float>>& norms) {
  const int kv_heads = static_cast<int>(norms.size());
  const auto n = static_cast<int64_t>(norms[0].size());
  SyntheticLayer layer(n, 2 * kv_heads, kv_heads, 4);
  layer.fill_random(11);
  for (int h = 0; h < kv_heads; ++h)
    for (int64_t j = 0; j < n; ++j) {
      float* key = layer.k.data() + (h * n + j) * layer.d;
      for (int c = 0; c < layer.d; ++c) key[c] = 0.0f;
      key[j % layer.d] =
          (j % 2 == 0 ? 1.0f : -1.0f) * norms[static_cast<size_t>(h)][static_cast<size_t>(j)];
    }
  return layer;
}

TEST(Knorm, KeepsTheSmallestKeyNormsOfEachKvHead) {
  const SyntheticLayer layer = layer_with_key_norms({
      {5, 1, 7, 0.5f, 9, 2, 8, 3},     // smallest three: 3 (0.5), 1 (1), 5 (2)
      {1, 9, 9, 9, 0.1f, 9, 0.2f, 9},  // smallest three: 4, 6, 0
  });
  auto press = make_press("knorm");
  EXPECT_EQ(press->config()["window"], 0);  // kvpress keeps no window
  press->begin(layer.info(), testing::entries(3));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  EXPECT_EQ(testing::kept_positions(cache.heads[0]), (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(testing::kept_positions(cache.heads[1]), (std::vector<int32_t>{0, 4, 6}));
  for (int h = 0; h < 2; ++h)
    testing::expect_valid_head(layer, cache.heads[static_cast<size_t>(h)], h, 0);
}

TEST(Knorm, AWindowKeepsTheNewestTokensBesideTheSmallestNorms) {
  const SyntheticLayer layer = layer_with_key_norms({{5, 1, 7, 0.5f, 9, 2, 8, 3}});
  auto press = make_press("knorm:window=2");
  press->begin(layer.info(), testing::entries(4));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  // The window (6, 7) plus the two smallest norms of the prefix [0, 6): 3 and 1.
  EXPECT_EQ(testing::kept_positions(cache.heads[0]), (std::vector<int32_t>{1, 3, 6, 7}));
}

TEST(Knorm, ComposesWithAnAllocator) {
  // adakv's global top-k over both heads: head 1's norms are all smaller, so it gets more.
  const SyntheticLayer layer = layer_with_key_norms({
      {5, 6, 7, 8, 9, 6, 8, 7},
      {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f},
  });
  auto press = make_press("knorm", "adakv");
  press->begin(layer.info(), testing::entries(4));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  EXPECT_LT(cache.heads[0].size(), cache.heads[1].size());
  EXPECT_EQ(cache.heads[0].size() + cache.heads[1].size(), int64_t{8});
}

}  // namespace
}  // namespace protokv
