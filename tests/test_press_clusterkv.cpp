// SPDX-License-Identifier: Apache-2.0
// ClusterKV (DESIGN §5): cosine k-means and cluster recall against brute-force
// computations in double precision, more than 256 clusters, exact truncation of the last
// cluster, exact partial ranking, and the press's cluster-contiguous storage, selection (the
// recalled token positions equal a brute-force recall over the unpermuted keys) and decode-time
// re-clustering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/rng.h"
#include "press/clusterkv.h"
#include "protokv/error.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using press::ClusterIndex;
using press::KMeans;

// The brute-force reference of DESIGN §5's k-means: every similarity in double, one key at a time.
KMeans reference_kmeans(const std::vector<float>& keys, int64_t n, int d,
                        const std::vector<int32_t>& initial, int iterations) {
  const auto clusters = static_cast<int64_t>(initial.size());
  std::vector<double> centroids(static_cast<size_t>(clusters * d));
  for (int64_t c = 0; c < clusters; ++c)
    for (int i = 0; i < d; ++i)
      centroids[static_cast<size_t>(c * d + i)] = keys[static_cast<size_t>(initial[c] * d + i)];
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int it = 0; it < iterations; ++it) {
    for (int64_t j = 0; j < n; ++j) {
      double best = -1e300;
      for (int64_t c = 0; c < clusters; ++c) {
        double dot = 0.0, nk = 0.0, nc = 0.0;
        for (int i = 0; i < d; ++i) {
          const double k = keys[static_cast<size_t>(j * d + i)];
          const double m = centroids[static_cast<size_t>(c * d + i)];
          dot += k * m;
          nk += k * k;
          nc += m * m;
        }
        const double cosine = nc > 0.0 && nk > 0.0 ? dot / std::sqrt(nk * nc) : 0.0;
        if (c == 0 || cosine > best) {
          best = cosine;
          labels[static_cast<size_t>(j)] = static_cast<int32_t>(c);
        }
      }
    }
    for (int64_t c = 0; c < clusters; ++c) {
      std::vector<double> sum(static_cast<size_t>(d), 0.0);
      int64_t count = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (labels[static_cast<size_t>(j)] != c) continue;
        ++count;
        for (int i = 0; i < d; ++i)
          sum[static_cast<size_t>(i)] += keys[static_cast<size_t>(j * d + i)];
      }
      if (count == 0) continue;
      for (int i = 0; i < d; ++i)
        centroids[static_cast<size_t>(c * d + i)] = sum[static_cast<size_t>(i)] / count;
    }
  }
  KMeans out;
  out.labels = labels;
  out.centroids.assign(centroids.begin(), centroids.end());
  return out;
}

// `clusters` well-separated directions, `per_cluster` noisy keys around each (scaled randomly,
// which cosine similarity ignores), shuffled. Returns the keys and one member of each cluster.
std::vector<float> separated_keys(int64_t clusters, int64_t per_cluster, int d, uint64_t seed,
                                  std::vector<int32_t>& one_per_cluster) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.5f, 3.0f);
  std::vector<float> centres(static_cast<size_t>(clusters * d));
  for (float& x : centres) x = normal(rng);
  const int64_t n = clusters * per_cluster;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> keys(static_cast<size_t>(n * d));
  one_per_cluster.assign(static_cast<size_t>(clusters), -1);
  for (int64_t slot = 0; slot < n; ++slot) {
    const int64_t c = order[static_cast<size_t>(slot)] / per_cluster;
    const float s = scale(rng);
    for (int i = 0; i < d; ++i)
      keys[static_cast<size_t>(slot * d + i)] =
          s * (centres[static_cast<size_t>(c * d + i)] + 0.02f * normal(rng));
    if (one_per_cluster[static_cast<size_t>(c)] < 0)
      one_per_cluster[static_cast<size_t>(c)] = static_cast<int32_t>(slot);
  }
  return keys;
}

