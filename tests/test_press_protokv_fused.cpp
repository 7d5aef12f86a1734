// SPDX-License-Identifier: Apache-2.0
// ProtoKV's chunk pass (Eq. 10-11 statistics) fused into the window GEMM's loop over key blocks:
// the fused scorer must give exactly (bit for bit) the scores of the unfused composition it
// replaced (the window GEMM, then the chunk pass over all keys, then the clustering), so the kept
// sets cannot change. Checked on random drifting keys, on the bench's synthetic tensors and on
// stories260K's keys, for assign=local and for the exact Eq. 17 default. The window GEMM itself
// runs in key blocks; it equals one GEMM over all keys bit for bit with OpenBLAS's AVX-512
// (SkylakeX) kernels but only to float rounding with its Haswell/Zen kernels, whose column tails
// accumulate in another order (WindowScoresBlocked checks the rounding bound).
#include <gtest/gtest.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eval/synthetic.h"
#include "kernels/kernels.h"
#include "kernels/serial_blas.h"
#include "press/protokv.h"
#include "press/protokv_clustering.h"
#include "protokv/engine.h"
#include "protokv/model.h"
#include "protokv/press/allocator.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press/window_scores.h"
#include "protokv/press_registry.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

// The window attention sums as computed before the blocked GEMM: one GEMM over all keys (on one
// BLAS thread: with several, OpenBLAS's split of the keys between threads changes some logits'
// rounding, so no single-threaded result can match every thread count).
void one_gemm_window_attention_sums(const LayerView& layer, int kv_head, int64_t window,
                                    float* out) {
  const kernels::SerialBlasScope serial_blas;
  const int64_t n = layer.n_tokens, n_prefix = n - window;
  const int d = layer.head_dim, group = layer.group_size();
  const int64_t rows = static_cast<int64_t>(group) * window;
  std::vector<float> queries(static_cast<size_t>(rows * d));
  for (int g = 0; g < group; ++g) {
    const float* q = layer.q_head(kv_head * group + g) + n_prefix * d;
    std::copy(q, q + window * d, queries.data() + static_cast<int64_t>(g) * window * d);
  }
  std::vector<float> logits(static_cast<size_t>(rows * n));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(n),
              d, 1.0f / std::sqrt(static_cast<float>(d)), queries.data(), d, layer.k_head(kv_head),
              d, 0.0f, logits.data(), static_cast<int>(n));
  std::fill(out, out + static_cast<int64_t>(group) * n_prefix, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits.data() + r * n;
    kernels::softmax(row, n_prefix + r % window + 1);
    float* sums = out + (r / window) * n_prefix;
    for (int64_t j = 0; j < n_prefix; ++j) sums[j] += row[j];
  }
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// Random keys with local drift and random queries, [heads, n, d] each.
eval::SyntheticLayer drifting_layer(int64_t n, int kv_heads, int group, int d, uint64_t seed) {
  eval::SyntheticLayer layer;
  layer.spec.n_tokens = n;
  layer.spec.n_kv_heads = kv_heads;
  layer.spec.group_size = group;
  layer.spec.head_dim = d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  layer.q.resize(static_cast<size_t>(kv_heads * group * n * d));
  for (float& x : layer.q) x = normal(rng);
  layer.k.resize(static_cast<size_t>(kv_heads * n * d));
  std::vector<float> drift(static_cast<size_t>(d));
  for (int h = 0; h < kv_heads; ++h)
    for (int64_t t = 0; t < n; ++t)
      for (int c = 0; c < d; ++c) {
        float& x = drift[static_cast<size_t>(c)];
        x = 0.9f * x + 0.45f * normal(rng);
        layer.k[static_cast<size_t>((h * n + t) * d + c)] = 0.5f + x;
      }
  layer.v = layer.k;
  layer.positions.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) layer.positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  return layer;
}

TEST(WindowScoresBlocked, EqualOneGemmOverAllKeysBitForBit) {
  for (const int64_t n : {int64_t{40}, press::kWindowKeyBlock, 3 * press::kWindowKeyBlock + 77}) {
    for (const int d : {64, 128}) {
      const eval::SyntheticLayer layer = drifting_layer(n, 2, 4, d, static_cast<uint64_t>(n + d));
      const LayerView view = layer.view(0, 1);
      const int64_t window = 8, n_prefix = n - window;
      for (int h = 0; h < 2; ++h) {
        std::vector<float> blocked(static_cast<size_t>(4 * n_prefix), -1.0f);
        std::vector<float> reference(blocked.size(), -2.0f);
        int64_t covered = 0;
        bool contiguous = true;
        press::window_attention_sums(view, h, window, blocked.data(),
                                     [&](int64_t begin, int64_t end) {
                                       contiguous = contiguous && begin == covered && end > begin;
                                       covered = end;
                                     });
        one_gemm_window_attention_sums(view, h, window, reference.data());
        // Sums of window softmax probabilities (each in [0, 4]): a few float ulps apart at most.
        double worst = 0.0;
        for (int64_t i = 0; i < 4 * n_prefix; ++i) {
          const double a = blocked[static_cast<size_t>(i)], b = reference[static_cast<size_t>(i)];
          worst = std::max(worst, std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-6}));
        }
        EXPECT_LT(worst, 1e-5) << "n=" << n << " d=" << d << " head " << h;
        EXPECT_TRUE(contiguous);
        EXPECT_EQ(covered, n);  // every key row visited once, in order
      }
    }
  }
}

