// SPDX-License-Identifier: Apache-2.0
#pragma once
// ClusterKV (DESIGN §5 clusterkv): recallable compression. Every entry stays in the
// cache; the keys of each KV head (layers >= full_layers, after `sinks` sink tokens) are grouped by
// cosine K-means into C0 = n/80 clusters at prefill. At each decode step every query head ranks
// its KV head's clusters by q·μ and attends over the sinks, the members of its best clusters up to
// the budget (the last cluster truncated) and the tokens generated since the last re-clustering;
// every `recluster` decode steps those new keys are clustered into `decode_clusters` clusters.
// The win on CPU is that decode attention reads only B entries; the memory stays that of the full
// cache. The press stores each clustered head cluster-contiguous (entries in cluster order, every
// entry keeping its own position and post-RoPE key), so a recall reads a few contiguous spans of
// K and V instead of B rows scattered over the whole cache.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <vector>

#include "press/entry.h"
#include "protokv/press.h"

namespace protokv::press {

// Cosine K-means over rows keys [n, d] (DESIGN §5 clusterkv): centroids start as the keys of
// `initial` (distinct rows, one per cluster); then `iterations` times, every key goes to the
// cluster of largest cosine similarity (the lowest index on ties; a zero centroid has similarity
// 0) and every non-empty cluster's centroid becomes the mean of its raw assigned keys (summed in
// double), an empty one keeping its centroid. labels [n] are those of the last assignment, so
// the centroids are the means of exactly the labelled members.
struct KMeans {
  std::vector<float> centroids;  // [clusters, d]
  std::vector<int32_t> labels;   // [n]
};
KMeans cosine_kmeans(const float* keys, int64_t n, int d, std::span<const int32_t> initial,
                     int iterations);

// `count` distinct rows of [0, n), sampled uniformly from `seed` (partial Fisher-Yates), in
// sampling order: the initial centroids.
std::vector<int32_t> sample_initial_rows(int64_t n, int64_t count, uint64_t seed);

// The clusters of one KV head in CSR order (DESIGN §5): centroids, member counts as prefix sums
// (offsets), members (cache entry indices) grouped by cluster, ascending within a cluster.
struct ClusterIndex {
  int head_dim = 0;
  std::vector<float> centroids;  // [clusters, head_dim]
  std::vector<int64_t> offsets{0};
  std::vector<int32_t> members;

  int64_t clusters() const { return static_cast<int64_t>(offsets.size()) - 1; }
  // Appends the clusters of `kmeans`, whose rows are cache entries first, first + 1, ...
  void add(const KMeans& kmeans, int32_t first);
  // The same clusters, for rows that will be stored in cluster order: returns `order`, row
  // order[i] (0-based among the clustered rows) to be stored as entry first + i, and the members
  // of the appended clusters are entries first, first + 1, ... (each cluster a contiguous block,
  // its rows ascending inside it, clusters in index order).
  std::vector<int32_t> add_contiguous(const KMeans& kmeans, int32_t first);
};

// Ranks `index`'s clusters by q·μ (descending; ties: lower cluster first; NaN last) far enough
// to cover `budget` entries: order[0, taken) are the clusters recall takes, in rank order, the
// last one truncated when it overflows the budget; returns taken. Exact: the taken prefix equals
// that of a full sort (a partial sort by the same strict total order, extended to a full sort
// when the clusters guessed from the mean cluster size do not reach the budget).
int64_t rank_clusters(const ClusterIndex& index, const float* q, int64_t budget,
                      std::vector<float>& scores, std::vector<int32_t>& order);

// Members of `index`'s clusters taken in order of q·μ (descending; ties: lower cluster first)
// until `budget` entries (the last cluster truncated to its first members), appended to `out`.
// `scores`, `order` are scratch. Exact: rank_clusters, fp32 dot products.
void recall_clusters(const ClusterIndex& index, const float* q, int64_t budget,
                     std::vector<float>& scores, std::vector<int32_t>& order,
                     std::vector<int32_t>& out);

struct ClusterKvOptions {
  static constexpr int64_t kDefaultSinks = 16;
  static constexpr int64_t kTokensPerCluster = 80;  // C0 = n / 80 (ClusterKV)
  static constexpr int kDefaultIterations = 20;
  static constexpr int64_t kDefaultRecluster = 320;
  static constexpr int64_t kDefaultDecodeClusters = 8;  // paper says 4 (DESIGN §5)
  static constexpr int kDefaultFullLayers = 2;
  static constexpr uint64_t kDefaultSeed = 3;

  int64_t sinks = kDefaultSinks;
  int64_t clusters = 0;  // 0: n / kTokensPerCluster, at least 1
  int iterations = kDefaultIterations;
  int64_t recluster = kDefaultRecluster;
  int64_t decode_clusters = kDefaultDecodeClusters;
  int full_layers = kDefaultFullLayers;
  uint64_t seed = kDefaultSeed;
};

class ClusterKvPress final : public Press {
 public:
  explicit ClusterKvPress(ClusterKvOptions options) : options_(options) {}
  std::string name() const override { return "clusterkv"; }
  nlohmann::json config() const override;
  void begin(const SequenceInfo& info, const Budget& budget) override;
  // Keeps every entry and builds the layer's cluster indexes.
  void compress_prefill(const LayerView& layer, LayerCache& out) override;
  void on_decode(const DecodeStep& step) override;
  bool selects(int layer) const override;
  void select(int layer, int q_head, const float* q, const HeadCache& head,
              std::vector<int32_t>& out) override;

  // The index of (layer, KV head) (tests).
  const ClusterIndex& index(int layer, int kv_head) const;

 private:
  struct HeadState {
    ClusterIndex index;
    int64_t indexed_end = 0;  // entries [sinks, indexed_end) are clustered; later ones are new
  };
  HeadState& state(int layer, int kv_head);
  const HeadState& state(int layer, int kv_head) const;

  // Stores head `h` of a clustered layer: sinks, then the clusters' members in cluster order.
  void store_clustered(const LayerView& layer, int h, HeadCache& out);

  ClusterKvOptions options_;
  SequenceInfo info_;
  int64_t budget_ = 0;               // resolved entries attended per query head (sinks included)
  std::vector<HeadState> heads_;     // [n_layers, n_kv_heads]
  std::vector<char> layer_indexed_;  // [n_layers]: compress_prefill built its indexes
  std::vector<std::vector<float>> score_scratch_;    // [n_heads]
  std::vector<std::vector<int32_t>> order_scratch_;  // [n_heads]
};

extern const PressEntry kClusterKvEntry;

}  // namespace protokv::press
