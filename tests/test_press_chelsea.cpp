// SPDX-License-Identifier: Apache-2.0
// Chelsea (§5, Appendix C; DESIGN §5 chelsea): merge steps on hand-made inputs, the
// attention of merged exact duplicates, the degree bias, the ratio schedule, outlier heads, a
// brute-force double reference of one full compression, decode-time re-runs and bad options.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kernels/kernels.h"
#include "press/chelsea.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "protokv/press_registry.h"
#include "protokv/tokenizer.h"
#include "test_press_util.h"
#include "test_util.h"

namespace protokv {
namespace {

using press::ChelseaLayout;
using press::ChelseaOptions;
using press::ChelseaPress;
using press::ChelseaSchedule;
using press::MergedHead;
using testing::SyntheticLayer;

MergedHead head_of(int d, const std::vector<std::vector<float>>& keys,
                   const std::vector<std::vector<float>>& values) {
  MergedHead head;
  head.head_dim = d;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto position = static_cast<int32_t>(i);
    head.append(keys[i].data(), values[i].data(), position, std::span(&position, 1));
  }
  return head;
}

std::vector<float> random_vector(std::mt19937_64& rng, int d) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(d));
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(Chelsea, MergingExactDuplicatesKeepsTheirKeyValueAndAttentionOutput) {
  // Entries 0..5 (one chunk, no sinks or recent): entry 3 (A) duplicates entry 2 (B) exactly, the
  // others are random, so the most similar link is 3 -> 2 and one merge takes exactly it.
  constexpr int d = 16;
  std::mt19937_64 rng(5);
  std::vector<std::vector<float>> keys, values;
  for (int i = 0; i < 6; ++i) {
    keys.push_back(random_vector(rng, d));
    values.push_back(random_vector(rng, d));
  }
  keys[3] = keys[2];
  values[3] = values[2];
  MergedHead head = head_of(d, keys, values);
  const ChelseaLayout layout{.sinks = 0, .recent = 0, .chunk = 6};
  ASSERT_EQ(press::chelsea_merge_step(head, layout, 0.5, 1), 1);
  ASSERT_EQ(head.size(), 5);
  EXPECT_EQ(head.degree(2), 2);
  EXPECT_EQ(head.positions, (std::vector<int32_t>{0, 1, 2, 4, 5}));
  for (int c = 0; c < d; ++c) {  // degree-weighted mean of two equal rows: the row itself
    EXPECT_EQ(head.keys[2 * d + c], keys[2][c]);
    EXPECT_EQ(head.values[2 * d + c], values[2][c]);
  }
  // Attention over the 6 original entries vs the 5 entries with + log 2 on the merged one
  // (Chelsea Eq. 2), for many queries, through the engine's decode kernel.
  std::vector<float> flat_k, flat_v;
  for (int i = 0; i < 6; ++i) {
    flat_k.insert(flat_k.end(), keys[static_cast<size_t>(i)].begin(),
                  keys[static_cast<size_t>(i)].end());
    flat_v.insert(flat_v.end(), values[static_cast<size_t>(i)].begin(),
                  values[static_cast<size_t>(i)].end());
  }
  const std::vector<float> log_weights = {0, 0, std::log(2.0f), 0, 0};
  float largest_unbiased_error = 0.0f;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> q = random_vector(rng, d);
    for (float& x : q) x *= 1.0f + static_cast<float>(trial % 5);  // sharp and flat softmaxes
    std::vector<float> full(d), merged(d);
    kernels::attention_decode(q.data(), flat_k.data(), flat_v.data(), nullptr, 6, d, full.data(),
                              nullptr);
    kernels::attention_decode(q.data(), head.keys.data(), head.values.data(), log_weights.data(), 5,
                              d, merged.data(), nullptr);
    for (int c = 0; c < d; ++c) EXPECT_NEAR(merged[c], full[c], 1e-5f * (1 + std::fabs(full[c])));
    // Without the degree bias the duplicate pair is under-weighted: the outputs differ.
    std::vector<float> unbiased(d);
    kernels::attention_decode(q.data(), head.keys.data(), head.values.data(), nullptr, 5, d,
                              unbiased.data(), nullptr);
    for (int c = 0; c < d; ++c)
      largest_unbiased_error = std::max(largest_unbiased_error, std::fabs(unbiased[c] - full[c]));
  }
  EXPECT_GT(largest_unbiased_error, 1e-2f);
}

