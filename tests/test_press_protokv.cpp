// SPDX-License-Identifier: Apache-2.0
// ProtoKV: each step of Algorithm 1 on hand-made keys (deviation, irregular set, LSH, prototypes,
// assignment, cluster-pooled scores), the planted-cluster scenario the method is built for, and
// the variants of ProtoKV's ICLR version.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "kernels/clustering.h"
#include "press/protokv.h"
#include "press/protokv_clustering.h"
#include "protokv/error.h"
#include "protokv/press/options.h"
#include "protokv/press/window_scores.h"
#include "protokv/press_registry.h"
#include "protokv/press_spec.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;

// Keys drifting smoothly (a vector rotating slowly in the (e0, e1) plane, plus small noise), and a
// few far-apart tokens that share the planted direction e5 instead.
struct DriftWithPlanted {
  static constexpr int kDim = 32;
  std::vector<float> keys;  // [n, kDim]
  std::vector<int32_t> planted = {37, 111, 190, 260, 333, 389};
  int64_t n;

  explicit DriftWithPlanted(int64_t tokens, uint64_t seed = 1) : n(tokens) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.02f), tiny(0.0f, 0.001f);
    keys.resize(static_cast<size_t>(n * kDim));
    const double step = 2.0 * M_PI / 400.0;
    for (int64_t t = 0; t < n; ++t) {
      float* k = keys.data() + t * kDim;
      for (int c = 0; c < kDim; ++c) k[c] = noise(rng);
      k[0] += static_cast<float>(std::cos(step * static_cast<double>(t)));
      k[1] += static_cast<float>(std::sin(step * static_cast<double>(t)));
    }
    for (const int32_t t : planted) {
      float* k = keys.data() + static_cast<int64_t>(t) * kDim;
      for (int c = 0; c < kDim; ++c) k[c] = tiny(rng);
      k[5] += 1.0f;
    }
  }
};

press::ClusteringConfig hybrid_config(int64_t chunks, uint64_t seed) {
  press::ClusteringConfig config;
  config.chunks = chunks;
  config.lsh_bits = 2;
  config.irregular = 12;
  config.gamma = 1.0;
  config.lsh_seed = seed;
  return config;
}

TEST(ProtoKvChunks, ConsecutiveChunksCoverEveryTokenWithBalancedSizes) {
  for (const int64_t n : {1, 7, 100, 401}) {
    for (const int64_t k : {int64_t{1}, int64_t{3}, std::min<int64_t>(n, 16), n}) {
      EXPECT_EQ(press::chunk_begin(0, n, k), 0);
      EXPECT_EQ(press::chunk_begin(k, n, k), n);
      for (int64_t m = 0; m < k; ++m) {
        const int64_t size = press::chunk_begin(m + 1, n, k) - press::chunk_begin(m, n, k);
        EXPECT_GE(size, n / k);
        EXPECT_LE(size, (n + k - 1) / k);
      }
    }
  }
  press::ProtoKvConfig config;
  EXPECT_EQ(config.resolve_chunks(400), 25);      // round(400 / 16)
  EXPECT_EQ(config.resolve_chunks(100000), 496);  // clamp to max_chunks
  EXPECT_EQ(config.resolve_chunks(5), 1);         // round(5 / 16) = 0 -> 1
  config.chunks = 64;
  EXPECT_EQ(config.resolve_chunks(30), 30);  // never more chunks than tokens
}

TEST(ProtoKvDeviation, ChunkDeviationIsStandardisedCosineDissimilarity) {
  // Chunk 0: four identical keys (sigma = 0 -> delta 0). Chunk 1: (1,0) x3 and (0,1):
  // mu = (0.75, 0.25), per-channel variance 0.1875 each, ||sigma|| = sqrt(0.375);
  // delta(0,1) = (1 - 0.25/|mu|)/||sigma||, delta(1,0) = (1 - 0.75/|mu|)/||sigma||.
  const std::vector<float> keys = {2, 1, 2, 1, 2, 1, 2, 1, 1, 0, 1, 0, 1, 0, 0, 1};
  std::vector<float> delta(8);
  press::chunk_deviation(keys.data(), 8, 2, 2, delta.data());
  const double mu = std::sqrt(0.75 * 0.75 + 0.25 * 0.25), sigma = std::sqrt(0.375);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(delta[static_cast<size_t>(t)], 0.0f);
  for (int t = 4; t < 7; ++t)
    EXPECT_NEAR(delta[static_cast<size_t>(t)], (1 - 0.75 / mu) / sigma, 1e-6);
  EXPECT_NEAR(delta[7], (1 - 0.25 / mu) / sigma, 1e-6);
  EXPECT_EQ(press::top_indices(delta.data(), 8, 1), std::vector<int32_t>{7});
  // Ties go to the lower index.
  EXPECT_EQ(press::top_indices(delta.data(), 8, 3), (std::vector<int32_t>{4, 5, 7}));
}

