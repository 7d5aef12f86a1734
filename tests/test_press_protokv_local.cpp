// assign=local, the opt-in approximation of ProtoKV Eq. 17: each token is compared only with the
// prototypes of its own chunk, `assign_neighbours` chunks on each side and the LSH buckets. With
// every chunk in reach it must equal the exact assignment; otherwise its disagreement with exact
// Eq. 17 is measured (and printed) on the bench's synthetic tensors and on stories260K's keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eval/synthetic.h"
#include "press/protokv.h"
#include "press/protokv_clustering.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "protokv/press/allocator.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press_registry.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

std::vector<float> drifting_keys(int64_t n, int d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> keys(static_cast<size_t>(n * d)), drift(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      float& x = drift[static_cast<size_t>(c)];
      x = 0.9f * x + 0.45f * normal(rng);
      keys[static_cast<size_t>(t * d + c)] = 0.5f + x;
    }
  return keys;
}

press::ClusteringConfig hybrid(int64_t chunks) {
  press::ClusteringConfig c;
  c.chunks = chunks;
  c.irregular = 12;
  c.lsh_seed = 3;
  return c;
}

// Fraction of tokens whose local assignment differs from exact Eq. 17.
double disagreement(const float* keys, int64_t n, int d, press::ClusteringConfig config,
                    int neighbours) {
  config.assignment = press::Assignment::Exact;
  const press::Clustering exact = press::cluster_keys(keys, n, d, config);
  config.assignment = press::Assignment::Local;
  config.local_neighbours = neighbours;
  const press::Clustering local = press::cluster_keys(keys, n, d, config);
  EXPECT_EQ(local.prototypes, exact.prototypes);  // only the assignment may differ
  int64_t differ = 0;
  for (int64_t t = 0; t < n; ++t)
    differ += local.assignment[static_cast<size_t>(t)] != exact.assignment[static_cast<size_t>(t)];
  return static_cast<double>(differ) / static_cast<double>(n);
}

TEST(ProtoKvLocalAssignment, EveryChunkInReachEqualsExactEq17) {
  // 4 chunks + at most 4 buckets: the 8-lane kernel, whose dots are bit-identical to the exact
  // GEMM's (same FMA order), so not even a near-tie may differ.
  const auto keys = drifting_keys(301, 32, 1);
  EXPECT_EQ(disagreement(keys.data(), 301, 32, hybrid(4), 4), 0.0);
  // 12 chunks + buckets: more than 8 candidates (the scalar-dot path); compare the cosine it
  // picked with the best one in double, allowing float rounding only.
  const auto more = drifting_keys(400, 24, 2);
  press::ClusteringConfig config = hybrid(12);
  config.assignment = press::Assignment::Local;
  config.local_neighbours = 12;
  const press::Clustering local = press::cluster_keys(more.data(), 400, 24, config);
  for (int64_t t = 0; t < 400; ++t) {
    double best = -INFINITY, picked = 0.0;
    for (int p = 0; p < local.n_prototypes(); ++p) {
      double dot = 0.0;
      for (int c = 0; c < 24; ++c)
        dot += static_cast<double>(more[static_cast<size_t>(t * 24 + c)]) *
               local.prototypes[static_cast<size_t>(p * 24 + c)];
      best = std::max(best, dot);
      if (p == local.assignment[static_cast<size_t>(t)]) picked = dot;
    }
    EXPECT_NEAR(picked, best, 1e-4 * std::abs(best)) << "token " << t;
  }
}

// The banded kernel (no chunk dropped, 2a + 1 chunk lanes + buckets <= 8) against a naive
// reference: for each token of chunk m, the dots with the prototypes of chunks m - a .. m + a
// (inside the prefix) and every bucket, each the FMA chain over ascending channels, first maximum
// in prototype order (chunks emptied by the irregular set give the general path, checked alike).
// Chunk sizes below 8, between 8 and 16 and above 16 cover every tile shape.
TEST(ProtoKvLocalAssignment, BandedKernelEqualsNaiveLocalMaximum) {
  int banded = 0, cases = 0;
  for (const int dim : {8, 128}) {
    for (const int64_t tokens : {int64_t{45}, int64_t{301}, int64_t{1000}}) {
      for (const int64_t chunks : {int64_t{3}, int64_t{9}, int64_t{30}}) {
        for (const int neighbours : {0, 1, 2}) {
          const auto keys = drifting_keys(tokens, dim, static_cast<uint64_t>(tokens + chunks));
          press::ClusteringConfig config = hybrid(chunks);
          config.irregular = neighbours == 2 ? 0 : 12;  // 5 chunk lanes: no bucket lanes
          config.assignment = press::Assignment::Local;
          config.local_neighbours = neighbours;
          const press::Clustering local = press::cluster_keys(keys.data(), tokens, dim, config);
          ++cases;
          banded += local.n_regular == chunks ? 1 : 0;  // no chunk dropped: the banded kernel
          for (int64_t t = 0; t < tokens; ++t) {
            const int64_t m = press::chunk_of(t, tokens, chunks);
            std::vector<int> candidates;
            for (int p = 0; p < local.n_regular; ++p)  // chunks m - a .. m + a still present
              if (std::abs(local.origin[static_cast<size_t>(p)] - m) <= neighbours)
                candidates.push_back(p);
            for (int p = local.n_regular; p < local.n_prototypes(); ++p) candidates.push_back(p);
            int best = -1;
            float best_dot = 0.0f;
            for (const int p : candidates) {
              float dot = 0.0f;
              for (int c = 0; c < dim; ++c)
                dot = std::fma(keys[static_cast<size_t>(t * dim + c)],
                               local.prototypes[static_cast<size_t>(p * dim + c)], dot);
              if (best < 0 || dot > best_dot) best_dot = dot, best = p;
            }
            ASSERT_EQ(local.assignment[static_cast<size_t>(t)], best)
                << "dim " << dim << " tokens " << tokens << " chunks " << chunks << " a "
                << neighbours << " token " << t;
          }
        }
      }
    }
  }
  EXPECT_GE(banded, cases - 8);  // only tiny chunks full of irregular tokens drop
}