TEST(Chelsea, MergedKeysAndValuesAreDegreeWeightedMeans) {
  // Entry 0 (B) already stands for 3 tokens, entry 1 (A) for 1: the merge weights them 3:1.
  MergedHead head;
  head.head_dim = 2;
  const float k0[] = {2, 0}, v0[] = {4, 8}, k1[] = {1, 1}, v1[] = {0, 4};
  const int32_t m0[] = {0, 1, 2}, m1[] = {5};
  head.append(k0, v0, 1, m0);
  head.append(k1, v1, 5, m1);
  ASSERT_EQ(press::chelsea_merge_step(head, ChelseaLayout{0, 0, 8}, 0.5, 10), 1);
  ASSERT_EQ(head.size(), 1);
  EXPECT_EQ(head.positions[0], 1);  // stored under the B entry's position
  EXPECT_EQ(head.degree(0), 4);
  EXPECT_FLOAT_EQ(head.keys[0], (3 * 2 + 1 * 1) / 4.0f);
  EXPECT_FLOAT_EQ(head.keys[1], (3 * 0 + 1 * 1) / 4.0f);
  EXPECT_FLOAT_EQ(head.values[0], (3 * 4 + 0) / 4.0f);
  EXPECT_FLOAT_EQ(head.values[1], (3 * 8 + 4) / 4.0f);
  EXPECT_EQ(head.members, (std::vector<int32_t>{0, 1, 2, 5}));
}

TEST(Chelsea, RatioScheduleFollowsAppendixC) {
  const ChelseaSchedule llama2 = press::chelsea_schedule_preset("llama2");
  const ChelseaSchedule llama3 = press::chelsea_schedule_preset("llama3");
  const ChelseaSchedule qwen = press::chelsea_schedule_preset("qwen");
  const double expected2[] = {0.45, 0.40, 0.35, 0.30, 0.30, 0.30};
  const double expected3[] = {0.35, 0.25, 0.15, 0.15};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(llama2.ratio(i), expected2[i], 1e-12) << i;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(llama3.ratio(i), expected3[i], 1e-12) << i;
  // qwen reaches 0 at i = 2; "restricted to exceed 0": it stays at 0.1.
  EXPECT_NEAR(qwen.ratio(0), 0.2, 1e-12);
  EXPECT_NEAR(qwen.ratio(1), 0.1, 1e-12);
  EXPECT_NEAR(qwen.ratio(5), 0.1, 1e-12);
  EXPECT_EQ(ChelseaSchedule({0.9, 0.0, 0}).ratio(0), 0.5);  // at most every A
  EXPECT_THROW(press::chelsea_schedule_preset("llama4"), Error);
}

TEST(Chelsea, AStepMergesFloorOfRatioTimesTheMiddleAndCompressionMeetsTheBudget) {
  constexpr int d = 8;
  std::mt19937_64 rng(9);
  std::vector<std::vector<float>> keys, values;
  for (int i = 0; i < 120; ++i) {
    keys.push_back(random_vector(rng, d));
    values.push_back(random_vector(rng, d));
  }
  const ChelseaLayout layout{.sinks = 4, .recent = 16, .chunk = 32};  // middle: 100 entries
  MergedHead head = head_of(d, keys, values);
  EXPECT_EQ(press::chelsea_merge_step(head, layout, 0.35, 1000), 35);
  EXPECT_EQ(head.size(), 85);
  EXPECT_EQ(press::chelsea_merge_step(head, layout, 0.35, 3), 3);  // capped by max_merges
  EXPECT_EQ(head.size(), 82);
  MergedHead all = head_of(d, keys, values);
  press::chelsea_compress(all, layout, press::chelsea_schedule_preset("llama2"), 30);
  EXPECT_EQ(all.size(), 30);
  EXPECT_EQ(all.members.size(), 120u);
}

