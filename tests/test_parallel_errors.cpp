// SPDX-License-Identifier: Apache-2.0
// An error inside an OpenMP parallel loop reaches the caller as that error (core/parallel.h),
// instead of std::terminate: the helper itself, and the engine's loops that run a press's code.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/parallel.h"
#include "press/chelsea.h"
#include "press/clusterkv.h"
#include "press/pod.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press_spec.h"
#include "protokv/threads.h"
#include "test_engine_model.h"
#include "test_press_util.h"
#include "test_util.h"

namespace protokv {
namespace {

TEST(Threads, CountsOutsideZeroToTheLimitAreRefusedAndChangeNothing) {
  const int saved = num_threads();
  EXPECT_THROW(set_threads(-1), Error);
  EXPECT_THROW(set_threads(limits::kMaxThreads + 1), Error);
  EXPECT_EQ(num_threads(), saved);
}

TEST(ParallelErrors, TheFirstErrorOfAParallelLoopIsRethrownAfterIt) {
  for (const bool parallel : {true, false}) {  // even a one-thread region must not throw out
    ParallelErrors errors;
    std::atomic<int> ran{0};
#pragma omp parallel for schedule(static) if (parallel)
    for (int i = 0; i < 64; ++i) {
      errors.run([&] {
        ++ran;
        if (i == 5) fail("iteration {} failed", i);
      });
    }
    EXPECT_TRUE(errors.failed());
    EXPECT_GE(ran.load(), 1);
    try {
      errors.rethrow();
      ADD_FAILURE() << "no error rethrown";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "iteration 5 failed");
    }
  }
  ParallelErrors none;
#pragma omp parallel for
  for (int i = 0; i < 8; ++i) none.run([] {});
  EXPECT_FALSE(none.failed());
  EXPECT_NO_THROW(none.rethrow());
}

// Keeps every entry and selects for decode, where select() fails: the decode step's loop over
// KV heads runs select() in parallel.
class FailingSelectPress : public Press {
 public:
  std::string name() const override { return "failing_select"; }
  nlohmann::json config() const override { return {{"name", name()}}; }
  void begin(const SequenceInfo&, const Budget&) override {}
  void compress_prefill(const LayerView& layer, LayerCache& out) override {
    press::keep_all(layer, out);
  }
  bool selects(int) const override { return true; }
  void select(int layer, int q_head, const float*, const HeadCache&,
              std::vector<int32_t>&) override {
    fail("select failed at layer {} head {}", layer, q_head);
  }
};

// A scorer whose on_kept() fails: ScoringPress calls it from its parallel loop over KV heads.
class FailingOnKeptScorer : public press::Scorer {
 public:
  std::string name() const override { return "failing_on_kept"; }
  void add_config(nlohmann::json&) const override {}
  void score(const LayerView& layer, int64_t window, press::LayerScores& out) override {
    out.reset(layer.n_kv_heads, layer.n_tokens - window, false, false);
  }
  void on_kept(int layer, int h, const std::vector<int32_t>&) override {
    fail("on_kept failed at layer {} head {}", layer, h);
  }
};

TEST(ParallelErrors, APressErrorInsideTheEnginesParallelLoopsIsAnError) {
  testing::RandomModelSpec spec;
  spec.n_layers = 2;
  const auto model = testing::make_random_model(spec);
  const std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45};

  SessionOptions selecting;
  selecting.press = PressSpec::from_factory([] { return std::make_unique<FailingSelectPress>(); });
  selecting.budget.entries = 64;
  Session decode_session(model.weights, selecting);
  decode_session.prefill(prompt);
  EXPECT_THROW(
      {
        try {
          decode_session.decode(3);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("select failed"), std::string::npos);
          throw;
        }
      },
      Error);

  SessionOptions scoring;
  scoring.press = PressSpec::from_factory([] {
    return std::make_unique<press::ScoringPress>(
        "failing_on_kept", std::make_unique<FailingOnKeptScorer>(), 2, press::AllocatorConfig{});
  });
  scoring.budget.entries = 6;
  Session prefill_session(model.weights, scoring);
  EXPECT_THROW(
      {
        try {
          prefill_session.prefill(prompt);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("on_kept failed"), std::string::npos);
          throw;
        }
      },
      Error);
  // The engine is usable afterwards.
  Session full(model.weights, {});
  EXPECT_EQ(full.prefill(prompt).size(), static_cast<size_t>(model.weights.config.vocab_size));
}