TEST(ProtoKvDeviation, PlantedTokensAreTheIrregularSetUnderBothDeviations) {
  const DriftWithPlanted data(400);
  const std::set<int32_t> planted(data.planted.begin(), data.planted.end());
  for (const auto deviation : {press::Deviation::Chunk, press::Deviation::Neighbourhood}) {
    auto config = hybrid_config(25, 3);
    config.deviation = deviation;
    config.irregular = static_cast<int64_t>(data.planted.size());
    const press::Clustering clusters =
        press::cluster_keys(data.keys.data(), data.n, DriftWithPlanted::kDim, config);
    EXPECT_EQ(std::set<int32_t>(clusters.irregular.begin(), clusters.irregular.end()), planted)
        << (deviation == press::Deviation::Chunk ? "chunk" : "neighbourhood");
  }
}

TEST(ProtoKvClustering, PlantedTokensShareOneIrregularPrototype) {
  const DriftWithPlanted data(400);
  const std::set<int32_t> planted(data.planted.begin(), data.planted.end());
  for (const uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    const press::Clustering clusters = press::cluster_keys(
        data.keys.data(), data.n, DriftWithPlanted::kDim, hybrid_config(25, seed));
    SCOPED_TRACE("seed " + std::to_string(seed));
    // p = 12 >= 6: every planted token is in O.
    for (const int32_t t : data.planted)
      EXPECT_TRUE(std::binary_search(clusters.irregular.begin(), clusters.irregular.end(), t)) << t;
    ASSERT_EQ(clusters.irregular.size(), 12u);
    // 25 regular prototypes (no chunk is emptied by O) plus at most u = 4 buckets.
    EXPECT_EQ(clusters.n_regular, 25);
    EXPECT_LE(clusters.n_prototypes(), 25 + 4);
    const int32_t cluster = clusters.assignment[static_cast<size_t>(data.planted[0])];
    EXPECT_GE(cluster, clusters.n_regular) << "planted tokens should follow an irregular prototype";
    for (int64_t t = 0; t < data.n; ++t) {
      const bool in_cluster = clusters.assignment[static_cast<size_t>(t)] == cluster;
      EXPECT_EQ(in_cluster, planted.count(static_cast<int32_t>(t)) == 1) << "token " << t;
    }
    // Prototypes are unit vectors.
    for (int p = 0; p < clusters.n_prototypes(); ++p) {
      const float* c =
          clusters.prototypes.data() + static_cast<int64_t>(p) * DriftWithPlanted::kDim;
      double norm = 0.0;
      for (int i = 0; i < DriftWithPlanted::kDim; ++i) norm += static_cast<double>(c[i]) * c[i];
      EXPECT_NEAR(norm, 1.0, 1e-5);
    }
  }
}

TEST(ProtoKvClustering, RegularPrototypeIsTheNormalisedChunkSumWithoutIrregularTokens) {
  const DriftWithPlanted data(400);
  const auto config = hybrid_config(25, 1);
  const press::Clustering clusters =
      press::cluster_keys(data.keys.data(), data.n, DriftWithPlanted::kDim, config);
  const std::set<int32_t> irregular(clusters.irregular.begin(), clusters.irregular.end());
  for (int m = 0; m < clusters.n_regular; ++m) {
    ASSERT_EQ(clusters.origin[static_cast<size_t>(m)], m);
    std::vector<double> sum(DriftWithPlanted::kDim, 0.0);
    for (int64_t t = press::chunk_begin(m, 400, 25); t < press::chunk_begin(m + 1, 400, 25); ++t) {
      if (irregular.count(static_cast<int32_t>(t))) continue;
      for (int c = 0; c < DriftWithPlanted::kDim; ++c)
        sum[static_cast<size_t>(c)] +=
            data.keys[static_cast<size_t>(t * DriftWithPlanted::kDim + c)];
    }
    double norm = 0.0;
    for (double v : sum) norm += v * v;
    norm = std::sqrt(norm);
    for (int c = 0; c < DriftWithPlanted::kDim; ++c)
      EXPECT_NEAR(clusters.prototypes[static_cast<size_t>(m * DriftWithPlanted::kDim + c)],
                  sum[static_cast<size_t>(c)] / norm, 1e-5);
  }
}