// Brute force in double, straight from Chelsea §5: clusters as member sets, keys and values as
// degree-weighted means of the original rows, cosine similarities over all A x B pairs of each
// chunk.
struct ReferenceEntry {
  std::vector<int32_t> members;
  std::vector<double> key, value;
};

std::vector<ReferenceEntry> reference_compress(const SyntheticLayer& layer, int h,
                                               const ChelseaLayout& layout,
                                               const ChelseaSchedule& schedule, int64_t budget) {
  const int d = layer.d;
  std::vector<ReferenceEntry> entries;
  for (int64_t t = 0; t < layer.n; ++t) {
    ReferenceEntry e{{static_cast<int32_t>(t)}, {}, {}};
    for (int c = 0; c < d; ++c) {
      e.key.push_back(layer.k[static_cast<size_t>((h * layer.n + t) * d + c)]);
      e.value.push_back(layer.v[static_cast<size_t>((h * layer.n + t) * d + c)]);
    }
    entries.push_back(e);
  }
  const auto cosine = [d](const std::vector<double>& x, const std::vector<double>& y) {
    double xy = 0, xx = 0, yy = 0;
    for (int c = 0; c < d; ++c) {
      xy += x[static_cast<size_t>(c)] * y[static_cast<size_t>(c)];
      xx += x[static_cast<size_t>(c)] * x[static_cast<size_t>(c)];
      yy += y[static_cast<size_t>(c)] * y[static_cast<size_t>(c)];
    }
    return xx > 0 && yy > 0 ? xy / std::sqrt(xx * yy) : 0.0;
  };
  for (int step = 0; static_cast<int64_t>(entries.size()) > budget; ++step) {
    const auto size = static_cast<int64_t>(entries.size());
    const int64_t first = std::min(size, layout.sinks);
    const int64_t last = std::max(first, size - layout.recent);
    struct Link {
      int64_t a, b;
      double similarity;
    };
    std::vector<Link> links;
    for (int64_t begin = first; begin < last; begin += layout.chunk) {
      const int64_t end = std::min(last, begin + layout.chunk);
      for (int64_t a = begin + 1; a < end; a += 2) {
        Link best{a, -1, -3.0};
        for (int64_t b = begin; b < end; b += 2) {
          const double s =
              cosine(entries[static_cast<size_t>(a)].key, entries[static_cast<size_t>(b)].key);
          if (s > best.similarity) best = {a, b, s};
        }
        links.push_back(best);
      }
    }
    std::sort(links.begin(), links.end(), [](const Link& x, const Link& y) {
      return x.similarity != y.similarity ? x.similarity > y.similarity : x.a < y.a;
    });
    auto count = static_cast<int64_t>(std::floor(schedule.ratio(step) * (last - first)));
    count = std::min({count, size - budget, static_cast<int64_t>(links.size())});
    count = std::max<int64_t>(count, 1);
    std::map<int64_t, std::vector<int64_t>> merged_into;
    std::set<int64_t> removed;
    for (int64_t i = 0; i < count; ++i) {
      merged_into[links[static_cast<size_t>(i)].b].push_back(links[static_cast<size_t>(i)].a);
      removed.insert(links[static_cast<size_t>(i)].a);
    }
    std::vector<ReferenceEntry> next;
    for (int64_t e = 0; e < size; ++e) {
      if (removed.count(e)) continue;
      ReferenceEntry out = entries[static_cast<size_t>(e)];
      if (merged_into.count(e)) {
        std::vector<int64_t> group = {e};
        for (int64_t a : merged_into[e]) group.push_back(a);
        double degree = 0;
        std::fill(out.key.begin(), out.key.end(), 0.0);
        std::fill(out.value.begin(), out.value.end(), 0.0);
        out.members.clear();
        for (int64_t x : group) {
          const ReferenceEntry& in = entries[static_cast<size_t>(x)];
          const auto n = static_cast<double>(in.members.size());
          degree += n;
          for (int c = 0; c < d; ++c) {
            out.key[static_cast<size_t>(c)] += n * in.key[static_cast<size_t>(c)];
            out.value[static_cast<size_t>(c)] += n * in.value[static_cast<size_t>(c)];
          }
          out.members.insert(out.members.end(), in.members.begin(), in.members.end());
        }
        for (double& x : out.key) x /= degree;
        for (double& x : out.value) x /= degree;
        std::sort(out.members.begin(), out.members.end());
      }
      next.push_back(std::move(out));
    }
    entries = std::move(next);
  }
  return entries;
}

