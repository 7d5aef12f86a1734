// SPDX-License-Identifier: Apache-2.0
#include "press/clusterkv.h"
#include "core/parallel.h"

#include <fmt/format.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/rng.h"
#include "kernels/kernels.h"
#include "protokv/error.h"
#include "protokv/press/options.h"
#include "protokv/press/scores.h"
#include "protokv/press/scoring_press.h"

namespace protokv::press {

std::vector<int32_t> sample_initial_rows(int64_t n, int64_t count, uint64_t seed) {
  PROTOKV_CHECK(count >= 1 && count <= n, "k-means: {} clusters for {} keys", count, n);
  std::vector<int32_t> rows(static_cast<size_t>(n));
  std::iota(rows.begin(), rows.end(), 0);
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    const auto pick = i + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(n - i));
    std::swap(rows[static_cast<size_t>(i)], rows[static_cast<size_t>(pick)]);
  }
  rows.resize(static_cast<size_t>(count));
  return rows;
}

KMeans cosine_kmeans(const float* keys, int64_t n, int d, std::span<const int32_t> initial,
                     int iterations) {
  const auto clusters = static_cast<int64_t>(initial.size());
  PROTOKV_CHECK(clusters >= 1 && clusters <= n && iterations >= 1,
                "k-means: {} clusters, {} keys, {} iterations", clusters, n, iterations);
  KMeans result;
  result.centroids.resize(static_cast<size_t>(clusters * d));
  for (int64_t c = 0; c < clusters; ++c)
    std::copy(keys + int64_t{initial[static_cast<size_t>(c)]} * d,
              keys + (int64_t{initial[static_cast<size_t>(c)]} + 1) * d,
              result.centroids.begin() + c * d);
  result.labels.assign(static_cast<size_t>(n), 0);

  std::vector<float> unit(static_cast<size_t>(clusters * d));  // centroids / |centroid|
  std::vector<float> similarity(static_cast<size_t>(n * clusters));
  std::vector<double> sums(static_cast<size_t>(clusters * d));
  std::vector<int64_t> counts(static_cast<size_t>(clusters));
  for (int it = 0; it < iterations; ++it) {
    // Assign: cos(k, μ) = k·μ / (|k| |μ|); |k| > 0 does not change the argmax over clusters.
    for (int64_t c = 0; c < clusters; ++c) {
      const float* mu = result.centroids.data() + c * d;
      const float norm = std::sqrt(kernels::dot(mu, mu, d));
      const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
      for (int i = 0; i < d; ++i) unit[static_cast<size_t>(c * d + i)] = mu[i] * inv;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                static_cast<int>(clusters), d, 1.0f, keys, d, unit.data(), d, 0.0f,
                similarity.data(), static_cast<int>(clusters));
    for (int64_t j = 0; j < n; ++j) {
      const float* row = similarity.data() + j * clusters;
      int64_t best = 0;
      for (int64_t c = 1; c < clusters; ++c)
        if (row[c] > row[best]) best = c;
      result.labels[static_cast<size_t>(j)] = static_cast<int32_t>(best);
    }
    // Update: the mean of the raw assigned keys; an empty cluster keeps its centroid.
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t c = result.labels[static_cast<size_t>(j)];
      ++counts[static_cast<size_t>(c)];
      for (int i = 0; i < d; ++i) sums[static_cast<size_t>(c * d + i)] += keys[j * d + i];
    }
    for (int64_t c = 0; c < clusters; ++c) {
      const int64_t count = counts[static_cast<size_t>(c)];
      if (count == 0) continue;
      for (int i = 0; i < d; ++i)
        result.centroids[static_cast<size_t>(c * d + i)] =
            static_cast<float>(sums[static_cast<size_t>(c * d + i)] / static_cast<double>(count));
    }
  }
  return result;
}

void ClusterIndex::add(const KMeans& kmeans, int32_t first) {
  const int64_t added = static_cast<int64_t>(kmeans.centroids.size()) / head_dim;
  centroids.insert(centroids.end(), kmeans.centroids.begin(), kmeans.centroids.end());
  // Counting sort by label: members of a cluster stay in ascending entry order.
  std::vector<int64_t> start(static_cast<size_t>(added + 1), 0);
  for (int32_t label : kmeans.labels) ++start[static_cast<size_t>(label) + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  const int64_t base = offsets.back();
  for (int64_t c = 1; c <= added; ++c) offsets.push_back(base + start[static_cast<size_t>(c)]);
  members.resize(static_cast<size_t>(base + static_cast<int64_t>(kmeans.labels.size())));
  for (size_t j = 0; j < kmeans.labels.size(); ++j)
    members[static_cast<size_t>(base + start[static_cast<size_t>(kmeans.labels[j])]++)] =
        first + static_cast<int32_t>(j);
}

std::vector<int32_t> ClusterIndex::add_contiguous(const KMeans& kmeans, int32_t first) {
  const int64_t base = offsets.back();
  add(kmeans, first);
  std::vector<int32_t> order(members.begin() + base, members.end());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] -= first;
    members[static_cast<size_t>(base) + i] = first + static_cast<int32_t>(i);
  }
  return order;
}

