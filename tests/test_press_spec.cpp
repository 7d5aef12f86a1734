// SPDX-License-Identifier: Apache-2.0
// PressSpec: an immutable press configuration that every session turns into its own state. One
// spec serving two interleaved sessions must give each exactly what a press of its own gives.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "press/entry.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
#include "protokv/press_spec.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::make_random_model;
using testing::random_tokens;
using testing::RandomModelSpec;

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// What one sequence produced: its greedy tokens, every step's logits, the kept positions after
// prefill and after the last decode step.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> kept_after_prefill, kept_at_end;  // [layer * kv + head]
};

std::vector<std::vector<int32_t>> kept_positions(const KvCache& cache) {
  std::vector<std::vector<int32_t>> out;
  for (int l = 0; l < cache.n_layers(); ++l)
    for (const HeadCache& head : cache.layer(l).heads)
      out.emplace_back(head.positions().begin(), head.positions().end());
  return out;
}

// Drives one session: prefill, then greedy decode one step at a time.
class Driver {
 public:
  Driver(const ModelWeights& weights, const SessionOptions& options) : session_(weights, options) {}
  void prefill(const std::vector<int32_t>& prompt) {
    record(session_.prefill(prompt));
    trace_.kept_after_prefill = kept_positions(session_.cache());
  }
  void step() { record(session_.decode(trace_.tokens.back())); }
  const Trace& finish() {
    trace_.kept_at_end = kept_positions(session_.cache());
    return trace_;
  }

 private:
  void record(std::span<const float> logits) {
    trace_.logits.emplace_back(logits.begin(), logits.end());
    trace_.tokens.push_back(argmax(logits));
  }
  Session session_;
  Trace trace_;
};

void expect_same(const Trace& actual, const Trace& expected) {
  EXPECT_EQ(actual.tokens, expected.tokens);
  EXPECT_EQ(actual.logits, expected.logits);  // bit-identical: the same computation
  EXPECT_EQ(actual.kept_after_prefill, expected.kept_after_prefill);
  EXPECT_EQ(actual.kept_at_end, expected.kept_at_end);
}

TEST(PressSpec, OneSpecServesTwoInterleavedSessionsForEveryPress) {
  RandomModelSpec model_spec;
  model_spec.n_layers = 4;  // clusterkv leaves its first full_layers = 2 uncompressed
  const auto model = make_random_model(model_spec);
  constexpr int kPrompt = 120, kSteps = 10;
  const auto prompt_a = random_tokens(kPrompt, model_spec.vocab_size, 31);
  const auto prompt_b = random_tokens(kPrompt - 17, model_spec.vocab_size, 32);

  // Every registered press with its defaults, and the decode-time variants that keep state
  // across decode steps (h2o's evictions, clusterkv's re-clustering).
  std::vector<std::string> texts;
  for (const press::PressEntry* entry : press::press_table())
    // chelsea's default 16 sinks + 64 recent entries exceed this budget.
    texts.emplace_back(std::string(entry->name) + (entry->merges ? ":sinks=4,recent=8" : ""));
  texts.push_back("h2o:decode=1");
  texts.push_back("clusterkv:recluster=3,decode_clusters=2");

  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    SessionOptions shared_options;
    shared_options.press = PressSpec::parse(text);
    shared_options.budget.entries = 48;

    // The reference: each sequence with a spec (and so a press) of its own, one after the other.
    const auto own_trace = [&](const std::vector<int32_t>& prompt) {
      SessionOptions own = shared_options;
      own.press = PressSpec::parse(text);
      Driver driver(model.weights, own);
      driver.prefill(prompt);
      for (int s = 0; s < kSteps; ++s) driver.step();
      return driver.finish();
    };
    const Trace expected_a = own_trace(prompt_a);
    const Trace expected_b = own_trace(prompt_b);

    // One spec, two sessions, prefill and decode steps interleaved.
    Driver a(model.weights, shared_options), b(model.weights, shared_options);
    a.prefill(prompt_a);
    b.prefill(prompt_b);
    for (int s = 0; s < kSteps; ++s) {
      b.step();
      a.step();
    }
    expect_same(a.finish(), expected_a);
    expect_same(b.finish(), expected_b);
    // The press really compressed (full keeps everything at any budget, clusterkv stores
    // everything and recalls, pod keeps every entry and shares keys).
    const press::PressEntry* entry = press::find_press_entry(shared_options.press->name());
    if (entry != nullptr && entry->compresses && !entry->recalls && !entry->shares_keys) {
      EXPECT_LT(expected_a.kept_after_prefill.back().size(), size_t{kPrompt});
    }
  }
}

TEST(PressSpec, EachPrefillStartsFromAFreshState) {
  // A session re-used for a second prompt behaves like a new session on that prompt.
  const auto model = make_random_model({});
  const auto first = random_tokens(90, 300, 41), second = random_tokens(70, 300, 42);
  SessionOptions options;
  options.press = PressSpec::parse("h2o:decode=1");
  options.budget.entries = 24;
  Session reused(model.weights, options), fresh(model.weights, options);
  reused.prefill(first);
  for (int s = 0; s < 5; ++s) reused.decode(s + 1);
  ASSERT_NE(reused.press(), nullptr);
  const auto fresh_logits = fresh.prefill(second);
  const std::vector<float> expected(fresh_logits.begin(), fresh_logits.end());
  const auto logits = reused.prefill(second);
  EXPECT_EQ(std::vector<float>(logits.begin(), logits.end()), expected);
  for (int s = 0; s < 5; ++s) {
    const auto x = reused.decode(s + 7);
    const std::vector<float> got(x.begin(), x.end());
    const auto y = fresh.decode(s + 7);
    EXPECT_EQ(got, std::vector<float>(y.begin(), y.end())) << s;
  }
  reused.reset();
  EXPECT_EQ(reused.press(), nullptr);
}

TEST(PressSpec, ParseValidatesOnceAndReportsTheResolvedOptions) {
  const auto spec = PressSpec::parse("snapkv:window=16", "pyramid");
  EXPECT_EQ(spec->name(), "snapkv");
  EXPECT_EQ(spec->text(), "snapkv:window=16");
  EXPECT_EQ(spec->config(), make_press("snapkv:window=16", "pyramid")->config());
  EXPECT_EQ(spec->config()["window"], 16);
  EXPECT_EQ(spec->config()["allocator"], "pyramid");
  // Two states of one spec are distinct objects with the same options.
  const auto a = spec->instantiate(), b = spec->instantiate();
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(a->config(), b->config());
  EXPECT_EQ(PressSpec::parse("pyramidkv")->name(), "pyramidkv");

  EXPECT_THROW(PressSpec::parse("nosuch"), Error);
  EXPECT_THROW(PressSpec::parse("snapkv:windw=3"), Error);
  EXPECT_THROW(PressSpec::parse("snapkv:window=x"), Error);
  EXPECT_THROW(PressSpec::parse("streaming_llm", "pyramid"), Error);
  EXPECT_THROW(PressSpec::from_factory(nullptr), Error);
}

}  // namespace
}  // namespace protokv