TEST(Chelsea, OneFullCompressionEqualsABruteForceDoubleReference) {
  constexpr int64_t kTokens = 300, kBudget = 60;
  SyntheticLayer layer(kTokens, 4, 2, 8);
  layer.fill_random(21);
  // Smooth neighbouring keys (the paper's localized similarity) so that merged entries merge again.
  for (int h = 0; h < 2; ++h)
    for (int64_t t = 1; t < kTokens; ++t)
      for (int c = 0; c < 8; ++c)
        layer.key(h, t)[c] = 0.6f * layer.key(h, t - 1)[c] + 0.4f * layer.key(h, t)[c];
  auto press = make_press("chelsea:sinks=4,recent=8,chunk=32,schedule=llama2,outliers=0");
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  const ChelseaLayout layout{.sinks = 4, .recent = 8, .chunk = 32};
  for (int h = 0; h < 2; ++h) {
    SCOPED_TRACE("head " + std::to_string(h));
    const auto expected =
        reference_compress(layer, h, layout, press::chelsea_schedule_preset("llama2"), kBudget);
    const HeadCache& head = cache.heads[static_cast<size_t>(h)];
    ASSERT_EQ(head.size(), static_cast<int64_t>(expected.size()));
    int64_t merged = 0;
    for (int64_t e = 0; e < head.size(); ++e) {
      const ReferenceEntry& ref = expected[static_cast<size_t>(e)];
      const auto members = press->merged_positions(0, h, e);
      const std::vector<int32_t> got =
          members.empty() ? std::vector<int32_t>{head.positions()[static_cast<size_t>(e)]}
                          : std::vector<int32_t>(members.begin(), members.end());
      ASSERT_EQ(got, ref.members) << "entry " << e;
      merged += ref.members.size() > 1;
      EXPECT_FLOAT_EQ(head.log_weights()[static_cast<size_t>(e)],
                      static_cast<float>(std::log(static_cast<double>(ref.members.size()))));
      for (int c = 0; c < layer.d; ++c) {
        EXPECT_NEAR(head.key_floats(e)[c], ref.key[static_cast<size_t>(c)], 1e-5);
        EXPECT_NEAR(head.value_floats(e)[c], ref.value[static_cast<size_t>(c)], 1e-5);
      }
    }
    EXPECT_GT(merged, 10);
    // Several steps ran: some entry stands for more than two tokens.
    EXPECT_TRUE(std::any_of(expected.begin(), expected.end(),
                            [](const ReferenceEntry& e) { return e.members.size() > 2; }));
  }
}