TEST(ClusterKv, InitialRowsAreDistinctSeededSamples) {
  const auto rows = press::sample_initial_rows(1000, 300, 7);
  ASSERT_EQ(rows.size(), 300u);
  EXPECT_EQ(std::set<int32_t>(rows.begin(), rows.end()).size(), 300u);
  for (int32_t r : rows) {
    EXPECT_GE(r, 0);
    EXPECT_LT(r, 1000);
  }
  EXPECT_EQ(rows, press::sample_initial_rows(1000, 300, 7));
  EXPECT_NE(rows, press::sample_initial_rows(1000, 300, 8));
  EXPECT_EQ(press::sample_initial_rows(5, 5, 1).size(), 5u);
}

TEST(ClusterKv, KMeansEqualsBruteForceWithMoreThan256Clusters) {
  const int d = 16;
  const int64_t clusters = 300, per_cluster = 6;  // > 256 clusters: no 8-bit label limit
  std::vector<int32_t> initial;
  const auto keys = separated_keys(clusters, per_cluster, d, 11, initial);
  const int64_t n = clusters * per_cluster;
  const KMeans got = press::cosine_kmeans(keys.data(), n, d, initial, 4);
  const KMeans want = reference_kmeans(keys, n, d, initial, 4);
  ASSERT_EQ(got.labels, want.labels);
  ASSERT_EQ(got.centroids.size(), want.centroids.size());
  for (size_t i = 0; i < got.centroids.size(); ++i)
    ASSERT_NEAR(got.centroids[i], want.centroids[i], 1e-5f * (1.0f + std::fabs(want.centroids[i])));
  // Every cluster found its true members (one initial key per true cluster).
  EXPECT_EQ(std::set<int32_t>(got.labels.begin(), got.labels.end()).size(),
            static_cast<size_t>(clusters));
}

TEST(ClusterKv, KMeansFromSampledRowsEqualsBruteForce) {
  const int d = 8;
  std::vector<int32_t> unused;
  const auto keys = separated_keys(20, 30, d, 5, unused);
  const auto initial = press::sample_initial_rows(600, 20, 9);
  const KMeans got = press::cosine_kmeans(keys.data(), 600, d, initial, 20);
  const KMeans want = reference_kmeans(keys, 600, d, initial, 20);
  EXPECT_EQ(got.labels, want.labels);
}

TEST(ClusterKv, EmptyClusterKeepsItsCentroid) {
  // Rows 0 and 1 are the same key: cluster 1 ties with cluster 0 everywhere and loses (lowest
  // index wins), so it stays empty and keeps its initial centroid.
  const std::vector<float> keys = {1, 0, 1, 0, 0, 1, 0, 2};
  const KMeans got = press::cosine_kmeans(keys.data(), 4, 2, std::vector<int32_t>{0, 1, 2}, 3);
  EXPECT_EQ(got.labels, (std::vector<int32_t>{0, 0, 2, 2}));
  EXPECT_EQ(got.centroids, (std::vector<float>{1, 0, 1, 0, 0, 1.5f}));
}

// Brute force: every cluster's q·μ in double, a stable sort, members until the budget.
std::vector<int32_t> reference_recall(const ClusterIndex& index, const std::vector<float>& q,
                                      int64_t budget) {
  const int64_t clusters = index.clusters();
  std::vector<std::pair<double, int64_t>> ranked;
  for (int64_t c = 0; c < clusters; ++c) {
    double s = 0.0;
    for (int i = 0; i < index.head_dim; ++i)
      s += double{q[static_cast<size_t>(i)]} *
           index.centroids[static_cast<size_t>(c * index.head_dim + i)];
    ranked.emplace_back(-s, c);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<int32_t> out;
  for (const auto& [neg, c] : ranked)
    for (int64_t m = index.offsets[c]; m < index.offsets[c + 1]; ++m)
      if (static_cast<int64_t>(out.size()) < budget) out.push_back(index.members[m]);
  return out;
}

TEST(ClusterKv, RecallEqualsBruteForceTopClustersAndTruncatesTheLast) {
  const int d = 12;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(3000 * d));
  for (float& x : keys) x = normal(rng);
  const KMeans kmeans =
      press::cosine_kmeans(keys.data(), 3000, d, press::sample_initial_rows(3000, 300, 4), 3);
  ClusterIndex index;
  index.head_dim = d;
  index.add(kmeans, 16);  // entries 16.. (after 16 sinks)
  ASSERT_EQ(index.clusters(), 300);
  // CSR: offsets are prefix sums of the sizes, members grouped by label, ascending inside.
  ASSERT_EQ(index.offsets.back(), 3000);
  for (int64_t c = 0; c < 300; ++c)
    for (int64_t m = index.offsets[c]; m < index.offsets[c + 1]; ++m) {
      EXPECT_EQ(kmeans.labels[static_cast<size_t>(index.members[m] - 16)], c);
      if (m > index.offsets[c]) {
        EXPECT_LT(index.members[m - 1], index.members[m]);
      }
    }
  std::vector<float> scores;
  std::vector<int32_t> order;
  for (int64_t budget : {1, 37, 500, 2999, 3000, 5000}) {
    SCOPED_TRACE(budget);
    const std::vector<float> q = [&] {
      std::vector<float> v(static_cast<size_t>(d));
      for (float& x : v) x = normal(rng);
      return v;
    }();
    std::vector<int32_t> got;
    press::recall_clusters(index, q.data(), budget, scores, order, got);
    EXPECT_EQ(got, reference_recall(index, q, budget));
    EXPECT_EQ(static_cast<int64_t>(got.size()), std::min<int64_t>(budget, 3000));
  }
}

