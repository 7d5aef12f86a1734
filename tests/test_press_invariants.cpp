// SPDX-License-Identifier: Apache-2.0
// Invariants every method and allocator must satisfy on every head of every layer: the budget is
// met exactly (or the allocator's per-head numbers, which sum to the expected total), the window
// (and sinks) are kept, positions are unique and ascending (a recall press's clustered layers:
// every token once, in its own order), rows are the input rows, and the KV bytes are exactly what
// the budget promises.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <ostream>
#include <set>
#include <string>

#include "press/entry.h"
#include "protokv/press/allocator.h"
#include "protokv/press/options.h"
#include "protokv/press/scores.h"
#include "protokv/press_registry.h"
#include "protokv/threads.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

struct MethodCase {
  std::string spec;
  std::string alloc;  // empty: the method's default
  press::AllocatorKind kind;
  int64_t window;
  int64_t sinks = 0;
  int beta = 20;
  bool recalls = false;      // stores everything, attends to the budget (clusterkv)
  bool merges = false;       // entries may stand for several tokens (chelsea)
  bool shares_keys = false;  // every value, B keys at layers that share keys (pod)
};

void PrintTo(const MethodCase& c, std::ostream* os) {
  *os << c.spec << " --alloc '" << c.alloc << "'";
}

// Every compressing method of the press table with its defaults (window and sinks as its
// config() records them, the allocator its entry fixes), so a new press is covered once it is
// registered; then variants of options and allocators.
std::vector<MethodCase> all_methods() {
  using press::AllocatorKind;
  std::vector<MethodCase> cases;
  for (const press::PressEntry* entry : press::press_table()) {
    if (!entry->compresses) continue;
    if (entry->merges) {
      // chelsea's 16 sinks + 64 recent entries exceed these tests' budgets: small ones here.
      cases.push_back({std::string(entry->name) + ":sinks=4,recent=8", "", entry->fixed_allocator,
                       8, 4, 20, entry->recalls, true});
      continue;
    }
    const auto config = make_press(entry->name)->config();
    cases.push_back({std::string(entry->name), "", entry->fixed_allocator,
                     config.value("window", int64_t{0}), config.value("sinks", int64_t{0}), 20,
                     entry->recalls, entry->merges, entry->shares_keys});
  }
  const std::vector<MethodCase> variants = {
      {"streaming_llm:sinks=2", "", AllocatorKind::Uniform, 0, 2},
      {"h2o:decode=1,gqa=max", "", AllocatorKind::Uniform, 20},  // recent = B/2 = 20
      {"h2o", "adakv", AllocatorKind::AdaKv, 8},
      {"snapkv:pool_type=avg,gqa=sum,window=4", "", AllocatorKind::Uniform, 4},
      {"snapkv", "pyramid", AllocatorKind::Pyramid, 8},
      {"pyramidkv:beta=4,window=6", "", AllocatorKind::Pyramid, 6, 0, 4},
      {"adakv:normalise=1,floor=0.5", "", AllocatorKind::AdaKv, 8},
      {"protokv:deviation=neighbourhood", "", AllocatorKind::Uniform, 8},
      {"protokv:deviation=neighbourhood,kappa=2", "", AllocatorKind::Uniform, 8},
      {"protokv:score=sum_logits", "", AllocatorKind::Uniform, 8},
      {"protokv:select=clusters", "", AllocatorKind::Uniform, 8},
      {"protokv:score=sum_logits,select=clusters", "", AllocatorKind::Uniform, 8},
      {"protokv:prototypes=chunk", "", AllocatorKind::Uniform, 8},
      {"protokv:prototypes=lsh", "", AllocatorKind::Uniform, 8},
      {"protokv:chunks=3,lsh_bits=3,irregular=40,pool=1", "", AllocatorKind::Uniform, 8},
      {"protokv:chunk_len=4,max_chunks=20,pool_type=avg,gqa=max", "", AllocatorKind::Uniform, 8},
      {"protokv", "adakv", AllocatorKind::AdaKv, 8},
      {"protokv:select=clusters", "pyramid", AllocatorKind::Pyramid, 8},
      {"pod:delta=0", "", AllocatorKind::Uniform, 0, 16, 20, false, false, true},
      {"pod:sinks=4,queries=3", "", AllocatorKind::Uniform, 0, 4, 20, false, false, true},
  };
  cases.insert(cases.end(), variants.begin(), variants.end());
  return cases;
}