TEST(Chelsea, OutlierHeadsKeepTheirFullCache) {
  constexpr int64_t kTokens = 200;
  SyntheticLayer layer(kTokens, 4, 2, 8);
  layer.fill_random(4);
  // Head 0: near-copies of one key (every link ~1); head 1: random keys (few links >= 0.8).
  for (int64_t t = 0; t < kTokens; ++t)
    for (int c = 0; c < 8; ++c) layer.key(0, t)[c] = 1.0f + 0.01f * layer.key(1, t)[c];
  {
    // Measured on the prompt: half the heads -> one of layer 0's two heads, the random one.
    // reallocate=0: the other head keeps B whatever the outlier holds.
    auto press = make_press("chelsea:sinks=4,recent=8,outliers=0.5,reallocate=0");
    press->begin(layer.info(), testing::entries(40));
    LayerCache cache = layer.empty_cache();
    press->compress_prefill(layer.view(), cache);
    auto& chelsea = dynamic_cast<ChelseaPress&>(*press);
    EXPECT_LT(chelsea.unlinked_share(0, 0), chelsea.unlinked_share(0, 1));
    EXPECT_FALSE(chelsea.is_outlier(0, 0));
    EXPECT_TRUE(chelsea.is_outlier(0, 1));
    EXPECT_EQ(cache.heads[0].size(), 40);
    ASSERT_EQ(cache.heads[1].size(), kTokens);
    testing::expect_valid_head(layer, cache.heads[1], 1, kTokens);
  }
  {
    // From a profile mask (the `profile=FILE` seam): head 0 is the outlier whatever its keys.
    ChelseaOptions options;
    options.layout = {.sinks = 4, .recent = 8, .chunk = 256};
    options.outlier_heads = std::vector<std::vector<uint8_t>>{{1, 0}};
    options.reallocate = false;
    ChelseaPress press(options);
    press.begin(layer.info(), testing::entries(40));
    LayerCache cache = layer.empty_cache();
    press.compress_prefill(layer.view(), cache);
    ASSERT_EQ(cache.heads[0].size(), kTokens);
    testing::expect_valid_head(layer, cache.heads[0], 0, kTokens);
    EXPECT_EQ(cache.heads[1].size(), 40);
    EXPECT_EQ(press.config()["outlier_source"], "profile");
    EXPECT_EQ(press.config()["outlier_heads"], nlohmann::json::parse("[[1, 0]]"));
    // A mask of the wrong shape is refused.
    options.outlier_heads = std::vector<std::vector<uint8_t>>{{1, 0, 0}};
    ChelseaPress wrong(options);
    EXPECT_THROW(wrong.begin(layer.info(), testing::entries(40)), Error);
  }
}