TEST(ProtoKvChunkPass, RangesAndStreamEqualTheWholePass) {
  std::mt19937_64 rng(5);
  for (const int d : {8, 24, 64, 128}) {
    for (const int reach : {1, 2}) {  // assign=local's dots with the neighbouring chunk means
      const int64_t n = 997, k = 61;
      const eval::SyntheticLayer layer = drifting_layer(n, 1, 1, d, static_cast<uint64_t>(d));
      const float* keys = layer.k.data();
      const size_t slots = static_cast<size_t>(2 * reach + 1);
      std::vector<float> norms(n), sums(static_cast<size_t>(k * d)), delta(n);
      std::vector<float> dots(slots * n, 0.0f);
      press::chunk_pass(keys, n, d, k, norms.data(), sums.data(), delta.data(),
                        {dots.data(), reach});
      // The same chunks in uneven ranges, in order.
      std::vector<float> norms_r(n, -1), sums_r(sums.size(), -1), delta_r(n, -1);
      std::vector<float> dots_r(dots.size(), 0.0f);
      for (int64_t m = 0; m < k;) {
        const int64_t next = std::min<int64_t>(k, m + 1 + static_cast<int64_t>(rng() % 9));
        press::chunk_pass_range(keys, n, d, k, m, next, norms_r.data(), sums_r.data(),
                                delta_r.data(), {dots_r.data(), reach});
        m = next;
      }
      EXPECT_TRUE(same_bits(norms.data(), norms_r.data(), n)) << d;
      EXPECT_TRUE(same_bits(sums.data(), sums_r.data(), k * d)) << d;
      EXPECT_TRUE(same_bits(delta.data(), delta_r.data(), n)) << d;
      EXPECT_TRUE(same_bits(dots.data(), dots_r.data(), static_cast<int64_t>(dots.size()))) << d;
      // Streamed along key blocks that cut chunks anywhere (the window GEMM's blocks).
      press::ChunkPassStream stream;
      stream.start(keys, n, d, k, reach);
      for (int64_t e = 0; e < n; e += 1 + static_cast<int64_t>(rng() % 70)) stream.advance(e);
      const press::ChunkPassResult result = stream.result();
      EXPECT_EQ(result.chunks, k);
      EXPECT_EQ(result.local.reach, reach);
      EXPECT_TRUE(same_bits(norms.data(), result.norms, n)) << d;
      EXPECT_TRUE(same_bits(sums.data(), result.chunk_sums, k * d)) << d;
      EXPECT_TRUE(same_bits(delta.data(), result.delta, n)) << d;
      EXPECT_TRUE(same_bits(dots.data(), result.local.dots, static_cast<int64_t>(dots.size())))
          << d;
    }
  }
}

// ProtoKV's scores computed the unfused way: the window GEMM (no chunk pass in its loop), the
// window scores, then cluster_keys with its own chunk pass, then the Eq. 18 cluster means (as
// ProtoKvScorer computes them).
void unfused_protokv_scores(const press::ProtoKvConfig& config, const LayerView& layer,
                            int64_t window, int h, std::vector<float>& score,
                            std::vector<float>& own) {
  const int64_t n_prefix = layer.n_tokens - window;
  const int group = layer.group_size();
  std::vector<float> sums(static_cast<size_t>(group * n_prefix));
  press::window_attention_sums(layer, h, window, sums.data());
  press::WindowScoreConfig window_config = config.window_scores;
  window_config.window = window;
  own.assign(static_cast<size_t>(n_prefix), 0.0f);
  press::pool_and_reduce(sums.data(), group, n_prefix, window_config, own.data());
  const press::Clustering clusters = press::cluster_keys(
      layer.k_head(h), n_prefix, layer.head_dim, config.clustering(n_prefix, layer.layer, h));
  score.assign(static_cast<size_t>(n_prefix), 0.0f);
  std::vector<int64_t> size;
  press::cluster_scores(clusters.assignment.data(), own.data(), n_prefix,
                        std::max(1, clusters.n_prototypes()), press::ClusterScore::Mean,
                        score.data(), size);
}