TEST(ClusterKv, RecallTakesWholeClustersInScoreOrder) {
  // Three hand-made clusters along axes; q prefers cluster 2, then 0, then 1.
  ClusterIndex index;
  index.head_dim = 2;
  KMeans kmeans;
  kmeans.centroids = {1, 0, -1, 0, 0, 1};
  kmeans.labels = {0, 1, 2, 0, 2, 0, 1, 2, 2};  // sizes 3, 2, 4
  index.add(kmeans, 10);
  EXPECT_EQ(index.offsets, (std::vector<int64_t>{0, 3, 5, 9}));
  const std::vector<float> q = {0.5f, 2.0f};
  std::vector<float> scores;
  std::vector<int32_t> order, got;
  press::recall_clusters(index, q.data(), 6, scores, order, got);
  EXPECT_EQ(got, (std::vector<int32_t>{12, 14, 17, 18, 10, 13}));  // cluster 2, then 2 of 0
}

TEST(ClusterKv, RankingPastThePartialSortEqualsBruteForce) {
  // 1000 one-member clusters and one of 5000: the mean size (6) suggests ~300 clusters for a
  // budget of 900, but when the big cluster ranks low, 900 small ones are needed, so the ranking
  // must extend past its partial sort. Repeated centroids tie (the lower cluster first).
  const int d = 4;
  std::mt19937_64 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ClusterIndex index;
  index.head_dim = d;
  KMeans kmeans;
  for (int c = 0; c < 1001; ++c)
    for (int i = 0; i < d; ++i)
      kmeans.centroids.push_back(c % 7 == 3 && c > 3 ? kmeans.centroids[static_cast<size_t>(i)]
                                                     : normal(rng));
  for (int c = 0; c < 1000; ++c) kmeans.labels.push_back(c);
  kmeans.labels.insert(kmeans.labels.end(), 5000, 1000);
  index.add(kmeans, 16);
  std::vector<float> scores;
  std::vector<int32_t> order, got;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> q(d);
    for (float& x : q) x = normal(rng);
    for (int64_t budget : {1, 17, 900, 3000, 5999, 6000, 7000}) {
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " budget " << budget);
      got.clear();
      press::recall_clusters(index, q.data(), budget, scores, order, got);
      ASSERT_EQ(got, reference_recall(index, q, budget));
    }
  }
}