// Chelsea App. C.2: "we reallocate the budget between layers and heads to keep the total budget
// consistent across all methods": the outlier head's full cache comes out of the other's budget.
TEST(Chelsea, ReallocationPaysTheOutlierHeadsFullCacheFromTheOtherHeads) {
  constexpr int64_t kTokens = 200;
  SyntheticLayer layer(kTokens, 4, 2, 8);
  layer.fill_random(4);
  auto press = make_press("chelsea:sinks=4,recent=8,outliers=0.5");
  EXPECT_EQ(press->config()["reallocate"], true);
  // Two heads at B = 150 hold 300 entries: the outlier 200, the other 100.
  press->begin(layer.info(), testing::entries(150));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  auto& chelsea = dynamic_cast<ChelseaPress&>(*press);
  const int outlier = chelsea.is_outlier(0, 0) ? 0 : 1;
  ASSERT_TRUE(chelsea.is_outlier(0, outlier));
  EXPECT_EQ(cache.heads[static_cast<size_t>(outlier)].size(), kTokens);
  EXPECT_EQ(cache.heads[static_cast<size_t>(1 - outlier)].size(), 100);
  // B = 100 leaves nothing for the other head: refused, naming the smallest budget that works,
  // ceil((200 + 13) / 2) = 107 (13 = sinks + recent + 1).
  try {
    press->begin(layer.info(), testing::entries(100));
    FAIL() << "a budget that leaves the other head nothing was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a budget of at least 107"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(press->begin(layer.info(), testing::entries(107)));
}

TEST(Chelsea, OutlierQuotaAcrossLayersMatchesTheGlobalFraction) {
  // 10 layers x 2 KV heads, outliers=0.25: 5 heads in all, at most one per layer here.
  SyntheticLayer shape(120, 2, 2, 8);
  shape.n_layers = 10;
  auto press = make_press("chelsea:sinks=4,recent=8,outliers=0.25");
  press->begin(shape.info(), testing::entries(40));
  auto& chelsea = dynamic_cast<ChelseaPress&>(*press);
  int outliers = 0;
  for (int l = 0; l < 10; ++l) {
    SyntheticLayer layer(120, 2, 2, 8);
    layer.n_layers = 10;
    layer.layer = l;
    layer.fill_random(50 + static_cast<uint64_t>(l));
    LayerCache cache = layer.empty_cache();
    press->compress_prefill(layer.view(), cache);
    for (int h = 0; h < 2; ++h) outliers += chelsea.is_outlier(l, h);
  }
  EXPECT_EQ(outliers, 5);
}

TEST(Chelsea, DecodeReRunsAtBudgetPlusIntervalAndKeepsEveryToken) {
  constexpr int64_t kTokens = 100, kBudget = 30, kInterval = 5;
  SyntheticLayer layer(kTokens, 2, 1, 8);
  layer.fill_random(8);
  auto press = make_press("chelsea:sinks=2,recent=4,chunk=16,interval=5,outliers=0");
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  ASSERT_EQ(cache.heads[0].size(), kBudget);
  std::mt19937_64 rng(3);
  std::vector<float> q(16, 0.1f);
  for (int step = 0; step < 23; ++step) {
    const auto k = random_vector(rng, 8), v = random_vector(rng, 8);
    const auto position = static_cast<int32_t>(kTokens + step);
    cache.heads[0].append(k.data(), v.data(), position);
    press->on_decode(testing::decode_step(layer, q.data(), position, cache));
    const int64_t size = cache.heads[0].size();
    EXPECT_LT(size, kBudget + kInterval);
    // Entries after a re-run: the budget; the new token is among the recent ones, unmerged.
    if ((step + 1) % kInterval == 0) {
      EXPECT_EQ(size, kBudget) << "step " << step;
    }
    EXPECT_EQ(cache.heads[0].positions().back(), position);
    std::vector<int32_t> represented;
    for (int64_t e = 0; e < size; ++e) {
      const auto members = press->merged_positions(0, 0, e);
      if (members.empty())
        represented.push_back(cache.heads[0].positions()[static_cast<size_t>(e)]);
      else
        represented.insert(represented.end(), members.begin(), members.end());
      const float expected =
          members.empty() ? 0.0f
                          : static_cast<float>(std::log(static_cast<double>(members.size())));
      EXPECT_FLOAT_EQ(cache.heads[0].log_weights()[static_cast<size_t>(e)], expected);
    }
    std::sort(represented.begin(), represented.end());
    ASSERT_EQ(static_cast<int64_t>(represented.size()), kTokens + step + 1);
    for (size_t i = 0; i < represented.size(); ++i)
      ASSERT_EQ(represented[i], static_cast<int32_t>(i));
  }
}

// The decode re-run merges the cache head in place (no copy, no allocation); it must give
// bit for bit what compressing a copy of the same entries with chelsea_compress gives (the
// MergedHead path prefill uses): keys, values, positions, log-weights and members.
TEST(Chelsea, DecodeReRunInPlaceIsBitIdenticalToCompressingACopy) {
  constexpr int64_t kTokens = 400, kBudget = 90, kInterval = 7;
  constexpr int kDim = 8;
  SyntheticLayer layer(kTokens, 2, 2, kDim);
  layer.fill_random(12);
  for (int h = 0; h < 2; ++h)  // neighbouring keys alike, so that merged entries merge again
    for (int64_t t = 1; t < kTokens; ++t)
      for (int c = 0; c < kDim; ++c)
        layer.key(h, t)[c] = 0.7f * layer.key(h, t - 1)[c] + 0.3f * layer.key(h, t)[c];
  const std::string spec = "chelsea:sinks=3,recent=6,chunk=24,interval=7,outliers=0";
  auto press = make_press(spec);
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  const ChelseaLayout layout{.sinks = 3, .recent = 6, .chunk = 24};
  const ChelseaSchedule schedule = press::chelsea_schedule_preset("llama3");
  std::mt19937_64 rng(5);
  std::vector<float> q(static_cast<size_t>(2 * kDim), 0.1f);
  int re_runs = 0;
  for (int step = 0; step < 4 * kInterval; ++step) {
    const auto position = static_cast<int32_t>(kTokens + step);
    std::vector<MergedHead> expected;
    for (HeadCache& head : cache.heads) {
      const auto k = random_vector(rng, kDim), v = random_vector(rng, kDim);
      head.append(k.data(), v.data(), position);
      // The same entries as a MergedHead, compressed the way prefill does.
      MergedHead copy;
      copy.head_dim = kDim;
      for (int64_t e = 0; e < head.size(); ++e) {
        const auto h = static_cast<int>(&head - cache.heads.data());
        auto members = press->merged_positions(0, h, e);
        const int32_t own = head.positions()[static_cast<size_t>(e)];
        if (members.empty()) members = std::span<const int32_t>(&own, 1);
        copy.append(head.key_floats(e).data(), head.value_floats(e).data(), own, members);
      }
      if (head.size() >= kBudget + kInterval)
        press::chelsea_compress(copy, layout, schedule, kBudget);
      expected.push_back(std::move(copy));
    }
    press->on_decode(testing::decode_step(layer, q.data(), position, cache));
    re_runs += cache.heads[0].size() == kBudget ? 1 : 0;
    for (int h = 0; h < 2; ++h) {
      SCOPED_TRACE("step " + std::to_string(step) + " head " + std::to_string(h));
      const HeadCache& head = cache.heads[static_cast<size_t>(h)];
      const MergedHead& want = expected[static_cast<size_t>(h)];
      ASSERT_EQ(head.size(), want.size());
      for (int64_t e = 0; e < head.size(); ++e) {
        ASSERT_EQ(std::memcmp(head.key_floats(e).data(), want.keys.data() + e * kDim,
                              kDim * sizeof(float)),
                  0)
            << "entry " << e;
        ASSERT_EQ(std::memcmp(head.value_floats(e).data(), want.values.data() + e * kDim,
                              kDim * sizeof(float)),
                  0)
            << "entry " << e;
        ASSERT_EQ(head.positions()[static_cast<size_t>(e)], want.positions[static_cast<size_t>(e)]);
        const int64_t degree = want.degree(e);
        const float log_weight =
            degree > 1 ? static_cast<float>(std::log(static_cast<double>(degree))) : 0.0f;
        ASSERT_EQ(head.log_weights()[static_cast<size_t>(e)], log_weight) << "entry " << e;
        const auto members = press->merged_positions(0, h, e);
        if (degree > 1)
          ASSERT_TRUE(
              std::equal(members.begin(), members.end(),
                         want.members.begin() + want.member_offsets[static_cast<size_t>(e)],
                         want.members.begin() + want.member_offsets[static_cast<size_t>(e) + 1]));
        else
          ASSERT_TRUE(members.empty());
      }
    }
  }
  EXPECT_EQ(re_runs, 4);
}

TEST(ChelseaCache, CompactKeepsAscendingRowsInPlaceWithoutReallocating) {
  constexpr int kDim = 4;
  HeadCache head(kDim);
  head.reserve(16);
  for (int i = 0; i < 10; ++i) {
    const std::vector<float> k(kDim, static_cast<float>(i)), v(kDim, static_cast<float>(-i));
    head.append(k.data(), v.data(), 100 + i, i == 7 ? 1.5f : 0.0f);
  }
  const void* keys_before = head.key_rows();
  const std::vector<int32_t> kept = {0, 2, 3, 7, 9};
  head.compact(kept);
  ASSERT_EQ(head.size(), 5);
  EXPECT_EQ(head.key_rows(), keys_before);  // no reallocation: the head grows back during decode
  for (int64_t i = 0; i < head.size(); ++i) {
    const int src = kept[static_cast<size_t>(i)];
    EXPECT_EQ(head.key_floats(i)[kDim - 1], static_cast<float>(src));
    EXPECT_EQ(head.value_floats(i)[0], static_cast<float>(-src));
    EXPECT_EQ(head.positions()[static_cast<size_t>(i)], 100 + src);
    EXPECT_EQ(head.log_weights()[static_cast<size_t>(i)], src == 7 ? 1.5f : 0.0f);
  }
  EXPECT_TRUE(head.has_log_weights());
  head.compact(std::vector<int32_t>{0, 1, 2});  // drops the merged entry: no log-weight left
  EXPECT_FALSE(head.has_log_weights());
  EXPECT_THROW(head.compact(std::vector<int32_t>{1, 0}), Error);
  EXPECT_THROW(head.compact(std::vector<int32_t>{0, 0}), Error);
  EXPECT_THROW(head.compact(std::vector<int32_t>{3}), Error);
  EXPECT_THROW(head.compact(std::vector<int32_t>{-1}), Error);
  EXPECT_EQ(head.size(), 3);  // a rejected call leaves the head as it was
}

TEST(Chelsea, DecodeReRunsInTheEngineKeepHeadsBelowBudgetPlusInterval) {
  PROTOKV_REQUIRE_STORIES();
  const auto dir = testing::stories_dir();
  const LoadedModel model =
      load_model((dir / "stories260K.bin").string(), (dir / "tok512.bin").string());
  std::vector<int32_t> prompt = model.tokenizer->encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friend Tom. One day, they found a big red ball under a tree.",
      true);
  SessionOptions options;
  options.press = PressSpec::parse("chelsea:sinks=4,recent=8,interval=6,outliers=0");
  options.budget.entries = 20;
  Session session(model.weights, options);
  auto logits = session.prefill(prompt);
  for (int step = 0; step < 30; ++step) {
    const auto token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = session.decode(token);
    for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
    for (int l = 0; l < session.cache().n_layers(); ++l)
      for (const HeadCache& head : session.cache().layer(l).heads) EXPECT_LT(head.size(), 26);
  }
}