TEST(ProtoKvLsh, BucketIsTheBinaryCodeOfTheCosineSignsMostSignificantFirst) {
  press::LshProjection lsh;
  lsh.bits = 2;
  lsh.head_dim = 2;
  lsh.w = {3, 0, 0, 3};  // W = 3 I
  lsh.phase = {0, 0};
  const float x[2] = {1, 0}, y[2] = {0, 1};
  // x: cos(3) < 0, cos(0) > 0 -> bits (0, 1) -> 1. y: cos(0) > 0, cos(3) < 0 -> (1, 0) -> 2.
  EXPECT_EQ(press::lsh_bucket(lsh, x), 1);
  EXPECT_EQ(press::lsh_bucket(lsh, y), 2);
}

TEST(ProtoKvLsh, ProjectionIsReproducibleForASeedAndDrawnFromTheStatedDistributions) {
  constexpr int kDim = 16;
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> keys(100 * kDim), unit(keys.size());
  for (float& x : keys) x = normal(rng);
  press::normalise_rows(keys.data(), 100, kDim, unit.data());
  auto buckets = [&](uint64_t seed) {
    const auto lsh = press::make_lsh_projection(3, kDim, 1.0, seed);
    std::vector<int32_t> out;
    for (int t = 0; t < 100; ++t) out.push_back(press::lsh_bucket(lsh, unit.data() + t * kDim));
    return out;
  };
  EXPECT_EQ(buckets(11), buckets(11));
  EXPECT_NE(buckets(11), buckets(12));
  for (const int32_t b : buckets(11)) {
    EXPECT_GE(b, 0);
    EXPECT_LT(b, 8);
  }
  // Per-head seeds differ across heads and layers but are fixed.
  EXPECT_EQ(press::lsh_seed_for(0, 1, 2), press::lsh_seed_for(0, 1, 2));
  EXPECT_NE(press::lsh_seed_for(0, 1, 2), press::lsh_seed_for(0, 2, 1));
  EXPECT_NE(press::lsh_seed_for(0, 1, 2), press::lsh_seed_for(1, 1, 2));

  // W ~ N(0, gamma^2), b ~ U(0, 2 pi): moments over 20000 draws.
  const auto big = press::make_lsh_projection(10, 2000, 2.0, 99);
  double mean = 0.0, var = 0.0;
  for (float w : big.w) mean += w;
  mean /= static_cast<double>(big.w.size());
  for (float w : big.w) var += (w - mean) * (w - mean);
  var /= static_cast<double>(big.w.size());
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.05);
  for (float b : big.phase) {
    EXPECT_GE(b, 0.0f);
    EXPECT_LT(b, 2.0f * static_cast<float>(M_PI) + 1e-6f);
  }
}

// lsh_input: Eq. 12's phi applied to the L2-normalised key (unit, default) or to the key as it
// is (raw, the paper's letter). Keys along two directions at norms 1..15: hashing directions
// puts each direction in one bucket whatever its norm; hashing raw keys follows each key's own
// code. prototypes=lsh hashes every key, so the prototypes are the normalised bucket sums of the
// test's own bucketing, in bucket order.
TEST(ProtoKvLsh, HashesTheKeysDirectionOrTheRawKeyAsLshInputSays) {
  constexpr int kDim = 4;
  const std::vector<std::vector<float>> directions = {{0.6f, 0.8f, 0.0f, 0.0f},
                                                      {0.0f, 0.0f, -0.8f, 0.6f}};
  std::vector<float> keys;
  for (const auto& u : directions)
    for (const float scale : {1.0f, 3.0f, 7.0f, 15.0f})
      for (float x : u) keys.push_back(scale * x);
  const int64_t n = static_cast<int64_t>(keys.size()) / kDim;
  press::ClusteringConfig config;
  config.prototypes = press::PrototypeSet::Lsh;
  config.chunks = 1;
  config.lsh_bits = 1;  // Lsh: round(log2(k + u)) = round(log2(3)) = 2 bits
  config.lsh_seed = 5;
  const auto lsh = press::make_lsh_projection(2, kDim, config.gamma, config.lsh_seed);
  std::map<bool, std::vector<int32_t>> buckets_of;  // unit? -> bucket per key
  for (const bool unit : {true, false}) {
    SCOPED_TRACE(unit ? "unit" : "raw");
    config.lsh_unit_keys = unit;
    std::map<int32_t, std::vector<double>> sums;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> input(keys.begin() + t * kDim, keys.begin() + (t + 1) * kDim);
      const float norm = std::sqrt(input[0] * input[0] + input[1] * input[1] + input[2] * input[2] +
                                   input[3] * input[3]);
      if (unit)
        for (float& x : input) x /= norm;
      const int32_t b = press::lsh_bucket(lsh, input.data());
      buckets_of[unit].push_back(b);
      auto& sum = sums[b];
      sum.resize(kDim, 0.0);
      for (int c = 0; c < kDim; ++c)
        sum[static_cast<size_t>(c)] += keys[static_cast<size_t>(t * kDim + c)];
    }
    const press::Clustering clusters = press::cluster_keys(keys.data(), n, kDim, config);
    ASSERT_EQ(clusters.n_prototypes(), static_cast<int>(sums.size()));
    int p = 0;
    for (const auto& [bucket, sum] : sums) {
      double norm = 0.0;
      for (double x : sum) norm += x * x;
      for (int c = 0; c < kDim; ++c)
        EXPECT_NEAR(clusters.prototypes[static_cast<size_t>(p * kDim + c)],
                    sum[static_cast<size_t>(c)] / std::sqrt(norm), 1e-5)
            << "bucket " << bucket;
      ++p;
    }
  }
  // Directions: one bucket per direction, whatever the norm; raw keys of one direction spread.
  for (int dir = 0; dir < 2; ++dir) {
    const auto first = buckets_of[true].begin() + dir * 4;
    EXPECT_TRUE(std::all_of(first, first + 4, [&](int32_t b) { return b == *first; }));
  }
  EXPECT_NE(buckets_of[true], buckets_of[false]);
  // The option reaches the press and its config.
  EXPECT_EQ(PressSpec::parse("protokv:lsh_input=raw")->config()["lsh_input"], "raw");
  EXPECT_EQ(PressSpec::parse("protokv")->config()["lsh_input"], "unit");
  EXPECT_THROW(PressSpec::parse("protokv:lsh_input=both"), Error);
  EXPECT_THROW(PressSpec::parse("protokv:prototypes=chunk,lsh_input=raw"), Error);
}