TEST(ClusterKv, ContiguousIndexStoresEachClusterAsOneBlock) {
  KMeans kmeans;
  kmeans.centroids = {1, 0, -1, 0, 0, 1};
  kmeans.labels = {0, 1, 2, 0, 2, 0, 1, 2, 2};  // rows of entries 10..18
  ClusterIndex index;
  index.head_dim = 2;
  const std::vector<int32_t> order = index.add_contiguous(kmeans, 10);
  // Rows in cluster order, ascending inside each cluster; members are the entries in order.
  EXPECT_EQ(order, (std::vector<int32_t>{0, 3, 5, 1, 6, 2, 4, 7, 8}));
  EXPECT_EQ(index.offsets, (std::vector<int64_t>{0, 3, 5, 9}));
  EXPECT_EQ(index.members, (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16, 17, 18}));
  // Appending more clusters continues the layout after the first ones.
  KMeans more;
  more.centroids = {0, -1, 1, 1};
  more.labels = {1, 0, 1};
  EXPECT_EQ(index.add_contiguous(more, 19), (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(index.offsets, (std::vector<int64_t>{0, 3, 5, 9, 10, 12}));
  EXPECT_EQ(index.members.back(), 21);
}

// Token positions of `entries` of `head`, sorted.
std::vector<int32_t> sorted_positions(const HeadCache& head, std::span<const int32_t> entries) {
  std::vector<int32_t> out;
  for (int32_t e : entries) out.push_back(head.positions()[static_cast<size_t>(e)]);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ClusterKv, StoredClusterContiguousAndRecallEqualsBruteForceOnTheTokenKeys) {
  // The press's k-means of each head, recomputed here on the keys in token order (the same seeded
  // initial rows), and a brute-force recall over it give token positions; the press, whose cache
  // holds the entries in cluster order, must attend exactly those positions (plus the sinks).
  testing::SyntheticLayer layer(700, 4, 2, 8);
  layer.n_layers = 4;
  layer.layer = 3;
  layer.fill_random(5);
  press::ClusterKvOptions options;
  options.clusters = 37;
  options.iterations = 6;
  press::ClusterKvPress press(options);
  const int64_t budget = 150, sinks = options.sinks, clustered = 700 - 16;
  press.begin(layer.info(), testing::entries(budget));
  LayerCache cache = layer.empty_cache();
  press.compress_prefill(layer.view(), cache);
  for (int h = 0; h < 2; ++h) {
    SCOPED_TRACE(h);
    const HeadCache& head = cache.heads[static_cast<size_t>(h)];
    testing::expect_valid_recall_head(layer, head, h);
    const auto initial = press::sample_initial_rows(
        clustered, options.clusters, stream_seed(options.seed, static_cast<uint64_t>(3 * 2 + h)));
    const KMeans kmeans = press::cosine_kmeans(layer.k.data() + (h * 700 + sinks) * 8, clustered, 8,
                                               initial, options.iterations);
    ClusterIndex by_token;  // members = token positions
    by_token.head_dim = 8;
    by_token.add(kmeans, static_cast<int32_t>(sinks));
    const ClusterIndex& stored = press.index(3, h);
    EXPECT_EQ(stored.centroids, by_token.centroids);
    EXPECT_EQ(stored.offsets, by_token.offsets);
    // Sinks first, then cluster c's members as the block [sinks + offsets[c], sinks +
    // offsets[c + 1]), ascending positions inside it.
    for (int64_t e = 0; e < sinks; ++e) EXPECT_EQ(head.positions()[static_cast<size_t>(e)], e);
    for (int64_t m = 0; m < clustered; ++m) {
      EXPECT_EQ(stored.members[static_cast<size_t>(m)], sinks + m);
      EXPECT_EQ(head.positions()[static_cast<size_t>(sinks + m)],
                by_token.members[static_cast<size_t>(m)]);
    }
    for (int qh = 2 * h; qh < 2 * h + 2; ++qh) {
      for (int64_t t : {699, 350, 20}) {
        const float* q = layer.query(qh, t);
        std::vector<int32_t> selected;
        press.select(3, qh, q, head, selected);
        ASSERT_EQ(static_cast<int64_t>(selected.size()), budget);
        // Ascending entries: spans walked forwards.
        EXPECT_TRUE(std::is_sorted(selected.begin(), selected.end()));
        std::vector<int32_t> want(static_cast<size_t>(sinks));
        std::iota(want.begin(), want.end(), 0);
        const auto recalled =
            reference_recall(by_token, std::vector<float>(q, q + 8), budget - sinks);
        want.insert(want.end(), recalled.begin(), recalled.end());
        std::sort(want.begin(), want.end());
        EXPECT_EQ(sorted_positions(head, selected), want) << "query head " << qh << " row " << t;
      }
    }
  }
}

TEST(ClusterKv, PressKeepsEverythingAndSelectsSinksRecallAndNewTokens) {
  testing::SyntheticLayer layer(400, 4, 2, 8);
  layer.n_layers = 4;
  layer.layer = 2;
  layer.fill_random(21);
  press::ClusterKvOptions options;
  options.clusters = 10;
  options.recluster = 5;
  options.decode_clusters = 2;
  press::ClusterKvPress press(options);
  press.begin(layer.info(), testing::entries(64));
  // Layers below full_layers keep everything and attend to everything.
  LayerCache low = layer.empty_cache();
  auto low_view = layer.view();
  low_view.layer = 1;
  press.compress_prefill(low_view, low);
  EXPECT_FALSE(press.selects(1));
  LayerCache cache = layer.empty_cache();
  press.compress_prefill(layer.view(), cache);
  ASSERT_TRUE(press.selects(2));
  for (int h = 0; h < 2; ++h) {
    ASSERT_EQ(cache.heads[h].size(), 400);  // recallable: every entry stored
    testing::expect_valid_recall_head(layer, cache.heads[h], h);
    EXPECT_EQ(press.index(2, h).clusters(), 10);
    EXPECT_EQ(press.index(2, h).offsets.back(), 400 - 16);
  }
  std::vector<int32_t> selected;
  const float* q = layer.query(3, 399);
  press.select(2, 3, q, cache.heads[1], selected);
  ASSERT_EQ(selected.size(), 64u);  // B entries, sinks included
  for (int32_t e = 0; e < 16; ++e) EXPECT_EQ(selected[static_cast<size_t>(e)], e);
  std::vector<float> scores;
  std::vector<int32_t> order, recalled;
  press::recall_clusters(press.index(2, 1), q, 64 - 16, scores, order, recalled);
  std::sort(recalled.begin(), recalled.end());
  EXPECT_EQ(std::vector<int32_t>(selected.begin() + 16, selected.end()), recalled);

  // Decoded tokens are attended until `recluster` of them are clustered into decode_clusters.
  std::vector<float> row(8);
  for (int step = 0; step < 5; ++step) {
    for (int c = 0; c < 8; ++c) row[static_cast<size_t>(c)] = std::sin(float(step * 8 + c));
    for (auto& head : cache.heads) head.append(row.data(), row.data(), 400 + step);
    press.select(2, 3, q, cache.heads[1], selected);
    EXPECT_EQ(selected.back(), 400 + step);
    EXPECT_EQ(selected.size(), 64u + step + 1);
    DecodeStep decode_step;
    decode_step.layer = 2;
    decode_step.cache = &cache;
    press.on_decode(decode_step);
  }
  EXPECT_EQ(press.index(2, 1).clusters(), 12);
  EXPECT_EQ(press.index(2, 1).offsets.back(), 400 - 16 + 5);
  press.select(2, 3, q, cache.heads[1], selected);
  EXPECT_EQ(selected.size(), 64u);
  // The decoded entries were reordered cluster-contiguous in place: each still holds the row of
  // its own position, and each decode cluster is one block of entries.
  for (const HeadCache& head : cache.heads) {
    for (int64_t e = 400; e < 405; ++e) {
      const int32_t step = head.positions()[static_cast<size_t>(e)] - 400;
      ASSERT_GE(step, 0);
      ASSERT_LT(step, 5);
      for (int c = 0; c < 8; ++c) {
        EXPECT_EQ(head.key_floats(e)[c], std::sin(float(step * 8 + c)));
        EXPECT_EQ(head.value_floats(e)[c], std::sin(float(step * 8 + c)));
      }
    }
    const std::set<int32_t> decoded(head.positions().begin() + 400, head.positions().end());
    EXPECT_EQ(decoded, (std::set<int32_t>{400, 401, 402, 403, 404}));
  }
  const ClusterIndex& index = press.index(2, 1);
  for (int64_t m = 0; m < index.offsets.back(); ++m)
    EXPECT_EQ(index.members[static_cast<size_t>(m)], 16 + m);
}

TEST(ClusterKv, BudgetNotAboveTheSinksIsAnError) {
  testing::SyntheticLayer layer(100, 2, 1, 4);
  press::ClusterKvPress press({});
  EXPECT_THROW(press.begin(layer.info(), testing::entries(16)), Error);
  EXPECT_NO_THROW(press.begin(layer.info(), testing::entries(17)));
}

}  // namespace
}  // namespace protokv