// Runs ProtoKvScorer (fused) and checks every head against the unfused composition: scores and
// tie-breaking scores bit for bit, and the kept prefix entries at several budgets.
class FusionCheckScorer final : public press::Scorer {
 public:
  explicit FusionCheckScorer(press::ProtoKvConfig config) : config_(config), fused_(config) {}
  std::string name() const override { return "fusion_check"; }
  void add_config(nlohmann::json&) const override {}
  void score(const LayerView& layer, int64_t window, press::LayerScores& out) override {
    fused_.score(layer, window, out);
    const int64_t n_prefix = layer.n_tokens - window;
    press::LayerScores reference;
    reference.reset(layer.n_kv_heads, n_prefix, true, false);
    for (int h = 0; h < layer.n_kv_heads; ++h) {
      std::vector<float> score, own;
      unfused_protokv_scores(config_, layer, window, h, score, own);
      ++heads;
      differing_scores += same_bits(out.head_score(h), score.data(), n_prefix) ? 0 : 1;
      differing_ties += same_bits(out.head_tie(h), own.data(), n_prefix) ? 0 : 1;
      std::copy(score.begin(), score.end(), reference.head_score(h));
      std::copy(own.begin(), own.end(), reference.head_tie(h));
      for (const int64_t budget : {int64_t{4}, int64_t{32}, n_prefix / 3}) {
        const int64_t count = std::min(budget, n_prefix);
        differing_kept +=
            press::select_top(out, h, count) == press::select_top(reference, h, count) ? 0 : 1;
      }
    }
  }
  int heads = 0, differing_scores = 0, differing_ties = 0, differing_kept = 0;

 private:
  press::ProtoKvConfig config_;
  press::ProtoKvScorer fused_;
};

press::ProtoKvConfig protokv_config(press::Assignment assignment) {
  press::ProtoKvConfig config;
  config.assignment = assignment;
  config.fuse_min_bytes = 0;  // the fused path at every size
  return config;
}

TEST(ProtoKvFusedPass, ScoresEqualTheUnfusedCompositionOnRandomAndBenchTensors) {
  eval::SyntheticLayerSpec bench;
  bench.n_tokens = 1500;
  const eval::SyntheticLayer tensors[] = {drifting_layer(700, 2, 4, 128, 11),
                                          drifting_layer(613, 2, 2, 64, 12),
                                          eval::make_synthetic_layer(bench)};
  for (const auto& layer : tensors) {
    for (const auto assignment : {press::Assignment::Local, press::Assignment::Exact}) {
      FusionCheckScorer check(protokv_config(assignment));
      press::LayerScores out;
      check.score(layer.view(0, 1), press::WindowScoreConfig::kDefaultWindow, out);
      EXPECT_EQ(check.heads, layer.spec.n_kv_heads);
      EXPECT_EQ(check.differing_scores, 0);
      EXPECT_EQ(check.differing_ties, 0);
      EXPECT_EQ(check.differing_kept, 0);
    }
  }
}

TEST(ProtoKvFusedPass, ScoresEqualTheUnfusedCompositionOnStoriesKeys) {
  PROTOKV_REQUIRE_STORIES();
  const auto dir = testing::stories_dir();
  const LoadedModel model =
      load_model((dir / "stories260K.bin").string(), (dir / "tok512.bin").string());
  std::string text;
  std::vector<int32_t> prompt;
  while (prompt.size() < 448) {
    text += "Once upon a time, there was a little girl named Lily. She loved to play outside. ";
    prompt = model.tokenizer->encode(text, true);
  }
  prompt.resize(448);
  for (const auto assignment : {press::Assignment::Local, press::Assignment::Exact}) {
    FusionCheckScorer* check = nullptr;
    SessionOptions options;
    options.press = PressSpec::from_factory([assignment, &check]() -> std::unique_ptr<Press> {
      auto scorer = std::make_unique<FusionCheckScorer>(protokv_config(assignment));
      check = scorer.get();
      return std::make_unique<press::ScoringPress>("fusion_check", std::move(scorer),
                                                   press::WindowScoreConfig::kDefaultWindow,
                                                   press::AllocatorConfig{});
    });
    options.budget.entries = 64;
    Session session(model.weights, options);
    session.prefill(prompt);
    ASSERT_NE(check, nullptr);
    EXPECT_GT(check->heads, 0);
    EXPECT_EQ(check->differing_scores, 0);
    EXPECT_EQ(check->differing_ties, 0);
    EXPECT_EQ(check->differing_kept, 0);
  }
}

}  // namespace
}  // namespace protokv