// `call` must throw one protokv::Error containing `expected` (and the process must go on).
template <class Call>
void expect_error_containing(Call&& call, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing '" << expected << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

// The parallel loops below have a forced-error test each: a real input the loop's body itself
// refuses. The other loops run through ParallelErrors too, but no input reaches a throw inside
// their bodies (only an allocation failure could), so they have none:
// - press/h2o.cpp (H2oScorer::score), press/window_scores.cpp (window_scores) and
//   press/protokv.cpp (ProtoKvScorer::score): GEMMs and softmaxes over a LayerView; their options
//   are checked when the press is made, before any loop.
// - model/gguf_export.cpp (convert_rows), model/hf_convert.cpp and model/random_model.cpp
//   (fill_tensor): the only throw, quantize_row to a type without a quantiser, is refused first
//   by set_llama_metadata (the tensors are written after the metadata).
// - eval/synthetic.cpp (make_synthetic_layer): random numbers into vectors sized before the loop.
// press/scoring_press.cpp's loop is the on_kept test above.

// PoD's online calibration (PodPress::calibrate) runs per KV head in parallel; a layer with more
// KV heads than begin() was told is refused from inside that loop.
TEST(ParallelErrors, PodCalibrationOfALayerOfAnotherShape) {
  testing::SyntheticLayer layer(64, 3, 3, 16);
  layer.fill_random(1);
  press::PodPress pod({});
  SequenceInfo info = layer.info();
  info.n_heads = info.n_kv_heads = 2;
  pod.begin(info, testing::entries(32));
  LayerCache out = layer.empty_cache();
  expect_error_containing([&] { pod.compress_prefill(layer.view(), out); },
                          "press 'pod': layer 0 KV head 2 is outside the 1 layers x 2 KV heads");
  // The same press and layer of the right shape compress.
  pod.begin(layer.info(), testing::entries(32));
  LayerCache fine = layer.empty_cache();
  EXPECT_NO_THROW(pod.compress_prefill(layer.view(), fine));
}

// Chelsea's prefill compression (one head per iteration) and its decode-time re-compression.
TEST(ParallelErrors, ChelseaPrefillAndDecodeOfALayerOfAnotherShape) {
  press::ChelseaOptions options;
  options.outliers = 0.0;  // no outlier ranking: the shape is first met inside the loop
  testing::SyntheticLayer layer(128, 3, 3, 16);
  layer.fill_random(2);
  SequenceInfo two_heads = layer.info();
  two_heads.n_heads = two_heads.n_kv_heads = 2;
  press::ChelseaPress chelsea(options);
  chelsea.begin(two_heads, testing::entries(100));
  LayerCache out = layer.empty_cache();
  expect_error_containing(
      [&] { chelsea.compress_prefill(layer.view(), out); },
      "press 'chelsea': layer 0 KV head 2 is outside the 1 layers x 2 KV heads it began with");

  // Decode: a cache with one head more than the compressed layer had.
  testing::SyntheticLayer one(128, 1, 1, 16);
  one.fill_random(3);
  chelsea.begin(one.info(), testing::entries(100));
  LayerCache cache = one.empty_cache();
  chelsea.compress_prefill(one.view(), cache);
  cache.heads.push_back(cache.heads[0]);
  std::vector<float> q(static_cast<size_t>(2 * one.d), 0.5f);
  DecodeStep step = testing::decode_step(one, q.data(), 128, cache);
  expect_error_containing(
      [&] { chelsea.on_decode(step); },
      "press 'chelsea': layer 0 KV head 1 is outside the 1 layers x 1 KV heads it began with");
}

// ClusterKV clusters each head's keys in parallel; k-means with no iterations is refused there.
TEST(ParallelErrors, ClusterKvWithNoKMeansIterations) {
  press::ClusterKvOptions options;
  options.iterations = 0;  // the option parser refuses it; the C++ options are taken as given
  options.full_layers = 0;
  options.sinks = 2;
  testing::SyntheticLayer layer(64, 2, 2, 16);
  layer.fill_random(4);
  press::ClusterKvPress clusterkv(options);
  clusterkv.begin(layer.info(), testing::entries(16));
  LayerCache out = layer.empty_cache();
  expect_error_containing([&] { clusterkv.compress_prefill(layer.view(), out); }, "0 iterations");
}

// After compression every layer (but the first) reads the distant entries' keys from the layer
// below, which itself borrows them: the chunked forward pass of an appended turn (its loop over
// KV heads) finds a lender that cannot lend.
class ChainedKeySharingPress : public Press {
 public:
  std::string name() const override { return "chained_key_sharing"; }
  nlohmann::json config() const override { return {{"name", name()}}; }
  void begin(const SequenceInfo&, const Budget&) override {}
  void compress_prefill(const LayerView& layer, LayerCache& out) override {
    press::keep_all(layer, out);
    if (layer.layer == 0) return;
    for (HeadCache& head : out.heads) head.share_keys(layer.layer - 1, 0, layer.n_tokens / 2);
  }
};

TEST(ParallelErrors, AnAppendedTurnWhoseKeyLenderBorrowsItself) {
  testing::RandomModelSpec spec;
  spec.n_layers = 3;
  const auto model = testing::make_random_model(spec);
  const std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45};
  SessionOptions options;
  options.press =
      PressSpec::from_factory([] { return std::make_unique<ChainedKeySharingPress>(); });
  options.budget.entries = 4;
  Session session(model.weights, options);
  session.prefill(prompt);
  const std::vector<int32_t> turn = {2, 4, 6};
  expect_error_containing([&] { session.append(turn); },
                          "layer 1 cannot lend keys [0, 6) (it holds 15 entries and shares keys "
                          "itself)");
  Session full(model.weights, {});
  EXPECT_EQ(full.prefill(prompt).size(), static_cast<size_t>(model.weights.config.vocab_size));
}

}  // namespace
}  // namespace protokv