TEST(ProtoKvAssignment, GemmArgmaxMatchesNaiveCosineArgmaxAcrossBlocks) {
  constexpr int kDim = 24, kPrototypes = 7;
  constexpr int64_t kTokens = 300;  // more than one 256-row block
  std::mt19937_64 rng(6);
  std::normal_distribution<float> normal;
  std::vector<float> keys(kTokens * kDim), protos(kPrototypes * kDim);
  for (float& x : keys) x = normal(rng);
  for (float& x : protos) x = normal(rng);
  press::normalise_rows(protos.data(), kPrototypes, kDim, protos.data());
  std::vector<int32_t> assignment(kTokens);
  // Raw keys: scaling a row does not change its argmax over unit prototypes.
  press::assign_to_prototypes(keys.data(), kTokens, kDim, protos.data(), kPrototypes,
                              assignment.data());
  for (int64_t t = 0; t < kTokens; ++t) {
    int best = 0;
    double best_cos = -2.0;
    for (int p = 0; p < kPrototypes; ++p) {
      double dot = 0.0, nk = 0.0;
      for (int c = 0; c < kDim; ++c) {
        dot += static_cast<double>(keys[static_cast<size_t>(t * kDim + c)]) *
               protos[static_cast<size_t>(p * kDim + c)];
        nk += static_cast<double>(keys[static_cast<size_t>(t * kDim + c)]) *
              keys[static_cast<size_t>(t * kDim + c)];
      }
      const double cosine = dot / std::sqrt(nk);
      if (cosine > best_cos) best_cos = cosine, best = p;
    }
    EXPECT_EQ(assignment[static_cast<size_t>(t)], best) << t;
  }
}

// top_indices (one pass for p <= 64, nth_element above) against a full sort by (value desc,
// index asc) with NaN as -inf: ties, NaN, -inf, every p from 0 to n.
TEST(ProtoKvIrregularSet, TopIndicesEqualFullSortWithTiesAndNan) {
  std::mt19937_64 rng(13);
  std::uniform_int_distribution<int> level(0, 9);  // few distinct values: many ties
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{100}, int64_t{300}}) {
    std::vector<float> values(static_cast<size_t>(n));
    for (float& v : values) v = static_cast<float>(level(rng));
    if (n > 5) values[3] = std::nanf(""), values[4] = -INFINITY, values[5] = INFINITY;
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const float va = std::isnan(values[a]) ? -INFINITY : values[a];
      const float vb = std::isnan(values[b]) ? -INFINITY : values[b];
      return va != vb ? va > vb : a < b;
    });
    for (int64_t p = 0; p <= n; ++p) {
      std::vector<int32_t> expected(order.begin(), order.begin() + p);
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(press::top_indices(values.data(), n, p), expected) << "n " << n << " p " << p;
    }
  }
}