TEST(Chelsea, OptionsHaveDefaultsAndBadOnesFailWithOneLine) {
  const auto config = make_press("chelsea")->config();
  EXPECT_EQ(config["sinks"], 16);
  EXPECT_EQ(config["recent"], 64);
  EXPECT_EQ(config["chunk"], 256);
  EXPECT_EQ(config["interval"], 64);
  EXPECT_EQ(config["schedule"], "llama3");
  EXPECT_DOUBLE_EQ(config["r_init"].get<double>(), 0.35);
  EXPECT_DOUBLE_EQ(config["alpha"].get<double>(), 0.1);
  EXPECT_EQ(config["steps"], 2);
  EXPECT_DOUBLE_EQ(config["outliers"].get<double>(), 0.04);
  EXPECT_DOUBLE_EQ(config["threshold"].get<double>(), 0.8);
  EXPECT_EQ(config["outlier_source"], "prompt, per layer");
  EXPECT_EQ(config["training_free"], true);
  EXPECT_EQ(make_press("chelsea:schedule=llama2,r_init=0.3")->config()["alpha"], 0.05);
  EXPECT_EQ(make_press("chelsea:outliers=0")->config()["outlier_source"], "none");
  for (const char* bad :
       {"chelsea:chunk=1", "chelsea:interval=0", "chelsea:schedule=gpt", "chelsea:r_init=0",
        "chelsea:r_init=0.6", "chelsea:outliers=1.5", "chelsea:threshold=2", "chelsea:sinks=-1",
        "chelsea:window=8", "chelsea:steps=x"}) {
    SCOPED_TRACE(bad);
    try {
      make_press(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("chelsea"), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  EXPECT_THROW(make_press("chelsea", "adakv"), Error);
  // A budget without room beside the sinks and recent entries.
  SyntheticLayer layer(200, 2, 1, 8);
  auto press = make_press("chelsea");
  EXPECT_THROW(press->begin(layer.info(), testing::entries(80)), Error);
  EXPECT_NO_THROW(press->begin(layer.info(), testing::entries(81)));
  EXPECT_NO_THROW(press->begin(layer.info(), testing::entries(200)));  // nothing to compress
}

}  // namespace
}  // namespace protokv
