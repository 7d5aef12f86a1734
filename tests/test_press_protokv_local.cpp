// SPDX-License-Identifier: Apache-2.0
// assign=local, the opt-in approximation of ProtoKV Eq. 17: each token is compared only with the
// prototypes of its own chunk, `assign_neighbours` chunks on each side and the LSH buckets. With
// every chunk in reach it must equal the exact assignment; otherwise its disagreement with exact
// Eq. 17 is measured (and printed) on the bench's synthetic tensors and on stories260K's keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
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

// Double-precision k . c_p.
double exact_dot(const float* key, const float* prototype, int d) {
  double dot = 0.0;
  for (int c = 0; c < d; ++c) dot += static_cast<double>(key[c]) * prototype[c];
  return dot;
}

// Checks that every token's local assignment is a first maximum, up to float rounding, of k . c
// over the candidates of its chunk m: the prototypes of the chunks m - a .. m + a still present
// and every bucket. Returns the share of tokens whose pick is also the double-precision maximum.
double expect_local_maximum(const std::vector<float>& keys, int64_t n, int d,
                            const press::Clustering& local, int neighbours,
                            const std::string& where) {
  int64_t same = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t m = press::chunk_of(t, n, local.n_chunks);
    const float* key = keys.data() + t * d;
    double best = -INFINITY, norm = 0.0;
    int best_p = -1;
    for (int c = 0; c < d; ++c) norm += static_cast<double>(key[c]) * key[c];
    const int32_t picked = local.assignment[static_cast<size_t>(t)];
    bool picked_is_candidate = false;
    for (int p = 0; p < local.n_prototypes(); ++p) {
      const bool candidate =
          p >= local.n_regular || std::abs(local.origin[static_cast<size_t>(p)] - m) <= neighbours;
      if (!candidate) continue;
      picked_is_candidate = picked_is_candidate || p == picked;
      const double dot = exact_dot(key, local.prototypes.data() + static_cast<int64_t>(p) * d, d);
      if (dot > best) best = dot, best_p = p;
    }
    EXPECT_TRUE(picked_is_candidate) << where << " token " << t;
    const double got =
        exact_dot(key, local.prototypes.data() + static_cast<int64_t>(picked) * d, d);
    EXPECT_GE(got, best - 1e-5 * std::sqrt(norm)) << where << " token " << t;  // rounding only
    same += picked == best_p ? 1 : 0;
  }
  return static_cast<double>(same) / static_cast<double>(n);
}

TEST(ProtoKvLocalAssignment, EveryChunkInReachEqualsExactEq17UpToRounding) {
  // 4 chunks, reach 4, and 12 chunks, reach 12: every prototype is a candidate, so the local
  // assignment is Eq. 17's (its chunk candidates are dots with the chunk means, so equal ties may
  // break differently; the bound allows float rounding only).
  const auto keys = drifting_keys(301, 32, 1);
  EXPECT_LT(disagreement(keys.data(), 301, 32, hybrid(4), 4), 0.01);
  const auto more = drifting_keys(400, 24, 2);
  press::ClusteringConfig config = hybrid(12);
  config.assignment = press::Assignment::Local;
  config.local_neighbours = 12;
  const press::Clustering local = press::cluster_keys(more.data(), 400, 24, config);
  EXPECT_GT(expect_local_maximum(more, 400, 24, local, 12, "reach 12"), 0.99);
}

// The local assignment against a naive double-precision reference: for each token of chunk m, the
// prototypes of chunks m - a .. m + a (inside the prefix, not dropped) and every bucket; the pick
// must be a candidate whose cosine is the best up to rounding. Covers head_dim 8 (the generic
// chunk pass) and 128 (the AVX-512 one), chunks of fewer than 8 to more than 16 tokens, chunks
// emptied by the irregular set, chunks that lost irregular tokens (candidates recomputed against
// their prototype), no buckets, and the pruning of bucket candidates.
TEST(ProtoKvLocalAssignment, PicksTheNaiveLocalMaximumUpToRounding) {
  for (const int dim : {8, 128}) {
    for (const int64_t tokens : {int64_t{45}, int64_t{301}, int64_t{1000}}) {
      for (const int64_t chunks : {int64_t{3}, int64_t{9}, int64_t{30}}) {
        for (const int neighbours : {0, 1, 2}) {
          const auto keys = drifting_keys(tokens, dim, static_cast<uint64_t>(tokens + chunks));
          press::ClusteringConfig config = hybrid(chunks);
          config.irregular = neighbours == 2 ? 0 : 12;  // no buckets
          config.assignment = press::Assignment::Local;
          config.local_neighbours = neighbours;
          const press::Clustering local = press::cluster_keys(keys.data(), tokens, dim, config);
          const std::string where = "dim " + std::to_string(dim) + " tokens " +
                                    std::to_string(tokens) + " chunks " + std::to_string(chunks) +
                                    " a " + std::to_string(neighbours);
          EXPECT_GT(expect_local_maximum(keys, tokens, dim, local, neighbours, where), 0.98)
              << where;
          EXPECT_GE(local.local_bucket_dots, 0);
        }
      }
    }
  }
}