// chunk_pass's AVX-512 kernels (head_dim 64, 128, 256) against the plain loops: chunk sums bit for
// bit (the same adds in row order), norms, Eq. 10 deviations and assign=local's dots up to float
// rounding (the kernels reduce four rows' dots in one tree); and every output against a double
// reference. Chunks of unequal sizes (1 to 203 rows, so every 4-row remainder), a constant chunk
// (sigma ~ 0: no deviation) and a zero key.
TEST(ProtoKvChunkPass, KernelsEqualThePlainLoopsAndADoubleReference) {
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal;
  for (const int dim : {64, 128, 256, 40}) {
    for (const int64_t chunks : {int64_t{1}, int64_t{7}, int64_t{40}, int64_t{203}}) {
      constexpr int64_t kTokens = 203;
      std::vector<float> keys(static_cast<size_t>(kTokens * dim));
      for (float& x : keys) x = 0.3f + normal(rng);
      std::fill(keys.begin() + 5 * dim, keys.begin() + 6 * dim, 0.0f);
      if (chunks == 40)  // chunk 0 (tokens 0..4) all equal: sigma ~ 0
        for (int64_t t = 1; t < 5; ++t)
          std::copy(keys.begin(), keys.begin() + dim, keys.begin() + t * dim);
      const int reach = chunks > 1 ? 2 : 0;
      std::vector<float> norms(kTokens), sums(static_cast<size_t>(chunks * dim)), delta(kTokens);
      std::vector<float> norms_ref(kTokens), sums_ref(sums.size()), delta_ref(kTokens);
      std::vector<float> dots(static_cast<size_t>((2 * reach + 1) * kTokens), 0.0f);
      std::vector<float> dots_ref(dots.size(), 0.0f);
      press::chunk_pass_generic(keys.data(), kTokens, dim, chunks, norms_ref.data(),
                                sums_ref.data(), delta_ref.data(), {dots_ref.data(), reach});
      for (const kernels::Isa isa : kernels::available_isas()) {
        kernels::chunk_pass_range(isa, keys.data(), kTokens, dim, chunks, 0, chunks, norms.data(),
                                  sums.data(), delta.data(), {dots.data(), reach});
        const std::string where = std::string(kernels::isa_name(isa)) + " dim " +
                                  std::to_string(dim) + " chunks " + std::to_string(chunks);
        EXPECT_EQ(0, std::memcmp(sums.data(), sums_ref.data(), sums.size() * sizeof(float)))
            << where;
        for (int64_t t = 0; t < kTokens; ++t) {
          EXPECT_NEAR(norms[static_cast<size_t>(t)], norms_ref[static_cast<size_t>(t)],
                      1e-5f * norms_ref[static_cast<size_t>(t)])
              << where;
          EXPECT_NEAR(delta[static_cast<size_t>(t)], delta_ref[static_cast<size_t>(t)],
                      1e-3f * (1.0f + std::abs(delta_ref[static_cast<size_t>(t)])))
              << where << " token " << t;
        }
        for (size_t i = 0; i < dots.size(); ++i)
          EXPECT_NEAR(dots[i], dots_ref[i], 1e-4f * (1.0f + std::abs(dots_ref[i]))) << where;
        // Double reference: norms, means, the local dots k_t . mu_j for j = m - reach .. m + reach.
        for (int64_t m = 0; m < chunks; ++m) {
          const int64_t begin = press::chunk_begin(m, kTokens, chunks);
          const int64_t end = press::chunk_begin(m + 1, kTokens, chunks);
          for (int64_t t = begin; t < end; ++t) {
            double sq = 0.0;
            for (int c = 0; c < dim; ++c)
              sq += static_cast<double>(keys[static_cast<size_t>(t * dim + c)]) *
                    keys[static_cast<size_t>(t * dim + c)];
            EXPECT_NEAR(norms[static_cast<size_t>(t)], std::sqrt(sq), 1e-5 * (1.0 + std::sqrt(sq)));
            for (int i = 0; i < 2 * reach + 1; ++i) {
              const int64_t j = m - reach + i;
              if (j < 0 || j >= chunks) continue;
              const int64_t jb = press::chunk_begin(j, kTokens, chunks);
              const int64_t je = press::chunk_begin(j + 1, kTokens, chunks);
              double dot = 0.0, scale = 0.0;
              for (int c = 0; c < dim; ++c) {
                double mean = 0.0;
                for (int64_t u = jb; u < je; ++u) mean += keys[static_cast<size_t>(u * dim + c)];
                mean /= static_cast<double>(je - jb);
                dot += keys[static_cast<size_t>(t * dim + c)] * mean;
                scale += std::abs(keys[static_cast<size_t>(t * dim + c)] * mean);
              }
              EXPECT_NEAR(dots[static_cast<size_t>(i * kTokens + t)], dot, 1e-5 * (1.0 + scale))
                  << where << " token " << t << " slot " << i;
            }
          }
        }
        // Without deviations or dots: the same norms and sums.
        std::vector<float> norms_only(kTokens), sums_only(sums.size());
        kernels::chunk_pass_range(isa, keys.data(), kTokens, dim, chunks, 0, chunks,
                                  norms_only.data(), sums_only.data(), nullptr, {});
        EXPECT_EQ(norms_only, norms) << where;
        EXPECT_EQ(sums_only, sums) << where;
      }
    }
  }
}