// The table's defaults as this test expects them: a press whose window or allocator the cases
// above read wrongly would be tested against the wrong invariants.
TEST(PressTable, DefaultCasesMatchTheKnownDefaults) {
  const std::vector<MethodCase> cases = all_methods();
  auto find = [&cases](const std::string& spec) {
    for (const auto& c : cases)
      if (c.spec == spec && c.alloc.empty()) return c;
    ADD_FAILURE() << spec << " has no default case";
    return MethodCase{};
  };
  EXPECT_EQ(find("streaming_llm").sinks, 4);
  EXPECT_EQ(find("streaming_llm").window, 0);
  EXPECT_EQ(find("h2o").window, 8);
  EXPECT_EQ(find("snapkv").window, 8);
  EXPECT_EQ(find("protokv").window, 8);
  EXPECT_EQ(find("pyramidkv").kind, press::AllocatorKind::Pyramid);
  EXPECT_EQ(find("adakv").kind, press::AllocatorKind::AdaKv);
  EXPECT_EQ(find("snapkv").kind, press::AllocatorKind::Uniform);
}

class EveryMethod : public ::testing::TestWithParam<MethodCase> {};

TEST_P(EveryMethod, KeepsExactlyTheBudgetWithWindowSortedRowsAndExactBytes) {
  const MethodCase& method = GetParam();
  constexpr int kLayers = 4, kHeads = 8, kKvHeads = 2, kDim = 16;
  constexpr int64_t kTokens = 200, kBudget = 40;
  auto press = make_press(method.spec, method.alloc);
  SyntheticLayer shape(kTokens, kHeads, kKvHeads, kDim);
  shape.n_layers = kLayers;
  press->begin(shape.info(), testing::entries(kBudget));
  const auto pyramid =
      press::pyramid_layer_budgets(kBudget, method.window, kTokens, kLayers, method.beta);
  for (int l = 0; l < kLayers; ++l) {
    // Realistic layers (sink, clusters, outlier channels) from the one synthetic-layer builder.
    SyntheticLayer layer =
        SyntheticLayer::structured(kTokens, kHeads, kKvHeads, kDim, 100 + static_cast<uint64_t>(l));
    layer.layer = l;
    layer.n_layers = kLayers;
    LayerCache cache = layer.empty_cache();
    press->compress_prefill(layer.view(), cache);
    if (method.recalls) {
      // Every entry stored; each query head of a selecting layer attends exactly the budget,
      // distinct entries, the sinks among them.
      EXPECT_EQ(cache.kv_bytes(), static_cast<size_t>(kTokens * kKvHeads * kDim * 2 * 4));
      // Clustered layers are stored cluster-contiguous (any order), the others in token order.
      for (int h = 0; h < kKvHeads; ++h) {
        if (press->selects(l))
          testing::expect_valid_recall_head(layer, cache.heads[static_cast<size_t>(h)], h);
        else
          testing::expect_valid_head(layer, cache.heads[static_cast<size_t>(h)], h, 0);
      }
      if (!press->selects(l)) continue;
      std::vector<int32_t> chosen;
      for (int qh = 0; qh < kHeads; ++qh) {
        press->select(l, qh, layer.query(qh, kTokens - 1),
                      cache.heads[static_cast<size_t>(qh / (kHeads / kKvHeads))], chosen);
        EXPECT_EQ(static_cast<int64_t>(chosen.size()), kBudget) << method.spec;
        const std::set<int32_t> unique(chosen.begin(), chosen.end());
        EXPECT_EQ(unique.size(), chosen.size());
        EXPECT_GE(*unique.begin(), 0);
        EXPECT_LT(*unique.rbegin(), kTokens);
        for (int32_t e = 0; e < method.sinks; ++e) EXPECT_TRUE(unique.count(e));
      }
      continue;
    }
    if (method.shares_keys) {
      // Every entry keeps its value and its row; a head that shares keys holds B of them (the
      // sinks and the last B - sinks) and reads the distant ones from a lower layer.
      size_t expected_bytes = 0;
      for (int h = 0; h < kKvHeads; ++h) {
        const HeadCache& head = cache.heads[static_cast<size_t>(h)];
        ASSERT_EQ(head.size(), kTokens) << method.spec;
        for (int64_t e = 0; e < kTokens; ++e) {
          ASSERT_EQ(head.positions()[static_cast<size_t>(e)], e);
          ASSERT_EQ(head.value_floats(e)[0],
                    layer.v[static_cast<size_t>((h * kTokens + e) * kDim)]);
          if (!head.key_is_shared(e)) {
            ASSERT_EQ(head.key_floats(e)[kDim - 1],
                      layer.k[static_cast<size_t>((h * kTokens + e) * kDim + kDim - 1)]);
          }
        }
        if (head.shares_keys()) {
          EXPECT_EQ(head.shared_begin(), method.sinks);
          EXPECT_EQ(head.shared_end(), kTokens - (kBudget - method.sinks));
          EXPECT_LT(head.key_lender(), l);
        }
        expected_bytes +=
            static_cast<size_t>((kTokens + (head.shares_keys() ? kBudget : kTokens)) * kDim * 4);
      }
      EXPECT_EQ(cache.kv_bytes(), expected_bytes);
      continue;
    }
    int64_t total = 0;
    for (int h = 0; h < kKvHeads; ++h) {
      SCOPED_TRACE(method.spec + " --alloc '" + method.alloc + "' layer " + std::to_string(l) +
                   " head " + std::to_string(h));
      const HeadCache& head = cache.heads[static_cast<size_t>(h)];
      if (method.merges)
        testing::expect_valid_merged_head(layer, head, h, method.window, method.sinks, *press);
      else
        testing::expect_valid_head(layer, head, h, method.window, method.sinks);
      total += head.size();
      switch (method.kind) {
        case press::AllocatorKind::Uniform:
          EXPECT_EQ(head.size(), kBudget);
          break;
        case press::AllocatorKind::Pyramid:
          EXPECT_EQ(head.size(), pyramid[static_cast<size_t>(l)]);
          break;
        case press::AllocatorKind::AdaKv:
          EXPECT_GE(head.size(), method.window);
          EXPECT_LE(head.size(), kTokens);
          break;
      }
    }
    if (method.kind != press::AllocatorKind::Pyramid) {
      EXPECT_EQ(total, kBudget * kKvHeads) << method.spec;
      // GQA: the cache is held per KV head, so bytes = B * n_kv_heads * d * (K + V) * 4.
      EXPECT_EQ(cache.kv_bytes(), static_cast<size_t>(kBudget * kKvHeads * kDim * 2 * 4));
    } else {
      EXPECT_EQ(cache.kv_bytes(),
                static_cast<size_t>(pyramid[static_cast<size_t>(l)] * kKvHeads * kDim * 2 * 4));
    }
  }
}