// Buckets far from every chunk are skipped without changing the assignment: planted far-apart
// outlier tokens form the buckets; drifting keys stay close to their chunk's prototype.
TEST(ProtoKvLocalAssignment, BucketsThatCannotWinAreSkipped) {
  constexpr int64_t kTokens = 600;
  constexpr int kDim = 64;
  auto keys = drifting_keys(kTokens, kDim, 9);
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal;
  for (const int64_t t : {50, 170, 333, 480}) {  // outliers, opposite to the drift's offset
    for (int c = 0; c < kDim; ++c) keys[static_cast<size_t>(t * kDim + c)] = -3.0f + normal(rng);
  }
  press::ClusteringConfig config = hybrid(40);
  config.irregular = 4;
  config.assignment = press::Assignment::Local;
  const press::Clustering local = press::cluster_keys(keys.data(), kTokens, kDim, config);
  ASSERT_GT(local.n_prototypes(), local.n_regular);
  EXPECT_LT(local.local_bucket_dots, kTokens);  // most (token, bucket) pairs were skipped
  EXPECT_GT(expect_local_maximum(keys, kTokens, kDim, local, 1, "planted"), 0.99);
  for (const int64_t t : {50, 170, 333, 480})  // each outlier still goes to a bucket
    EXPECT_GE(local.assignment[static_cast<size_t>(t)], local.n_regular) << t;
}

TEST(ProtoKvLocalAssignment, DisagreementWithExactShrinksAsTheReachGrows) {
  const auto keys = drifting_keys(2000, 64, 4);
  const double one = disagreement(keys.data(), 2000, 64, hybrid(125), 1);
  const double four = disagreement(keys.data(), 2000, 64, hybrid(125), 4);
  EXPECT_LE(four, one);  // the candidates of reach 4 contain those of reach 1
  // Every chunk in reach: Eq. 17 up to near-ties broken by rounding.
  EXPECT_LT(disagreement(keys.data(), 2000, 64, hybrid(125), 125), 0.002);
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
    double sum = 0.0, bucket_dots = 0.0, bucket_pairs = 0.0;
    for (int h = 0; h < spec.n_kv_heads; ++h) {
      const float* keys = layer.k.data() + static_cast<int64_t>(h) * spec.n_tokens * spec.head_dim;
      press::ClusteringConfig config = defaults.clustering(n_prefix, 0, h);
      sum += disagreement(keys, n_prefix, spec.head_dim, config, neighbours);
      config.assignment = press::Assignment::Local;
      config.local_neighbours = neighbours;
      const press::Clustering local = press::cluster_keys(keys, n_prefix, spec.head_dim, config);
      bucket_dots += static_cast<double>(local.local_bucket_dots);
      bucket_pairs += static_cast<double>(n_prefix * (local.n_prototypes() - local.n_regular));
    }
    const double rate = sum / spec.n_kv_heads;
    std::printf(
        "[ protokv ] assign=local assign_neighbours=%d: %.4f of tokens differ from exact "
        "Eq. 17, %.4f of the (token, bucket) dots computed (synthetic, n=4096, head_dim 128, 8 KV "
        "heads)\n",
        neighbours, rate, bucket_pairs > 0 ? bucket_dots / bucket_pairs : 0.0);
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

// Disagreement with exact Eq. 17 on the keys a real model computes for `prompt` (every layer and
// KV head at prefill), printed for the docs.
void print_disagreement_on_model_keys(const LoadedModel& model, const std::vector<int32_t>& prompt,
                                      const char* what) {
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
        "Eq. 17 (%s, %d layer-heads)\n",
        neighbours, rate, what, scorer->heads);
    EXPECT_LT(rate, 0.9);
  }
}

std::vector<int32_t> repeated_story_prompt(const LoadedModel& model, size_t length) {
  const std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friend Tom. One day, they found a big red ball under a tree. Lily said, "
      "\"Let's play with the ball!\" Tom was happy and they played all day. ";
  std::string long_text;
  std::vector<int32_t> prompt;
  while (prompt.size() < length) {
    long_text += text;
    prompt = model.tokenizer->encode(long_text, true);
  }
  prompt.resize(length);
  return prompt;
}

TEST(ProtoKvLocalAssignment, DisagreementOnStoriesKeys) {
  PROTOKV_REQUIRE_STORIES();
  const auto dir = testing::stories_dir();
  const LoadedModel model =
      load_model((dir / "stories260K.bin").string(), (dir / "tok512.bin").string());
  print_disagreement_on_model_keys(model, repeated_story_prompt(model, 448),
                                   "stories260K, prompt 448, head_dim 8");
}

// The shipped recall model (head_dim 32, trained on long-context retrieval): the real keys with
// the largest head dimension available on this machine.
TEST(ProtoKvLocalAssignment, DisagreementOnRecallModelKeys) {
  const auto path = std::filesystem::path(PROTOKV_SOURCE_DIR) / "models" / "protokv-recall.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "models/protokv-recall.gguf is absent";
  const LoadedModel model = load_model(path.string());
  print_disagreement_on_model_keys(model, repeated_story_prompt(model, 1536),
                                   "protokv-recall, prompt 1536, head_dim 32");
}

}  // namespace
}  // namespace protokv