// Eq. 10's sigma from E||k||^2 - ||mu||^2: a chunk of equal keys deviates nowhere; otherwise delta
// is (1 - cos(k, mu)) / ||sigma|| with sigma the per-channel population standard deviations.
TEST(ProtoKvChunkPass, DeviationMatchesTheDefinitionInDouble) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal;
  for (const int dim : {24, 128}) {
    constexpr int64_t kTokens = 90, kChunks = 6;
    std::vector<float> keys(static_cast<size_t>(kTokens * dim));
    for (float& x : keys) x = 1.0f + 0.2f * normal(rng);
    for (int64_t t = 1; t < 15; ++t)  // chunk 0 (15 rows): all equal
      std::copy(keys.begin(), keys.begin() + dim, keys.begin() + t * dim);
    std::vector<float> delta(kTokens);
    press::chunk_deviation(keys.data(), kTokens, dim, kChunks, delta.data());
    for (int64_t m = 0; m < kChunks; ++m) {
      const int64_t begin = press::chunk_begin(m, kTokens, kChunks);
      const int64_t end = press::chunk_begin(m + 1, kTokens, kChunks);
      std::vector<double> mean(static_cast<size_t>(dim), 0.0);
      for (int64_t t = begin; t < end; ++t)
        for (int c = 0; c < dim; ++c)
          mean[static_cast<size_t>(c)] += keys[static_cast<size_t>(t * dim + c)];
      for (double& x : mean) x /= static_cast<double>(end - begin);
      double variance = 0.0, mean_norm = 0.0;
      for (int64_t t = begin; t < end; ++t)
        for (int c = 0; c < dim; ++c) {
          const double diff = keys[static_cast<size_t>(t * dim + c)] - mean[static_cast<size_t>(c)];
          variance += diff * diff;
        }
      for (const double x : mean) mean_norm += x * x;
      const double sigma = std::sqrt(variance / static_cast<double>(end - begin));
      for (int64_t t = begin; t < end; ++t) {
        if (m == 0) {
          EXPECT_EQ(delta[static_cast<size_t>(t)], 0.0f) << "equal keys, token " << t;
          continue;
        }
        double dot = 0.0, norm = 0.0;
        for (int c = 0; c < dim; ++c) {
          const double x = keys[static_cast<size_t>(t * dim + c)];
          dot += x * mean[static_cast<size_t>(c)];
          norm += x * x;
        }
        const double expected = (1.0 - dot / std::sqrt(norm * mean_norm)) / sigma;
        EXPECT_NEAR(delta[static_cast<size_t>(t)], expected, 1e-3 * (1e-3 + std::abs(expected)))
            << "dim " << dim << " token " << t;
      }
    }
  }
}

// Eq. 18 per token: its cluster's mean (or sum) of the window scores, against a plain double
// reference; clusters in runs (as chunks give) and scattered, one empty cluster.
TEST(ProtoKvClusterScores, AreTheClusterMeansOrSums) {
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  constexpr int64_t kTokens = 1003;
  constexpr int kClusters = 40;
  std::vector<int32_t> assignment(kTokens);
  std::vector<float> own(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) {
    assignment[static_cast<size_t>(t)] =
        t % 7 == 0 ? static_cast<int32_t>(rng() % (kClusters - 1))  // scattered; never the last
                   : static_cast<int32_t>(t * (kClusters - 1) / kTokens);  // runs
    own[static_cast<size_t>(t)] = uniform(rng);
  }
  for (const auto kind : {press::ClusterScore::Mean, press::ClusterScore::SumLogits}) {
    std::vector<float> score(kTokens);
    std::vector<int64_t> size;
    press::cluster_scores(assignment.data(), own.data(), kTokens, kClusters, kind, score.data(),
                          size);
    ASSERT_EQ(size.size(), static_cast<size_t>(kClusters));
    EXPECT_EQ(size[kClusters - 1], 0);
    for (int64_t t = 0; t < kTokens; ++t) {
      const int32_t c = assignment[static_cast<size_t>(t)];
      double sum = 0.0;
      int64_t count = 0;
      for (int64_t u = 0; u < kTokens; ++u)
        if (assignment[static_cast<size_t>(u)] == c) sum += own[static_cast<size_t>(u)], ++count;
      EXPECT_EQ(size[static_cast<size_t>(c)], count);
      const double expected =
          kind == press::ClusterScore::Mean ? sum / static_cast<double>(count) : sum;
      EXPECT_FLOAT_EQ(score[static_cast<size_t>(t)], static_cast<float>(expected)) << t;
    }
  }
}

