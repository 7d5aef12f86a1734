// SPDX-License-Identifier: Apache-2.0
// End to end on the real stories260K model (5 layers, 8 query heads, 4 KV heads, head_dim 8):
// every method generates without error at budgets 16, 32, 64, 128 of a 400-token prompt, the KV
// bytes after prefill are exactly what the budget promises, and a budget covering the prompt gives
// output bit-identical to no press.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "protokv/engine.h"
#include "protokv/model.h"
#include "protokv/press/allocator.h"
#include "protokv/press_spec.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

constexpr int64_t kPromptTokens = 400;

struct Stories {
  LoadedModel model;
  std::vector<int32_t> prompt;  // [kPromptTokens]
};

const Stories& stories() {
  static const Stories loaded = [] {
    Stories s;
    const auto dir = testing::stories_dir();
    s.model = load_model((dir / "stories260K.bin").string(), (dir / "tok512.bin").string());
    const std::string text =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friend Tom. One day, they found a big red ball under a tree. Lily said, "
        "\"Let's play with the ball!\" Tom was happy and they played all day. ";
    std::string long_text;
    while (s.prompt.size() < static_cast<size_t>(kPromptTokens)) {
      long_text += text;
      s.prompt = s.model.tokenizer->encode(long_text, true);
    }
    s.prompt.resize(static_cast<size_t>(kPromptTokens));
    return s;
  }();
  return loaded;
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct E2eCase {
  std::string spec;
  std::string alloc;
};

TEST(PressEndToEnd, EveryMethodGeneratesAndKvBytesMatchTheBudget) {
  PROTOKV_REQUIRE_STORIES();
  const Stories& s = stories();
  const ModelConfig& config = s.model.weights.config;
  // One entry of one KV head: its key and value rows.
  const size_t entry_bytes = static_cast<size_t>(config.head_dim()) * 2 * sizeof(float);
  const std::vector<E2eCase> cases = {
      {"full", ""},
      {"streaming_llm", ""},
      {"h2o", ""},
      {"h2o:decode=1", ""},
      {"snapkv", ""},
      {"pyramidkv", ""},
      {"adakv", ""},
      {"protokv", ""},
      {"protokv:deviation=neighbourhood", ""},
      {"protokv:score=sum_logits,select=clusters", ""},
      {"protokv:prototypes=chunk", ""},
      {"protokv:prototypes=lsh", ""},
      {"protokv", "adakv"},
      {"protokv", "pyramid"},
      {"clusterkv:sinks=4", ""},
      {"chelsea:sinks=4,recent=8,outliers=0", ""},
      {"pod:sinks=4", ""},
      {"pod:delta=0,sinks=8", ""},
  };
  // Under sanitizers (slow), the smallest and largest budgets and fewer decode steps.
  const bool sanitized = std::getenv("PROTOKV_SANITIZED") != nullptr;
  const int kSteps = sanitized ? 2 : 8;
  const std::vector<int64_t> budgets =
      sanitized ? std::vector<int64_t>{16, 128} : std::vector<int64_t>{16, 32, 64, 128};
  for (const auto& c : cases) {
    for (const int64_t budget : budgets) {
      SCOPED_TRACE(c.spec + " --alloc '" + c.alloc + "' --budget " + std::to_string(budget));
      SessionOptions options;
      options.press = PressSpec::parse(c.spec, c.alloc);
      options.budget.entries = budget;
      Session session(s.model.weights, options);
      int32_t token = argmax(session.prefill(s.prompt));

      // Entries per layer (every KV head together) that the budget promises.
      int64_t expected_entries = 0;
      const bool recalls = c.spec.starts_with("clusterkv");
      const bool shares_keys = c.spec.starts_with("pod");
      if (shares_keys) {
        // Every entry's value stays; heads that share keys hold B keys, the others all.
        expected_entries = config.n_layers * config.n_kv_heads * kPromptTokens;
        size_t expected_bytes = 0;
        int sharing = 0;
        for (int l = 0; l < config.n_layers; ++l)
          for (const HeadCache& head : session.cache().layer(l).heads) {
            sharing += head.shares_keys() ? 1 : 0;
            expected_bytes +=
                static_cast<size_t>(kPromptTokens + (head.shares_keys() ? budget : kPromptTokens)) *
                entry_bytes / 2;
          }
        // With delta = 0 every layer above the first shares its keys.
        if (c.spec != "pod:sinks=4") {
          EXPECT_EQ(sharing, (config.n_layers - 1) * config.n_kv_heads);
        }
        EXPECT_EQ(session.cache().kv_bytes(), expected_bytes);
      } else if (c.spec == "full" ||
                 recalls) {  // clusterkv stores everything, attends to the budget
        expected_entries = config.n_layers * config.n_kv_heads * kPromptTokens;
      } else if (c.spec == "pyramidkv" || c.alloc == "pyramid") {
        for (const int64_t keep :
             press::pyramid_layer_budgets(budget, 8, kPromptTokens, config.n_layers, 20))
          expected_entries += keep * config.n_kv_heads;
      } else {
        expected_entries = static_cast<int64_t>(config.n_layers) * config.n_kv_heads * budget;
      }
      if (!shares_keys) {
        EXPECT_EQ(session.cache().kv_bytes(), static_cast<size_t>(expected_entries) * entry_bytes);
      }
      EXPECT_EQ(session.prefill_stats().kv_bytes, session.cache().kv_bytes());
      EXPECT_EQ(session.cache().total_entries(), expected_entries);

      for (int step = 0; step < kSteps; ++step) {
        const auto logits = session.decode(token);
        ASSERT_EQ(logits.size(), static_cast<size_t>(config.vocab_size));
        for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
        token = argmax(logits);
      }
      // Decode appends one entry per head per step, except H2O's decode-time eviction, which
      // keeps every head at its budget.
      const int64_t growth =
          c.spec == "h2o:decode=1" ? 0 : kSteps * config.n_layers * config.n_kv_heads;
      EXPECT_EQ(session.cache().total_entries(), expected_entries + growth);
      // Attended bytes of the last step: dense attention reads the whole cache (before H2O's
      // eviction, which follows attention); clusterkv's layers >= 2 read B per query head plus
      // the tokens decoded since prefill, its first two layers everything.
      const size_t attended = session.prefill_stats().decode_attended_kv_bytes;
      if (recalls) {
        const int64_t entries = config.n_kv_heads * (2 * (kPromptTokens + kSteps) +
                                                     (config.n_layers - 2) * (budget + kSteps));
        EXPECT_EQ(attended, static_cast<size_t>(entries) * entry_bytes);
        EXPECT_LT(attended, session.cache().kv_bytes());
      } else if (shares_keys) {
        // PoD attends every entry (distant keys read from the block's lowest layer).
        EXPECT_EQ(attended, static_cast<size_t>(expected_entries + growth) * entry_bytes);
      } else if (c.spec != "h2o:decode=1") {
        EXPECT_EQ(attended, session.cache().kv_bytes());
      }
    }
  }
}

TEST(PressEndToEnd, BudgetCoveringThePromptIsBitIdenticalToNoPress) {
  PROTOKV_REQUIRE_STORIES();
  const Stories& s = stories();
  Session reference(s.model.weights);
  const auto ref_prefill = reference.prefill(s.prompt);
  std::vector<float> expected(ref_prefill.begin(), ref_prefill.end());
  std::vector<std::vector<float>> expected_steps;
  int32_t token = argmax(expected);
  for (int step = 0; step < 4; ++step) {
    const auto logits = reference.decode(token);
    expected_steps.emplace_back(logits.begin(), logits.end());
    token = argmax(logits);
  }
  for (const std::string spec : {"snapkv", "protokv", "h2o:decode=1", "streaming_llm", "adakv",
                                 "clusterkv", "chelsea", "pod"}) {
    SCOPED_TRACE(spec);
    SessionOptions options;
    options.press = PressSpec::parse(spec);
    options.budget.entries = kPromptTokens;
    Session session(s.model.weights, options);
    const auto logits = session.prefill(s.prompt);
    ASSERT_TRUE(std::equal(logits.begin(), logits.end(), expected.begin()));
    int32_t next = argmax(logits);
    for (int step = 0; step < 4; ++step) {
      const auto step_logits = session.decode(next);
      ASSERT_TRUE(std::equal(step_logits.begin(), step_logits.end(),
                             expected_steps[static_cast<size_t>(step)].begin()))
          << "step " << step;
      next = argmax(step_logits);
    }
  }
}

}  // namespace
}  // namespace protokv
