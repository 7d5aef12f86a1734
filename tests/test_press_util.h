// SPDX-License-Identifier: Apache-2.0
#pragma once
// Synthetic layers for press tests: random or hand-made Q/K/V in the engine's layout, and the
// invariants every compressed cache must satisfy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "eval/synthetic.h"
#include "protokv/kv_cache.h"
#include "protokv/press.h"
#include "test_util.h"

namespace protokv::testing {

// A press-test layer is eval's SyntheticLayer (the one synthetic-layer type: Q/K/V and positions
// in the engine's layout, and its LayerView) with the tests' shape names: zeros to fill by hand,
// i.i.d. Gaussian (fill_random), or eval::make_synthetic_layer's structured tensors (structured).
struct SyntheticLayer : eval::SyntheticLayer {
  int layer = 0;
  int n_layers = 1;
  int64_t n = 0;
  int d = 0;
  int n_heads = 0;
  int n_kv_heads = 0;

  SyntheticLayer(int64_t tokens, int heads, int kv_heads, int head_dim)
      : n(tokens), d(head_dim), n_heads(heads), n_kv_heads(kv_heads) {
    spec.n_tokens = tokens;
    spec.n_kv_heads = kv_heads;
    spec.group_size = heads / kv_heads;
    spec.head_dim = head_dim;
    q.assign(static_cast<size_t>(heads * tokens * head_dim), 0.0f);
    k.assign(static_cast<size_t>(kv_heads * tokens * head_dim), 0.0f);
    v.assign(k.size(), 0.0f);
    positions.resize(static_cast<size_t>(tokens));
    for (int64_t i = 0; i < tokens; ++i)
      positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    rope = kernels::make_rope_table(head_dim, spec.rope_theta, /*neox=*/false);
  }

  // eval::make_synthetic_layer's tensors (drifting keys, outlier channels, a sink, planted
  // clusters the last queries look for) in this shape.
  static SyntheticLayer structured(int64_t tokens, int heads, int kv_heads, int head_dim,
                                   uint64_t seed) {
    SyntheticLayer layer(tokens, heads, kv_heads, head_dim);
    layer.spec.seed = seed;
    static_cast<eval::SyntheticLayer&>(layer) = eval::make_synthetic_layer(layer.spec);
    return layer;
  }

  void fill_random(uint64_t seed, float q_scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : q) x = q_scale * normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
  }

  float* key(int h, int64_t t) { return k.data() + (static_cast<int64_t>(h) * n + t) * d; }
  float* query(int h, int64_t t) { return q.data() + (static_cast<int64_t>(h) * n + t) * d; }

  LayerView view() const { return eval::SyntheticLayer::view(layer, n_layers); }

  SequenceInfo info() const {
    SequenceInfo info;
    info.n_layers = n_layers;
    info.n_heads = n_heads;
    info.n_kv_heads = n_kv_heads;
    info.head_dim = d;
    info.n_tokens = n;
    return info;
  }

  LayerCache empty_cache() const {
    LayerCache cache;
    cache.heads.assign(static_cast<size_t>(n_kv_heads), HeadCache(d));
    return cache;
  }
};

// A decode step as append() hands it to a press: no attention weights, no output.
inline DecodeStep decode_step(const SyntheticLayer& layer, const float* q, int32_t position,
                              LayerCache& cache) {
  DecodeStep step;
  step.layer = layer.layer;
  step.n_heads = layer.n_heads;
  step.head_dim = layer.d;
  step.position = position;
  step.q = q;
  step.cache = &cache;
  return step;
}

inline Budget entries(int64_t b) {
  Budget budget;
  budget.entries = b;
  return budget;
}

// Every entry of `head` is its input row: position inside the layer, key and value those of that
// token, no log-weight (an evicting or recall press stores rows, it does not merge them).
inline void expect_entries_are_input_rows(const SyntheticLayer& layer, const HeadCache& head,
                                          int h) {
  const auto positions = head.positions();
  for (int64_t e = 0; e < head.size(); ++e) {
    const int64_t t = positions[static_cast<size_t>(e)];
    ASSERT_GE(t, 0);
    ASSERT_LT(t, layer.n);
    const float* k = layer.k.data() + (static_cast<int64_t>(h) * layer.n + t) * layer.d;
    const float* v = layer.v.data() + (static_cast<int64_t>(h) * layer.n + t) * layer.d;
    for (int c = 0; c < layer.d; ++c) {
      ASSERT_EQ(head.key_floats(e)[c], k[c]) << "head " << h << " position " << t;
      ASSERT_EQ(head.value_floats(e)[c], v[c]) << "head " << h << " position " << t;
    }
    EXPECT_EQ(head.log_weights()[static_cast<size_t>(e)], 0.0f);
  }
}