// The fused GEMM + argmax kernel against a naive reference that computes every dot with the
// kernel's own FMA chain (ascending channels) and takes the first maximum: identical indices,
// including exact ties between duplicated prototypes in different lanes and column tiles, counts
// around the 32-prototype tile, partial 12-key tiles, zero keys and a NaN key.
TEST(ProtoKvAssignment, FusedArgmaxEqualsNaiveFirstMaximumIncludingTies) {
  constexpr int kDim = 40;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  for (const int count : {1, 2, 15, 16, 17, 31, 32, 33, 64, 70}) {
    for (const int64_t tokens : {int64_t{1}, int64_t{12}, int64_t{13}, int64_t{101}}) {
      std::vector<float> keys(static_cast<size_t>(tokens * kDim)), protos(count * kDim);
      for (float& x : keys) x = normal(rng);
      for (float& x : protos) x = normal(rng);
      press::normalise_rows(protos.data(), count, kDim, protos.data());
      // Exact ties: prototype 1 repeated in other lanes (j = 1 mod 3); prototypes 3 and 18
      // repeated only in their own lane of the next 32-column tile (j + 32).
      for (int j = 4; j < count; j += 3)
        std::copy(protos.begin() + kDim, protos.begin() + 2 * kDim, protos.begin() + j * kDim);
      for (const int j : {3, 18})
        if (j + 32 < count)
          std::copy(protos.begin() + j * kDim, protos.begin() + (j + 1) * kDim,
                    protos.begin() + (j + 32) * kDim);
      if (tokens > 5) {
        // Keys equal to prototypes 1, 3 and 18: maxima tied at every copy.
        for (const int j : {1, 3, 18})
          if (j < count)
            std::copy(protos.begin() + j * kDim, protos.begin() + (j + 1) * kDim,
                      keys.begin() + (j == 1   ? 2
                                      : j == 3 ? 3
                                               : 4) *
                                         kDim);
        std::fill(keys.begin() + kDim, keys.begin() + 2 * kDim, 0.0f);  // all dots zero
      }
      if (tokens > 5) keys[static_cast<size_t>(5 * kDim + 3)] = std::nanf("");
      std::vector<int32_t> assignment(static_cast<size_t>(tokens));
      press::assign_to_prototypes(keys.data(), tokens, kDim, protos.data(), count,
                                  assignment.data());
      for (const kernels::Isa isa : kernels::available_isas()) {  // every variant alike
        std::vector<int32_t> other(assignment.size());
        kernels::assign_to_prototypes(isa, keys.data(), tokens, kDim, protos.data(), count,
                                      other.data());
        EXPECT_EQ(other, assignment) << kernels::isa_name(isa);
      }
      for (int64_t t = 0; t < tokens; ++t) {
        int best = 0;
        float best_dot = 0.0f;
        bool first_nan = false;
        for (int p = 0; p < count; ++p) {
          float dot = 0.0f;
          for (int c = 0; c < kDim; ++c)
            dot = std::fma(keys[static_cast<size_t>(t * kDim + c)],
                           protos[static_cast<size_t>(p * kDim + c)], dot);
          if (p == 0) first_nan = std::isnan(dot), best_dot = dot;
          if (dot > best_dot) best_dot = dot, best = p;  // strict: the first maximum
        }
        if (first_nan) best = 0;
        EXPECT_EQ(assignment[static_cast<size_t>(t)], best)
            << "count " << count << " tokens " << tokens << " token " << t;
      }
    }
  }
}

TEST(ProtoKvAblations, PrototypeSetsHaveTheSamePrototypeBudget) {
  const DriftWithPlanted data(400);
  auto config = hybrid_config(25, 2);
  config.prototypes = press::PrototypeSet::Chunk;
  const auto chunk = press::cluster_keys(data.keys.data(), data.n, DriftWithPlanted::kDim, config);
  EXPECT_TRUE(chunk.irregular.empty());
  EXPECT_EQ(chunk.n_prototypes(), 25 + 4);  // k + u chunks
  EXPECT_EQ(chunk.n_regular, 29);

  config.prototypes = press::PrototypeSet::Lsh;
  const auto lsh = press::cluster_keys(data.keys.data(), data.n, DriftWithPlanted::kDim, config);
  EXPECT_TRUE(lsh.irregular.empty());
  EXPECT_EQ(lsh.n_regular, 0);
  EXPECT_GE(lsh.n_prototypes(), 2);
  EXPECT_LE(lsh.n_prototypes(), 32);  // r' = round(log2(29)) = 5 bits
  for (const int32_t origin : lsh.origin) EXPECT_LT(origin, 32);
  for (const int32_t a : lsh.assignment) EXPECT_LT(a, lsh.n_prototypes());
}

