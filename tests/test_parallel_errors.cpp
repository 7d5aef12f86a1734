// An error inside an OpenMP parallel loop reaches the caller as that error (core/parallel.h),
// instead of std::terminate: the helper itself, and the engine's loops that run a press's code.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/parallel.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press_spec.h"
#include "protokv/threads.h"
#include "test_engine_model.h"
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

}  // namespace
}  // namespace protokv