// Kept positions are unique and ascending, the last `window` and the first `sinks` tokens are
// kept, and every stored key/value row equals the input row at its position.
inline void expect_valid_head(const SyntheticLayer& layer, const HeadCache& head, int h,
                              int64_t window, int64_t sinks = 0) {
  const auto positions = head.positions();
  for (size_t i = 1; i < positions.size(); ++i)
    ASSERT_LT(positions[i - 1], positions[i]) << "head " << h << " entry " << i;
  const std::set<int32_t> kept(positions.begin(), positions.end());
  for (int64_t j = layer.n - window; j < layer.n; ++j)
    EXPECT_TRUE(kept.count(static_cast<int32_t>(j))) << "window token " << j << " head " << h;
  for (int64_t j = 0; j < sinks && j < layer.n; ++j)
    EXPECT_TRUE(kept.count(static_cast<int32_t>(j))) << "sink token " << j << " head " << h;
  expect_entries_are_input_rows(layer, head, h);
}

// A recall press's head (clusterkv): every token of the layer stored exactly once, in the press's
// own order (cluster-contiguous), each entry's key, value and position those of its input row.
inline void expect_valid_recall_head(const SyntheticLayer& layer, const HeadCache& head, int h) {
  const auto positions = head.positions();
  ASSERT_EQ(head.size(), layer.n) << "head " << h;
  const std::set<int32_t> stored(positions.begin(), positions.end());
  ASSERT_EQ(static_cast<int64_t>(stored.size()), layer.n) << "head " << h;
  expect_entries_are_input_rows(layer, head, h);
}

// A merging press's head (chelsea): positions unique and ascending; the first `sinks` and last
// `window` tokens kept as their own input rows; every entry's log-weight is log(degree), with
// degree = the tokens it stands for (Press::merged_positions, or 1); and together the entries
// stand for every token of [0, n) exactly once.
inline void expect_valid_merged_head(const SyntheticLayer& layer, const HeadCache& head, int h,
                                     int64_t window, int64_t sinks, const Press& press) {
  const auto positions = head.positions();
  for (size_t i = 1; i < positions.size(); ++i)
    ASSERT_LT(positions[i - 1], positions[i]) << "head " << h << " entry " << i;
  std::vector<int32_t> represented;
  for (int64_t e = 0; e < head.size(); ++e) {
    const int32_t t = positions[static_cast<size_t>(e)];
    const auto members = press.merged_positions(layer.layer, h, e);
    const bool own_row = t < sinks || t >= layer.n - window;
    if (members.empty()) {
      represented.push_back(t);
      EXPECT_EQ(head.log_weights()[static_cast<size_t>(e)], 0.0f) << "position " << t;
    } else {
      EXPECT_FALSE(own_row) << "sink or window token " << t << " was merged, head " << h;
      EXPECT_TRUE(std::binary_search(members.begin(), members.end(), t)) << "position " << t;
      EXPECT_FLOAT_EQ(head.log_weights()[static_cast<size_t>(e)],
                      std::log(static_cast<float>(members.size())));
      represented.insert(represented.end(), members.begin(), members.end());
    }
    if (members.empty() || own_row) {
      const float* k = layer.k.data() + (static_cast<int64_t>(h) * layer.n + t) * layer.d;
      const float* v = layer.v.data() + (static_cast<int64_t>(h) * layer.n + t) * layer.d;
      for (int c = 0; c < layer.d; ++c) {
        ASSERT_EQ(head.key_floats(e)[c], k[c]) << "head " << h << " position " << t;
        ASSERT_EQ(head.value_floats(e)[c], v[c]) << "head " << h << " position " << t;
      }
    }
  }
  std::sort(represented.begin(), represented.end());
  ASSERT_EQ(static_cast<int64_t>(represented.size()), layer.n) << "head " << h;
  for (int64_t t = 0; t < layer.n; ++t)
    ASSERT_EQ(represented[static_cast<size_t>(t)], t) << "head " << h;
  for (int64_t t = 0; t < sinks && t < layer.n; ++t)
    EXPECT_TRUE(std::binary_search(positions.begin(), positions.end(), static_cast<int32_t>(t)));
  for (int64_t t = std::max<int64_t>(0, layer.n - window); t < layer.n; ++t)
    EXPECT_TRUE(std::binary_search(positions.begin(), positions.end(), static_cast<int32_t>(t)));
}

inline std::vector<int32_t> kept_positions(const HeadCache& head) {
  return {head.positions().begin(), head.positions().end()};
}

}  // namespace protokv::testing