// A one-KV-head layer with the drift keys. The window queries point at planted token 190, whose
// key is three times longer than the other planted keys, so attention concentrates on it; they
// also point at the drift direction of token 300 (angle 3 pi / 2), so that the regular tokens
// around 300 get more attention than the other planted tokens: logits 60/sqrt(32) for 190,
// 30/sqrt(32) for the keys near 300, 20/sqrt(32) for the other planted ones.
SyntheticLayer planted_layer(const DriftWithPlanted& data, int64_t window) {
  SyntheticLayer layer(data.n + window, 2, 1, DriftWithPlanted::kDim);
  std::mt19937_64 rng(12);
  std::normal_distribution<float> noise(0.0f, 0.02f);
  for (int64_t t = 0; t < layer.n; ++t)
    for (int c = 0; c < layer.d; ++c)
      layer.key(0, t)[c] =
          t < data.n ? data.keys[static_cast<size_t>(t * layer.d + c)] : noise(rng);
  for (int c = 0; c < layer.d; ++c) layer.key(0, 190)[c] *= 3.0f;
  for (int qh = 0; qh < 2; ++qh)
    for (int64_t t = data.n; t < layer.n; ++t) {
      layer.query(qh, t)[5] = 20.0f;
      layer.query(qh, t)[1] = -30.0f;
    }
  for (size_t i = 0; i < layer.v.size(); ++i) layer.v[i] = static_cast<float>(i % 13);
  return layer;
}

TEST(ProtoKvPress, ConcentratedAttentionOnOnePlantedTokenKeepsItsWholeCluster) {
  const DriftWithPlanted data(400);
  constexpr int64_t kWindow = 8;
  const SyntheticLayer layer = planted_layer(data, kWindow);
  const std::vector<int32_t> window = {400, 401, 402, 403, 404, 405, 406, 407};
  for (const std::string spec :
       {"protokv:pool=1", "protokv:pool=1,select=clusters",
        "protokv:pool=1,deviation=neighbourhood", "protokv:pool=1,seed=9"}) {
    SCOPED_TRACE(spec);
    auto press = make_press(spec);
    press->begin(layer.info(), testing::entries(kWindow + 6));
    LayerCache cache = layer.empty_cache();
    press->compress_prefill(layer.view(), cache);
    std::vector<int32_t> expected = data.planted;
    expected.insert(expected.end(), window.begin(), window.end());
    EXPECT_EQ(testing::kept_positions(cache.heads[0]), expected);
    testing::expect_valid_head(layer, cache.heads[0], 0, kWindow);
  }
  // SnapKV at the same budget keeps 190 and then follows attention alone: tokens around 300,
  // none of the other planted ones.
  auto snap = make_press("snapkv:pool=1");
  snap->begin(layer.info(), testing::entries(kWindow + 6));
  LayerCache cache = layer.empty_cache();
  snap->compress_prefill(layer.view(), cache);
  const auto kept = testing::kept_positions(cache.heads[0]);
  EXPECT_NE(std::find(kept.begin(), kept.end(), 190), kept.end());
  for (const int32_t t : kept) {
    if (t != 190 && t < 400) {
      EXPECT_NEAR(t, 300, 30);
    }
  }
}

TEST(ProtoKvPress, SelectClustersKeepsWholeClustersAndTruncatesOnlyTheLast) {
  constexpr int64_t kBudget = 50;
  SyntheticLayer layer(400, 2, 1, 16);
  layer.fill_random(23, 2.0f);
  press::OptionReader reader("protokv", "select=clusters,chunks=20", press::protokv_option_specs());
  const auto config = press::read_protokv_options(reader);
  auto press = make_press("protokv:select=clusters,chunks=20");
  press->begin(layer.info(), testing::entries(kBudget));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  const int64_t prefix = layer.n - 8;
  const auto clusters =
      press::cluster_keys(layer.k.data(), prefix, layer.d, config.clustering(prefix, 0, 0));
  std::map<int32_t, int64_t> total, kept;
  for (const int32_t a : clusters.assignment) ++total[a];
  for (const int32_t p : cache.heads[0].positions())
    if (p < prefix) ++kept[clusters.assignment[static_cast<size_t>(p)]];
  int partial = 0;
  for (const auto& [c, count] : kept) partial += count < total[c] ? 1 : 0;
  EXPECT_LE(partial, 1);
  EXPECT_EQ(cache.heads[0].size(), kBudget);
}

}  // namespace
}  // namespace protokv