int64_t rank_clusters(const ClusterIndex& index, const float* q, int64_t budget,
                      std::vector<float>& scores, std::vector<int32_t>& order) {
  const int64_t clusters = index.clusters();
  const int d = index.head_dim;
  scores.resize(static_cast<size_t>(clusters));
  order.resize(static_cast<size_t>(clusters));
  if (clusters == 0 || budget <= 0) return 0;
  for (int64_t c = 0; c < clusters; ++c) {
    const float s = kernels::dot(q, index.centroids.data() + c * d, d);
    scores[static_cast<size_t>(c)] = std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
  }
  std::iota(order.begin(), order.end(), 0);
  // A strict total order (score descending, then index), so any exact sort gives one ranking.
  const auto ranks_before = [&](int32_t a, int32_t b) {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  };
  // Only the ranked prefix that covers the budget is needed: sort twice the clusters that the
  // mean cluster size suggests, and the rest only if they fall short (the partial sort leaves
  // every cluster after the prefix ranked below it, so sorting the rest completes the order).
  const int64_t members = std::max<int64_t>(1, index.offsets.back());
  const int64_t guess = 2 * ((budget * clusters + members - 1) / members) + 8;
  int64_t sorted = std::min(clusters, guess);
  std::partial_sort(order.begin(), order.begin() + sorted, order.end(), ranks_before);
  int64_t left = budget, taken = 0;
  while (left > 0 && taken < clusters) {
    if (taken == sorted) {
      std::sort(order.begin() + sorted, order.end(), ranks_before);
      sorted = clusters;
    }
    const auto c = static_cast<size_t>(order[static_cast<size_t>(taken++)]);
    left -= index.offsets[c + 1] - index.offsets[c];
  }
  return taken;
}

void recall_clusters(const ClusterIndex& index, const float* q, int64_t budget,
                     std::vector<float>& scores, std::vector<int32_t>& order,
                     std::vector<int32_t>& out) {
  const int64_t taken = rank_clusters(index, q, budget, scores, order);
  int64_t left = budget;
  for (int64_t i = 0; i < taken; ++i) {
    const auto c = static_cast<size_t>(order[static_cast<size_t>(i)]);
    const int64_t begin = index.offsets[c];
    const int64_t take = std::min(left, index.offsets[c + 1] - begin);
    out.insert(out.end(), index.members.begin() + begin, index.members.begin() + begin + take);
    left -= take;
  }
}

nlohmann::json ClusterKvPress::config() const {
  nlohmann::json out;
  out["name"] = "clusterkv";
  out["sinks"] = options_.sinks;
  out["clusters"] = options_.clusters > 0
                        ? nlohmann::json(options_.clusters)
                        : nlohmann::json(fmt::format("n/{}", ClusterKvOptions::kTokensPerCluster));
  out["iterations"] = options_.iterations;
  out["recluster"] = options_.recluster;
  out["decode_clusters"] = options_.decode_clusters;
  out["full_layers"] = options_.full_layers;
  out["seed"] = options_.seed;
  out["training_free"] = true;
  return out;
}

void ClusterKvPress::begin(const SequenceInfo& info, const Budget& budget) {
  info_ = info;
  budget_ = budget.resolve(info.n_tokens);
  if (budget_ < info.n_tokens && budget_ <= options_.sinks)
    fail("press 'clusterkv': budget {} leaves no room beside its {} sinks", budget_,
         options_.sinks);
  heads_.assign(static_cast<size_t>(std::max(0, info.n_layers) * std::max(0, info.n_kv_heads)),
                HeadState{});
  for (HeadState& h : heads_) h.index.head_dim = info.head_dim;
  layer_indexed_.assign(static_cast<size_t>(std::max(0, info.n_layers)), 0);
  score_scratch_.assign(static_cast<size_t>(std::max(0, info.n_heads)), {});
  order_scratch_.assign(static_cast<size_t>(std::max(0, info.n_heads)), {});
}

