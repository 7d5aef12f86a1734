// SPDX-License-Identifier: Apache-2.0
// PrefilledPrompt: a prompt run once, then compressed by any number of sessions, each equal bit for
// bit to a session that prefilled the tokens itself (compression never changes the prompt's own
// forward pass), for every press, in one chunk or several, on a model with sliding-window layers
// too; continuing with decode gives the same logits.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/random_model.h"
#include "press/entry.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press_spec.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

std::vector<int32_t> prompt_tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 61 + 5) % 300;
  return t;
}

void expect_same_cache(const KvCache& a, const KvCache& b) {
  ASSERT_EQ(a.n_layers(), b.n_layers());
  for (int l = 0; l < a.n_layers(); ++l) {
    for (size_t h = 0; h < a.layer(l).heads.size(); ++h) {
      const HeadCache& x = a.layer(l).heads[h];
      const HeadCache& y = b.layer(l).heads[h];
      ASSERT_EQ(x.size(), y.size()) << "layer " << l << " head " << h;
      EXPECT_TRUE(std::equal(x.positions().begin(), x.positions().end(), y.positions().begin()));
      const auto bytes = static_cast<size_t>(x.size() * x.head_dim()) * sizeof(float);
      EXPECT_EQ(
          std::memcmp(testing::cache_values(x).data(), testing::cache_values(y).data(), bytes), 0)
          << "layer " << l;
      if (!x.shares_keys() && !y.shares_keys()) {
        EXPECT_EQ(std::memcmp(testing::cache_keys(x).data(), testing::cache_keys(y).data(), bytes),
                  0)
            << "layer " << l;
      }
    }
  }
}

// The session from the prefilled prompt equals the one that prefilled itself: logits, cache and
// the next decode steps, bit for bit.
void expect_equal_sessions(const ModelWeights& w, const SessionOptions& options,
                           const std::vector<int32_t>& tokens, const PrefilledPrompt& prompt) {
  Session own(w, options), shared(w, options);
  const std::span<const float> a = own.prefill(tokens);
  const std::vector<float> own_logits(a.begin(), a.end());
  const std::span<const float> b = shared.prefill(prompt);
  ASSERT_EQ(std::memcmp(own_logits.data(), b.data(), own_logits.size() * sizeof(float)), 0);
  expect_same_cache(own.cache(), shared.cache());
  EXPECT_EQ(own.prefill_stats().kv_bytes, shared.prefill_stats().kv_bytes);
  EXPECT_EQ(own.n_past(), shared.n_past());
  for (int i = 0; i < 4; ++i) {
    const std::span<const float> x = own.decode(tokens[static_cast<size_t>(i)]);
    const std::vector<float> own_step(x.begin(), x.end());
    const std::span<const float> y = shared.decode(tokens[static_cast<size_t>(i)]);
    ASSERT_EQ(std::memcmp(own_step.data(), y.data(), own_step.size() * sizeof(float)), 0) << i;
  }
}

TEST(PrefilledPrompt, EveryPressEqualsItsOwnPrefillBitForBit) {
  ModelConfig c = testing::tiny_config("llama");
  c.n_layers = 3;
  const ModelWeights w = random_model_weights(c, 41);
  const auto tokens = prompt_tokens(56);
  for (int64_t ubatch : {int64_t{0}, int64_t{20}}) {
    const auto prompt = PrefilledPrompt::make(w, tokens, ubatch);
    EXPECT_EQ(prompt->n_tokens(), 56);
    SessionOptions full;
    full.ubatch = ubatch;
    expect_equal_sessions(w, full, tokens, *prompt);
    for (const press::PressEntry* entry : press::press_table()) {
      if (!entry->compresses) continue;
      const std::string spec =
          entry->merges ? std::string(entry->name) + ":sinks=2,recent=4" : std::string(entry->name);
      SCOPED_TRACE(spec + " ubatch " + std::to_string(ubatch));
      SessionOptions options;
      options.ubatch = ubatch;
      options.press = PressSpec::parse(spec);
      options.budget.entries = 24;  // clusterkv and pod keep 16 sinks
      expect_equal_sessions(w, options, tokens, *prompt);
    }
  }
}

TEST(PrefilledPrompt, SlidingWindowLayersEitherWay) {
  ModelConfig c = testing::tiny_config("gemma3");
  c.n_layers = 3;
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.sliding_window = 7;
  c.local_layers = {1, 1, 0};
  const ModelWeights w = random_model_weights(c, 42);
  const auto tokens = prompt_tokens(40);
  const auto prompt = PrefilledPrompt::make(w, tokens);
  for (bool compress_local : {false, true}) {
    SCOPED_TRACE(compress_local);
    SessionOptions options;
    options.press = PressSpec::parse("snapkv");
    options.budget.entries = 12;
    options.compress_local_layers = compress_local;
    expect_equal_sessions(w, options, tokens, *prompt);
    SessionOptions full;
    full.compress_local_layers = compress_local;
    expect_equal_sessions(w, full, tokens, *prompt);
  }
}

TEST(PrefilledPrompt, RefusesOtherWeights) {
  const ModelConfig c = testing::tiny_config("llama");
  const ModelWeights w = random_model_weights(c, 43);
  const ModelWeights other = random_model_weights(c, 44);
  const auto prompt = PrefilledPrompt::make(w, prompt_tokens(10));
  Session s(other);
  EXPECT_THROW(s.prefill(*prompt), Error);
  EXPECT_THROW(PrefilledPrompt::make(w, {}), Error);
}

}  // namespace
}  // namespace protokv