TEST_P(EveryMethod, BudgetCoveringThePromptKeepsEverything) {
  const MethodCase& method = GetParam();
  SyntheticLayer layer(60, 4, 2, 8);
  layer.fill_random(7);
  for (const int64_t budget : {int64_t{60}, int64_t{65}}) {
    auto press = make_press(method.spec, method.alloc);
    press->begin(layer.info(), testing::entries(budget));
    LayerCache cache = layer.empty_cache();
    press->compress_prefill(layer.view(), cache);
    for (int h = 0; h < layer.n_kv_heads; ++h) {
      const HeadCache& head = cache.heads[static_cast<size_t>(h)];
      ASSERT_EQ(head.size(), layer.n) << method.spec;
      testing::expect_valid_head(layer, head, h, layer.n);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Press, EveryMethod, ::testing::ValuesIn(all_methods()),
                         [](const ::testing::TestParamInfo<MethodCase>& info) {
                           return "case" + std::to_string(info.index);
                         });

TEST(FullPress, KeepsEveryEntry) {
  SyntheticLayer layer(50, 4, 4, 8);
  layer.fill_random(3);
  auto press = make_press("full");
  press->begin(layer.info(), testing::entries(10));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    ASSERT_EQ(cache.heads[static_cast<size_t>(h)].size(), layer.n);
    testing::expect_valid_head(layer, cache.heads[static_cast<size_t>(h)], h, layer.n);
  }
}

TEST(StreamingLlm, KeepsSinksAndTheMostRecentTokensExactly) {
  SyntheticLayer layer(30, 2, 1, 4);
  layer.fill_random(5);
  auto press = make_press("streaming_llm:sinks=3");
  press->begin(layer.info(), testing::entries(10));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  const std::vector<int32_t> expected = {0, 1, 2, 23, 24, 25, 26, 27, 28, 29};
  EXPECT_EQ(testing::kept_positions(cache.heads[0]), expected);
}

// The presses parallelise their per-head loops only for layers of at least
// press::kParallelMinElements floats (n_tokens * n_heads * head_dim); every other test runs the
// serial branch. Here a layer at the threshold runs the OpenMP branch with 1 and with 2 threads
// (also under ASan/UBSan in CI): the kept entries must be identical, as each head's work is
// independent of the others.
std::string split_press_spec_name(const std::string& spec) {
  return press::split_press_spec(spec).first;
}

TEST(ParallelBranch, EveryPressAboveTheThresholdKeepsTheSameEntriesWithOneOrTwoThreads) {
  constexpr int64_t kTokens = 1024;
  constexpr int kHeads = 8, kKvHeads = 2, kDim = 32;
  SyntheticLayer layer(kTokens, kHeads, kKvHeads, kDim);
  layer.n_layers = 3;
  layer.layer = 1;
  layer.fill_random(314, 1.5f);
  ASSERT_TRUE(press::worth_parallel(layer.view()));
  std::vector<std::string> specs = {"h2o:decode=1"};
  for (const press::PressEntry* entry : press::press_table())
    // A recall press keeps everything; its per-head work is the clustering, which this layer
    // (layer 1) gets with full_layers=1. Compared below through each query head's selection.
    if (entry->compresses)
      specs.emplace_back(std::string(entry->name) + (entry->recalls ? ":full_layers=1" : ""));
  for (const std::string& spec : specs) {
    const press::PressEntry* entry = press::find_press_entry(split_press_spec_name(spec));
    const bool recalls = entry->recalls;
    std::vector<std::vector<int32_t>> kept[2];
    for (const int threads : {1, 2}) {
      set_threads(threads);
      auto press = make_press(spec);
      press->begin(layer.info(), testing::entries(96));
      if (entry->shares_keys) {
        // A key-sharing press groups layers bottom-up (pod): the same tensors as layer 0 first,
        // so that layer 1 (identical attention) shares layer 0's keys.
        SyntheticLayer lower = layer;
        lower.layer = 0;
        LayerCache lower_cache = lower.empty_cache();
        press->compress_prefill(lower.view(), lower_cache);
      }
      LayerCache cache = layer.empty_cache();
      press->compress_prefill(layer.view(), cache);
      for (int h = 0; h < kKvHeads; ++h) {
        const HeadCache& head = cache.heads[static_cast<size_t>(h)];
        if (entry->shares_keys) {
          EXPECT_TRUE(head.shares_keys()) << spec;
          kept[threads - 1].push_back({static_cast<int32_t>(head.shared_begin()),
                                       static_cast<int32_t>(head.shared_end()), head.key_lender()});
          continue;
        }
        if (entry->merges)
          testing::expect_valid_merged_head(layer, head, h, 1, 0, *press);
        else if (recalls)
          testing::expect_valid_recall_head(layer, head, h);
        else  // the press's own recent window (knorm keeps none, as kvpress), else the newest
          testing::expect_valid_head(layer, head, h, press->config().value("window", 1));
        kept[threads - 1].push_back(testing::kept_positions(head));
      }
      if (!recalls) continue;
      ASSERT_TRUE(press->selects(1)) << spec;
      std::vector<int32_t> chosen;
      for (int qh = 0; qh < kHeads; ++qh) {
        press->select(1, qh, layer.q.data() + (int64_t{qh} * kTokens + kTokens - 1) * kDim,
                      cache.heads[static_cast<size_t>(qh / (kHeads / kKvHeads))], chosen);
        EXPECT_EQ(chosen.size(), 96u) << spec;
        kept[threads - 1].push_back(chosen);
      }
    }
    EXPECT_EQ(kept[0], kept[1]) << spec;
    if (!recalls && !entry->shares_keys) {
      EXPECT_LT(kept[0][0].size(), static_cast<size_t>(kTokens)) << spec;
    }
  }
  set_threads(0);  // back to the default: all hardware threads
}

TEST(StreamingLlm, KeepsOriginalPositionsAndNeverEvictsDuringDecode) {
  // docs/methods.md: entries keep the positions they were rotated with (no re-indexing inside
  // the cache), and the cache grows by one entry per decoded token.
  SyntheticLayer layer(30, 2, 1, 4);
  layer.fill_random(6);
  auto press = make_press("streaming_llm:sinks=2");
  press->begin(layer.info(), testing::entries(6));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  EXPECT_EQ(testing::kept_positions(cache.heads[0]), (std::vector<int32_t>{0, 1, 26, 27, 28, 29}));
  std::vector<float> q(8, 0.25f), kv(4, 0.5f);
  for (int step = 0; step < 5; ++step) {
    cache.heads[0].append(kv.data(), kv.data(), 30 + step);
    press->on_decode(testing::decode_step(layer, q.data(), 30 + step, cache));
    EXPECT_EQ(cache.heads[0].size(), 7 + step);
  }
  EXPECT_EQ(cache.heads[0].positions().front(), 0);
  EXPECT_EQ(cache.heads[0].positions()[2], 26);
}

TEST(RatioBudget, ResolvesAgainstThePromptLength) {
  SyntheticLayer layer(100, 4, 2, 8);
  layer.fill_random(11);
  Budget ratio;
  ratio.ratio = 0.25;
  auto press = make_press("snapkv");
  press->begin(layer.info(), ratio);
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  for (const auto& head : cache.heads) EXPECT_EQ(head.size(), 25);
}

}  // namespace
}  // namespace protokv