ClusterKvPress::HeadState& ClusterKvPress::state(int layer, int kv_head) {
  return heads_.at(static_cast<size_t>(layer * info_.n_kv_heads + kv_head));
}
const ClusterKvPress::HeadState& ClusterKvPress::state(int layer, int kv_head) const {
  return heads_.at(static_cast<size_t>(layer * info_.n_kv_heads + kv_head));
}
const ClusterIndex& ClusterKvPress::index(int layer, int kv_head) const {
  return state(layer, kv_head).index;
}

void ClusterKvPress::store_clustered(const LayerView& layer, int h, HeadCache& out) {
  const int64_t n = layer.n_tokens;
  const int64_t clustered = n - options_.sinks;
  const int64_t wanted = options_.clusters > 0
                             ? options_.clusters
                             : std::max<int64_t>(1, n / ClusterKvOptions::kTokensPerCluster);
  const int64_t clusters = std::min(wanted, clustered);
  const int d = layer.head_dim;
  HeadState& s = state(layer.layer, h);
  const auto initial = sample_initial_rows(
      clustered, clusters,
      stream_seed(options_.seed, static_cast<uint64_t>(layer.layer * layer.n_kv_heads + h)));
  const KMeans kmeans = cosine_kmeans(layer.k_head(h) + options_.sinks * d, clustered, d, initial,
                                      options_.iterations);
  // Sinks first, then every cluster's members as one block: a recalled cluster is one span.
  const auto sinks = static_cast<int32_t>(options_.sinks);
  std::vector<int32_t> rows(static_cast<size_t>(n));
  std::iota(rows.begin(), rows.begin() + sinks, 0);
  const std::vector<int32_t> order = s.index.add_contiguous(kmeans, sinks);
  for (size_t i = 0; i < order.size(); ++i) rows[static_cast<size_t>(sinks) + i] = sinks + order[i];
  out.assign_rows(layer.k_head(h), layer.v_head(h), layer.positions, rows);
  s.indexed_end = n;
}

void ClusterKvPress::compress_prefill(const LayerView& layer, LayerCache& out) {
  const int64_t n = layer.n_tokens;
  if (layer.layer < options_.full_layers || n <= options_.sinks) {
    keep_all(layer, out);  // recallable: everything stays
    return;
  }
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int h = 0; h < layer.n_kv_heads; ++h)
    errors.run([&] { store_clustered(layer, h, out.heads[static_cast<size_t>(h)]); });
  errors.rethrow();
  layer_indexed_[static_cast<size_t>(layer.layer)] = 1;
}

bool ClusterKvPress::selects(int layer) const {
  return layer >= 0 && static_cast<size_t>(layer) < layer_indexed_.size() &&
         layer_indexed_[static_cast<size_t>(layer)] != 0;
}

void ClusterKvPress::select(int layer, int q_head, const float* q, const HeadCache& head,
                            std::vector<int32_t>& out) {
  const int kv_head = q_head / (info_.n_heads / info_.n_kv_heads);
  const HeadState& s = state(layer, kv_head);
  out.clear();
  const int64_t sinks = std::min(options_.sinks, head.size());
  for (int64_t e = 0; e < sinks; ++e) out.push_back(static_cast<int32_t>(e));
  std::vector<int32_t>& order = order_scratch_[static_cast<size_t>(q_head)];
  const int64_t budget = budget_ - sinks;
  const int64_t taken =
      rank_clusters(s.index, q, budget, score_scratch_[static_cast<size_t>(q_head)], order);
  if (taken > 0) {
    // The last-ranked taken cluster is the one truncated to the budget.
    const auto last = static_cast<size_t>(order[static_cast<size_t>(taken - 1)]);
    int64_t whole = 0;
    for (int64_t i = 0; i + 1 < taken; ++i) {
      const auto c = static_cast<size_t>(order[static_cast<size_t>(i)]);
      whole += s.index.offsets[c + 1] - s.index.offsets[c];
    }
    const int64_t last_take =
        std::min(budget - whole, s.index.offsets[last + 1] - s.index.offsets[last]);
    // Clusters in index order are blocks in ascending entry order: sorting the taken clusters
    // (not their members) lets the gathered kernel walk memory forwards, span after span.
    std::sort(order.begin(), order.begin() + taken);
    for (int64_t i = 0; i < taken; ++i) {
      const auto c = static_cast<size_t>(order[static_cast<size_t>(i)]);
      const int64_t begin = s.index.offsets[c];
      const int64_t take = c == last ? last_take : s.index.offsets[c + 1] - begin;
      out.insert(out.end(), s.index.members.begin() + begin,
                 s.index.members.begin() + begin + take);
    }
  }
  // Tokens generated since the last re-clustering are always attended.
  for (int64_t e = s.indexed_end; e < head.size(); ++e) out.push_back(static_cast<int32_t>(e));
}