TEST(ProtoKvLocalAssignment, DisagreementWithExactShrinksAsTheReachGrows) {
  const auto keys = drifting_keys(2000, 64, 4);
  const double one = disagreement(keys.data(), 2000, 64, hybrid(125), 1);
  const double four = disagreement(keys.data(), 2000, 64, hybrid(125), 4);
  EXPECT_LE(four, one);  // the candidates of reach 4 contain those of reach 1
  EXPECT_EQ(disagreement(keys.data(), 2000, 64, hybrid(125), 125), 0.0);
}

TEST(ProtoKvLocalAssignment, OptionsAreCheckedWithOneClearError) {
  EXPECT_NO_THROW(make_press("protokv:assign=local,assign_neighbours=3"));
  EXPECT_NO_THROW(make_press("protokv:assign=local,prototypes=chunk"));
  EXPECT_THROW(make_press("protokv:assign=fast"), Error);
  EXPECT_THROW(make_press("protokv:assign_neighbours=2"), Error);  // exact compares all
  EXPECT_THROW(make_press("protokv:assign=local,assign_neighbours=-1"), Error);
  EXPECT_THROW(make_press("protokv:assign=local,prototypes=lsh"), Error);  // no chunks
}

// Measured disagreement on the bench's synthetic tensors (8 KV heads, head_dim 128, n = 4096):
// printed for the docs; the bound only catches a broken candidate set.
TEST(ProtoKvLocalAssignment, DisagreementOnBenchTensors) {
  eval::SyntheticLayerSpec spec;
  spec.n_tokens = 4096;
  const eval::SyntheticLayer layer = eval::make_synthetic_layer(spec);
  const int64_t n_prefix = spec.n_tokens - press::WindowScoreConfig::kDefaultWindow;
  const press::ProtoKvConfig defaults;
  for (const int neighbours : {1, 2, 4}) {
    double sum = 0.0;
    for (int h = 0; h < spec.n_kv_heads; ++h)
      sum += disagreement(layer.k.data() + static_cast<int64_t>(h) * spec.n_tokens * spec.head_dim,
                          n_prefix, spec.head_dim, defaults.clustering(n_prefix, 0, h), neighbours);
    const double rate = sum / spec.n_kv_heads;
    std::printf(
        "[ protokv ] assign=local assign_neighbours=%d: %.4f of tokens differ from exact "
        "Eq. 17 (synthetic, n=4096, head_dim 128, 8 KV heads)\n",
        neighbours, rate);
    EXPECT_LT(rate, 0.9);
  }
}

// A scorer that only compares local and exact assignment on every (layer, KV head) it sees.
class DisagreementScorer final : public press::Scorer {
 public:
  explicit DisagreementScorer(int neighbours) : neighbours_(neighbours) {}
  std::string name() const override { return "disagreement"; }
  void add_config(nlohmann::json&) const override {}
  void score(const LayerView& layer, int64_t window, press::LayerScores& out) override {
    const int64_t n_prefix = layer.n_tokens - window;
    out.reset(layer.n_kv_heads, n_prefix, false, false);
    const press::ProtoKvConfig defaults;
    for (int h = 0; h < layer.n_kv_heads; ++h) {
      rate_sum += disagreement(layer.k_head(h), n_prefix, layer.head_dim,
                               defaults.clustering(n_prefix, layer.layer, h), neighbours_);
      ++heads;
    }
  }
  double rate_sum = 0.0;
  int heads = 0;

 private:
  int neighbours_;
};

TEST(ProtoKvLocalAssignment, DisagreementOnStoriesKeys) {
  PROTOKV_REQUIRE_STORIES();
  const auto dir = testing::stories_dir();
  const LoadedModel model =
      load_model((dir / "stories260K.bin").string(), (dir / "tok512.bin").string());
  const std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friend Tom. One day, they found a big red ball under a tree. Lily said, "
      "\"Let's play with the ball!\" Tom was happy and they played all day. ";
  std::string long_text;
  std::vector<int32_t> prompt;
  while (prompt.size() < 448) {
    long_text += text;
    prompt = model.tokenizer->encode(long_text, true);
  }
  prompt.resize(448);
  for (const int neighbours : {1, 2, 4}) {
    SessionOptions options;
    options.press = PressSpec::from_factory([neighbours]() -> std::unique_ptr<Press> {
      return std::make_unique<press::ScoringPress>(
          "disagreement", std::make_unique<DisagreementScorer>(neighbours),
          press::WindowScoreConfig::kDefaultWindow, press::AllocatorConfig{});
    });
    options.budget.entries = 64;
    Session session(model.weights, options);
    session.prefill(prompt);
    const auto* scorer = &dynamic_cast<const DisagreementScorer&>(
        dynamic_cast<const press::ScoringPress&>(*session.press()).scorer());
    ASSERT_GT(scorer->heads, 0);
    const double rate = scorer->rate_sum / scorer->heads;
    std::printf(
        "[ protokv ] assign=local assign_neighbours=%d: %.4f of tokens differ from exact "
        "Eq. 17 (stories260K, prompt 448, head_dim 8, %d layer-heads)\n",
        neighbours, rate, scorer->heads);
    EXPECT_LT(rate, 0.9);
  }
}

}  // namespace
}  // namespace protokv
