// SPDX-License-Identifier: Apache-2.0
// Presses on a model with sliding-window layers (Gemma 3, docs/DESIGN.md §3.4): by default every
// press compresses the global layers only, numbered as its own layers 0..n-1, while the local
// layers keep their window; with compress_local_layers the press compresses the local layers too
// and each still forgets what leaves its window.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "model/random_model.h"
#include "press/entry.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press_spec.h"
#include "test_engine_model.h"

namespace protokv {
namespace {

// Gemma 3's block at toy size: 6 layers, local-local-global, window 6.
ModelConfig gemma3_config() {
  ModelConfig c = testing::tiny_config("gemma3");
  c.n_layers = 6;
  c.n_kv_heads = 2;
  c.embedding_scale = 8.0f;
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.sliding_window = 6;
  c.local_layers = {1, 1, 0, 1, 1, 0};
  c.rope_theta_local = 10000.0f;
  c.shared_classifier = true;
  return c;
}

std::vector<int32_t> prompt_tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 53 + 7) % 300;
  return t;
}

// Press specs small enough for a 48-token prompt at budget 16 (chelsea's defaults need more).
std::string small_spec(const press::PressEntry& entry) {
  if (entry.merges) return std::string(entry.name) + ":sinks=2,recent=4";
  return std::string(entry.name);
}

TEST(PressGemma3, EveryPressCompressesTheGlobalLayersOnly) {
  const ModelConfig c = gemma3_config();
  const ModelWeights w = random_model_weights(c, 31);
  const auto tokens = prompt_tokens(48);
  constexpr int64_t kBudget = 24;  // clusterkv and pod keep 16 sinks
  for (const press::PressEntry* entry : press::press_table()) {
    if (!entry->compresses) continue;
    const std::string spec = small_spec(*entry);
    SCOPED_TRACE(spec);
    SessionOptions options;
    options.press = PressSpec::parse(spec);
    options.budget.entries = kBudget;
    Session s(w, options);
    ASSERT_NO_THROW(s.prefill(tokens));
    for (int l = 0; l < c.n_layers; ++l) {
      for (const HeadCache& head : s.cache().layer(l).heads) {
        if (c.is_local_layer(l)) {
          // The local layers hold exactly their window, whatever the press.
          ASSERT_EQ(head.size(), c.sliding_window - 1) << l;
          EXPECT_EQ(head.positions().front(), 48 - (c.sliding_window - 1)) << l;
        } else if (!entry->recalls && !entry->shares_keys) {
          EXPECT_LE(head.size(), 2 * kBudget) << l;  // allocators may move budget between heads
        }
      }
    }
    // Decode keeps the windows and never hands the press a local layer.
    for (int i = 0; i < 8; ++i) {
      const std::span<const float> logits = s.decode(tokens[static_cast<size_t>(i)]);
      ASSERT_TRUE(std::isfinite(logits[0]));
    }
    EXPECT_EQ(s.cache().layer(0).heads[0].size(), c.sliding_window - 1);
    EXPECT_EQ(s.cache().layer(4).heads[1].size(), c.sliding_window - 1);
  }
}

TEST(PressGemma3, PressSeesTheGlobalLayersAsItsOwn) {
  const ModelConfig c = gemma3_config();
  const ModelWeights w = random_model_weights(c, 32);
  const auto tokens = prompt_tokens(40);
  int begun_layers = -1;
  std::vector<int> compressed;
  // A press that records what it is told and keeps the last 10 entries.
  class Recorder : public Press {
   public:
    Recorder(int* layers, std::vector<int>* seen) : layers_(layers), seen_(seen) {}
    std::string name() const override { return "recorder"; }
    nlohmann::json config() const override { return {}; }
    void begin(const SequenceInfo& info, const Budget&) override { *layers_ = info.n_layers; }
    void compress_prefill(const LayerView& view, LayerCache& out) override {
      seen_->push_back(view.layer);
      EXPECT_EQ(view.n_layers, *layers_);
      std::vector<int32_t> keep;
      for (int64_t i = view.n_tokens - 10; i < view.n_tokens; ++i)
        keep.push_back(static_cast<int32_t>(i));
      for (int h = 0; h < view.n_kv_heads; ++h)
        out.heads[static_cast<size_t>(h)].assign_rows(view.k_head(h), view.v_head(h),
                                                      view.positions, keep);
    }

   private:
    int* layers_;
    std::vector<int>* seen_;
  };
  SessionOptions options;
  options.press = PressSpec::from_factory(
      [&] { return std::make_unique<Recorder>(&begun_layers, &compressed); });
  options.budget.entries = 10;
  Session s(w, options);
  s.prefill(tokens);
  EXPECT_EQ(begun_layers, 2);
  EXPECT_EQ(compressed, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.cache().layer(2).heads[0].size(), 10);
  EXPECT_EQ(s.cache().layer(5).heads[0].size(), 10);
  EXPECT_EQ(s.cache().layer(3).heads[0].size(), c.sliding_window - 1);

  // compress_local_layers: the press sees all 6 layers; the local ones keep what it kept that is
  // still inside the window (the last 10 include the window's 5).
  compressed.clear();
  options.compress_local_layers = true;
  Session all(w, options);
  all.prefill(tokens);
  EXPECT_EQ(begun_layers, 6);
  EXPECT_EQ(compressed, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(all.cache().layer(3).heads[0].size(), c.sliding_window - 1);
  EXPECT_EQ(all.cache().layer(2).heads[0].size(), 10);
}

TEST(PressGemma3, CompressLocalLayersKeepsOnlyWhatIsInsideTheWindow) {
  const ModelConfig c = gemma3_config();
  const ModelWeights w = random_model_weights(c, 33);
  const auto tokens = prompt_tokens(40);
  SessionOptions options;
  options.press = PressSpec::parse("streaming_llm:sinks=2");
  options.budget.entries = 12;
  options.compress_local_layers = true;
  for (int64_t ubatch : {int64_t{0}, int64_t{9}}) {
    SCOPED_TRACE(ubatch);
    options.ubatch = ubatch;
    Session s(w, options);
    s.prefill(tokens);
    // streaming_llm keeps positions 0, 1 and 30..39; the window of the next query (40) is 35..40.
    for (int l : {0, 1, 3, 4}) {
      const HeadCache& head = s.cache().layer(l).heads[0];
      ASSERT_EQ(head.size(), c.sliding_window - 1) << l;
      EXPECT_EQ(head.positions().front(), 35) << l;
    }
    EXPECT_EQ(s.cache().layer(2).heads[0].size(), 12);
    s.decode(tokens[0]);
    EXPECT_EQ(s.cache().layer(2).heads[0].size(), 13);
    EXPECT_EQ(s.cache().layer(0).heads[0].size(), c.sliding_window - 1);
  }
}

TEST(PressGemma3, PodCannotShareKeysAcrossLocalLayers) {
  const ModelConfig c = gemma3_config();
  const ModelWeights w = random_model_weights(c, 34);
  SessionOptions options;
  options.press = PressSpec::parse("pod");
  options.budget.entries = 24;
  options.compress_local_layers = true;
  Session s(w, options);
  try {
    s.prefill(prompt_tokens(60));
    FAIL() << "pod shared keys with a sliding-window layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window layer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace protokv