void ClusterKvPress::on_decode(const DecodeStep& step) {
  if (!selects(step.layer)) return;
  const int d = info_.head_dim;
  for (int h = 0; h < info_.n_kv_heads; ++h) {
    HeadState& s = state(step.layer, h);
    const HeadCache& head = step.cache->heads[static_cast<size_t>(h)];
    if (head.size() - s.indexed_end < options_.recluster) continue;
    // Decode-time clustering (ClusterKV): the `recluster` newest keys get their own clusters.
    const int64_t count = options_.recluster;
    const int64_t clusters = std::min(options_.decode_clusters, count);
    const auto initial =
        sample_initial_rows(count, clusters,
                            stream_seed(options_.seed ^ static_cast<uint64_t>(s.indexed_end),
                                        static_cast<uint64_t>(step.layer * info_.n_kv_heads + h)));
    std::vector<float> newest(static_cast<size_t>(count * d));
    head.read_keys(s.indexed_end, count, newest.data());
    const KMeans kmeans = cosine_kmeans(newest.data(), count, d, initial, options_.iterations);
    // Stored cluster-contiguous like the prompt's clusters (entries keep their positions).
    step.cache->heads[static_cast<size_t>(h)].reorder(
        s.indexed_end, s.index.add_contiguous(kmeans, static_cast<int32_t>(s.indexed_end)));
    s.indexed_end += count;
  }
}

const PressEntry kClusterKvEntry{
    .name = "clusterkv",
    .allocator_role = AllocatorRole::None,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return fmt::format(
              "training-free, recallable (ClusterKV): keeps EVERY entry; layers >= full_layers\n"
              "cluster each KV head's keys after the sinks by cosine k-means (C0 = n/{} by\n"
              "default, {} iterations, init by sampled tokens). Each decode step, every query\n"
              "head ranks its clusters by q.centroid and attends over the sinks + its best\n"
              "clusters' members up to the budget B (sinks included; the last cluster\n"
              "truncated) + the tokens decoded since the last re-clustering; every `recluster`\n"
              "steps those are clustered into `decode_clusters`. Memory = full cache;\n"
              "decode attention reads B entries per head.\n",
              ClusterKvOptions::kTokensPerCluster, ClusterKvOptions::kDefaultIterations);
        },
    .options =
        [] {
          constexpr int64_t kLarge = int64_t{1} << 30;
          return std::vector<OptionSpec>{
              int_option("sinks", ClusterKvOptions::kDefaultSinks, 0, kLarge,
                         "the first tokens: never clustered, always attended"),
              derived(int_option("clusters", 0, 0, kLarge, "prompt clusters C0 per head",
                                 "ClusterKV (C0 = L/80)"),
                      fmt::format("n/{}", ClusterKvOptions::kTokensPerCluster)),
              int_option("iterations", ClusterKvOptions::kDefaultIterations, 1, 1000,
                         "cosine k-means iterations"),
              int_option("recluster", ClusterKvOptions::kDefaultRecluster, 1, kLarge,
                         "decode steps between clusterings of the newly decoded tokens"),
              int_option("decode_clusters", ClusterKvOptions::kDefaultDecodeClusters, 1, 1 << 20,
                         "clusters made of each batch of decoded tokens (the paper says 4)"),
              int_option("full_layers", ClusterKvOptions::kDefaultFullLayers, 0, 1 << 20,
                         "the first layers attend over the full cache"),
              seed_option("seed", ClusterKvOptions::kDefaultSeed,
                          "k-means initialisation (sampled tokens)"),
          };
        },
    .make = [](const PressEntry&, OptionReader& options,
               const AllocatorConfig&) -> std::unique_ptr<Press> {
      ClusterKvOptions o;
      o.sinks = options.get_int("sinks");
      o.clusters = options.get_int("clusters", 0);  // 0: n / kTokensPerCluster
      o.iterations = static_cast<int>(options.get_int("iterations"));
      o.recluster = options.get_int("recluster");
      o.decode_clusters = options.get_int("decode_clusters");
      o.full_layers = static_cast<int>(options.get_int("full_layers"));
      o.seed = options.get_seed("seed");
      return std::make_unique<ClusterKvPress>(o);
    },
    .recalls = true,
};

}  // namespace protokv::press
