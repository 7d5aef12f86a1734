// SPDX-License-Identifier: Apache-2.0
#include "press/protokv.h"
#include "core/parallel.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "protokv/error.h"
#include "protokv/press/options.h"

namespace protokv::press {
namespace {

std::string to_string(Deviation d) {
  return d == Deviation::Chunk ? "chunk" : "neighbourhood";
}
std::string to_string(ClusterScore s) {
  return s == ClusterScore::Mean ? "mean" : "sum_logits";
}
std::string to_string(Selection s) {
  return s == Selection::Tokens ? "tokens" : "clusters";
}
std::string to_string(PrototypeSet p) {
  switch (p) {
    case PrototypeSet::Chunk:
      return "chunk";
    case PrototypeSet::Lsh:
      return "lsh";
    case PrototypeSet::Hybrid:
      break;
  }
  return "hybrid";
}

// Sum over the group's window queries of q . k_t for every prefix token: the token's share of
// psi (ProtoKV ICLR: psi(C) = (sum_m q_m) . (sum_{i in C} k_i) = sum_{i in C} (sum_m q_m) . k_i).
void window_logit_sums(const LayerView& layer, int kv_head, int64_t window, float* out) {
  const int64_t n = layer.n_tokens, n_prefix = n - window;
  const int d = layer.head_dim, group = layer.group_size();
  std::vector<float> query_sum(static_cast<size_t>(d), 0.0f);
  for (int g = 0; g < group; ++g) {
    const float* q = layer.q_head(kv_head * group + g);
    for (int64_t i = n_prefix; i < n; ++i)
      for (int c = 0; c < d; ++c) query_sum[static_cast<size_t>(c)] += q[i * d + c];
  }
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n_prefix), d, 1.0f,
              layer.k_head(kv_head), d, query_sum.data(), 1, 0.0f, out, 1);
}

}  // namespace

int64_t fused_pass_min_bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return 2 * (l2 > 0 ? static_cast<int64_t>(l2) : int64_t{2} << 20);
  }();
  return bytes;
}

void cluster_scores(const int32_t* assignment, const float* own, int64_t n, int count,
                    ClusterScore kind, float* score, std::vector<int64_t>& size) {
  // Four interleaved partial sums per cluster: consecutive tokens mostly share a cluster, and one
  // running sum would be a chain of n dependent double adds.
  constexpr int kWays = 4;
  thread_local std::vector<double> partial;  // [kWays, count]
  thread_local std::vector<float> cluster_score;
  partial.assign(static_cast<size_t>(kWays * count), 0.0);
  size.assign(static_cast<size_t>(count), 0);
  for (int64_t t = 0; t < n; ++t) {
    const auto c = static_cast<size_t>(assignment[t]);
    partial[static_cast<size_t>(t % kWays) * static_cast<size_t>(count) + c] += own[t];
    ++size[c];
  }
  cluster_score.assign(static_cast<size_t>(count), 0.0f);
  for (size_t c = 0; c < cluster_score.size(); ++c) {
    if (size[c] == 0) continue;
    const double sum =
        (partial[c] + partial[static_cast<size_t>(count) + c]) +
        (partial[2 * static_cast<size_t>(count) + c] + partial[3 * static_cast<size_t>(count) + c]);
    // Eq. 18: the cluster mean; psi is the cluster sum.
    cluster_score[c] =
        static_cast<float>(kind == ClusterScore::Mean ? sum / static_cast<double>(size[c]) : sum);
  }
  for (int64_t t = 0; t < n; ++t) score[t] = cluster_score[static_cast<size_t>(assignment[t])];
}

int64_t ProtoKvConfig::resolve_chunks(int64_t n_prefix) const {
  if (n_prefix <= 0) return 1;
  int64_t k = chunks;
  if (k <= 0) {
    k = std::llround(static_cast<double>(n_prefix) / static_cast<double>(chunk_len));
    k = std::clamp<int64_t>(k, 1, max_chunks);
  }
  return std::min(k, n_prefix);
}

ClusteringConfig ProtoKvConfig::clustering(int64_t n_prefix, int layer, int kv_head) const {
  ClusteringConfig c;
  c.chunks = resolve_chunks(n_prefix);
  c.lsh_bits = lsh_bits;
  c.irregular = std::min(irregular, n_prefix);
  c.gamma = gamma;
  c.lsh_seed = lsh_seed_for(seed, layer, kv_head);
  c.lsh_unit_keys = lsh_unit_keys;
  c.deviation = deviation;
  c.kappa = kappa;
  c.prototypes = prototypes;
  c.assignment = assignment;
  c.local_neighbours = local_neighbours;
  return c;
}

std::vector<OptionSpec> protokv_option_specs() {
  constexpr int64_t kLarge = int64_t{1} << 30;
  std::vector<OptionSpec> own = {
      choice_option("prototypes", "hybrid", {"hybrid", "chunk", "lsh"},
                    "ablations with the same prototype count k + u: chunk = k + u chunks, no "
                    "irregular set, no hashing; lsh = every prefix key hashed with "
                    "r' = round(log2(k + u)) bits (at most 12)",
                    "ProtoKV §4"),
      choice_option("score", "mean", {"mean", "sum_logits"},
                    "mean of the unpooled window scores over the token's cluster, or psi(C) = "
                    "(sum of the group's window queries) . (sum of C's keys), no softmax, no "
                    "pooling (ICLR version)",
                    "ProtoKV Eq. 18"),
      choice_option("select", "tokens", {"tokens", "clusters"},
                    "keep tokens by score, or whole clusters in score order, the last one "
                    "truncated by the tokens' own scores (ICLR version)"),
      choice_option("deviation", "chunk", {"chunk", "neighbourhood"},
                    "irregular set O by deviation from the chunk, or by -zscore of the mean "
                    "cosine to the keys within kappa positions (ICLR version)",
                    "ProtoKV Eq. 10"),
      derived(int_option("chunks", 0, 1, kLarge,
                         "k chunks; auto: clamp(round(n_prefix / chunk_len), 1, max_chunks), "
                         "never more than n_prefix"),
              "auto"),
      int_option("chunk_len", ProtoKvConfig::kDefaultChunkLen, 1, kLarge,
                 "tokens per chunk for chunks=auto"),
      int_option("max_chunks", ProtoKvConfig::kDefaultMaxChunks, 1, kLarge,
                 "cap of chunks=auto: about 500 prototypes at LongBench lengths", "ProtoKV Fig. 8"),
      int_option("lsh_bits", ProtoKvConfig::kDefaultLshBits, 1, 10, "r; u = 2^r LSH buckets",
                 "ProtoKV Eqs. 12-14"),
      derived(int_option("irregular", 0, 0, kLarge, "p, the size of the irregular set O",
                         "ProtoKV §5.5"),
              "3u"),
      double_option("gamma", ProtoKvConfig::kDefaultGamma, 1e-6, 1e6,
                    "std of the random Fourier features' W (the paper gives no value)",
                    "ProtoKV Eq. 12"),
      seed_option("seed", ProtoKvConfig::kDefaultSeed,
                  "LSH draws, per (layer, KV head) from this seed"),
      choice_option("lsh_input", "unit", {"unit", "raw"},
                    "unit hashes the L2-normalised key, a DEVIATION from Eq. 12, which hashes "
                    "the raw key (raw)",
                    "ProtoKV Eq. 12"),
      int_option("kappa", ProtoKvConfig::kDefaultKappa, 1, 4096,
                 "neighbourhood half-width, deviation=neighbourhood only"),
      choice_option("assign", "exact", {"exact", "local"},
                    "exact: Eq. 17 over every prototype; local: an APPROXIMATION, each token "
                    "compared only with its own and assign_neighbours chunks' prototypes and "
                    "the LSH buckets (needs prototypes=hybrid or chunk)",
                    "ProtoKV Eq. 17"),
      int_option("assign_neighbours", 1, 0, 1 << 20,
                 "chunks on each side a token is compared with, assign=local only"),
  };
  // Eq. 18 / Algorithm 1 lines 19-20 average the unpooled Eq. 4 scores: the cluster mean
  // replaces SnapKV's pooling, so protokv pools only when pool= is given.
  return concat(window_score_option_specs(ProtoKvConfig::kDefaultPool), own);
}

ProtoKvConfig read_protokv_options(OptionReader& options) {
  ProtoKvConfig config;
  const std::string prototypes = options.get_choice("prototypes");
  config.prototypes = prototypes == "chunk" ? PrototypeSet::Chunk
                      : prototypes == "lsh" ? PrototypeSet::Lsh
                                            : PrototypeSet::Hybrid;
  config.score =
      options.get_choice("score") == "mean" ? ClusterScore::Mean : ClusterScore::SumLogits;
  config.select =
      options.get_choice("select") == "tokens" ? Selection::Tokens : Selection::Clusters;
  config.deviation =
      options.get_choice("deviation") == "chunk" ? Deviation::Chunk : Deviation::Neighbourhood;
  if (config.score == ClusterScore::Mean) {
    config.window_scores = read_window_score_options(options);  // pool=1 unless given
  } else {
    config.window_scores.window = read_window_option(options);
    for (const char* key : {"pool", "pool_type", "gqa"})
      options.reject_if_given(key, "score=sum_logits (raw window logits: no softmax, no pooling)");
  }
  config.chunks = options.get_int("chunks", 0);  // 0: auto
  config.chunk_len = options.get_int("chunk_len");
  config.max_chunks = options.get_int("max_chunks");
  if (options.given("chunks")) {
    options.reject_if_given("chunk_len", "an explicit chunks= count");
    options.reject_if_given("max_chunks", "an explicit chunks= count");
  }
  config.lsh_bits = static_cast<int>(options.get_int("lsh_bits"));
  config.irregular = options.get_int("irregular", 3 * (int64_t{1} << config.lsh_bits));
  config.gamma = options.get_double("gamma");
  config.seed = options.get_seed("seed");
  // Eq. 12 applies phi to the raw key; we hash its direction by default (docs/methods.md).
  config.lsh_unit_keys = options.get_choice("lsh_input") == "unit";
  config.kappa = static_cast<int>(options.get_int("kappa"));
  if (config.deviation != Deviation::Neighbourhood)
    options.reject_if_given("kappa", "deviation=chunk (kappa is the neighbourhood half-width)");
  if (config.prototypes == PrototypeSet::Chunk) {
    for (const char* key : {"deviation", "kappa", "irregular", "gamma", "seed", "lsh_input"})
      options.reject_if_given(key, "prototypes=chunk (no irregular set, no hashing)");
  }
  if (config.prototypes == PrototypeSet::Lsh) {
    for (const char* key : {"deviation", "kappa", "irregular"})
      options.reject_if_given(key, "prototypes=lsh (every key is hashed, no irregular set)");
  }
  config.assignment =
      options.get_choice("assign") == "local" ? Assignment::Local : Assignment::Exact;
  config.local_neighbours = static_cast<int>(options.get_int("assign_neighbours"));
  if (config.assignment == Assignment::Exact)
    options.reject_if_given("assign_neighbours", "assign=exact (every prototype is compared)");
  if (config.assignment == Assignment::Local && config.prototypes == PrototypeSet::Lsh)
    throw Error("protokv: assign=local needs chunk prototypes (prototypes=hybrid or chunk)");
  return config;
}

void ProtoKvScorer::add_config(nlohmann::json& out) const {
  const ProtoKvConfig& c = config_;
  out["window"] = c.window_scores.window;
  if (c.score == ClusterScore::Mean) add_window_score_config(c.window_scores, out);
  if (c.chunks > 0) {
    out["chunks"] = c.chunks;
  } else {
    out["chunks"] = "auto";
    out["chunk_len"] = c.chunk_len;
    out["max_chunks"] = c.max_chunks;
  }
  out["lsh_bits"] = c.lsh_bits;
  out["buckets"] = 1 << c.lsh_bits;
  out["prototypes"] = to_string(c.prototypes);
  if (c.prototypes != PrototypeSet::Chunk) {
    out["gamma"] = c.gamma;
    out["seed"] = c.seed;
    out["lsh_input"] = c.lsh_unit_keys ? "unit" : "raw";
  }
  if (c.prototypes == PrototypeSet::Hybrid) {
    out["irregular"] = c.irregular;
    out["deviation"] = to_string(c.deviation);
    if (c.deviation == Deviation::Neighbourhood) out["kappa"] = c.kappa;
  }
  if (c.assignment == Assignment::Local) {
    out["assign"] = "local";  // approximate Eq. 17
    out["assign_neighbours"] = c.local_neighbours;
  }
  out["score"] = to_string(c.score);
  out["select"] = to_string(c.select);
}

void ProtoKvScorer::record_diagnostics(int layer, int h, Clustering clusters,
                                       std::vector<int64_t> cluster_size) {
  const size_t slot = static_cast<size_t>(layer * n_kv_heads_ + h);
  if (slot >= heads_.size()) return;  // begin() saw another shape: no diagnostics
  HeadDiagnostics& d = heads_[slot];
  const auto n_prefix = static_cast<int64_t>(clusters.assignment.size());
  int64_t non_empty = 0, largest = 0;
  for (const int64_t size : cluster_size) {
    non_empty += size > 0 ? 1 : 0;
    largest = std::max(largest, size);
  }
  d.clusters = static_cast<double>(non_empty);
  d.cluster_size_mean = non_empty > 0 ? static_cast<double>(n_prefix) / non_empty : 0.0;
  d.cluster_size_max = static_cast<double>(largest);
  d.irregular = static_cast<double>(clusters.irregular.size());
  d.outside_own_chunk = -1;
  if (clusters.n_chunks > 0 && n_prefix > 0) {
    // Eq. 17 re-assigns every token by cosine: it may leave its own chunk's prototype.
    int64_t outside = 0;
    for (int64_t m = 0; m < clusters.n_chunks; ++m) {
      const int64_t end = chunk_begin(m + 1, n_prefix, clusters.n_chunks);
      for (int64_t t = chunk_begin(m, n_prefix, clusters.n_chunks); t < end; ++t) {
        const int32_t c = clusters.assignment[static_cast<size_t>(t)];
        outside += c >= clusters.n_regular || clusters.origin[static_cast<size_t>(c)] != m ? 1 : 0;
      }
    }
    d.outside_own_chunk = static_cast<double>(outside) / static_cast<double>(n_prefix);
  }
  d.whole_cluster_budget_share = -1;
  d.assignment = std::move(clusters.assignment);
  d.cluster_size = std::move(cluster_size);
  d.scored = true;
}

void ProtoKvScorer::begin(const SequenceInfo& info) {
  n_kv_heads_ = info.n_kv_heads;
  heads_.assign(static_cast<size_t>(std::max(0, info.n_layers) * std::max(0, info.n_kv_heads)),
                HeadDiagnostics{});
}

void ProtoKvScorer::on_kept(int layer, int h, const std::vector<int32_t>& kept) {
  const size_t slot = static_cast<size_t>(layer * n_kv_heads_ + h);
  if (slot >= heads_.size() || !heads_[slot].scored) return;
  HeadDiagnostics& d = heads_[slot];
  const auto n_prefix = static_cast<int32_t>(d.assignment.size());
  std::vector<int64_t> kept_per_cluster(d.cluster_size.size(), 0);
  int64_t kept_prefix = 0;
  for (const int32_t t : kept) {
    if (t >= n_prefix) continue;  // the window
    ++kept_per_cluster[static_cast<size_t>(d.assignment[static_cast<size_t>(t)])];
    ++kept_prefix;
  }
  int64_t whole = 0;
  for (size_t c = 0; c < kept_per_cluster.size(); ++c)
    if (kept_per_cluster[c] > 0 && kept_per_cluster[c] == d.cluster_size[c])
      whole += kept_per_cluster[c];
  if (kept_prefix > 0)
    d.whole_cluster_budget_share = static_cast<double>(whole) / static_cast<double>(kept_prefix);
  d.assignment = {};
  d.cluster_size = {};
}

nlohmann::json ProtoKvScorer::diagnostics() const {
  nlohmann::json layers = nlohmann::json::array();
  if (n_kv_heads_ <= 0) return layers;
  for (size_t l = 0; l * static_cast<size_t>(n_kv_heads_) < heads_.size(); ++l) {
    double sum[6] = {0, 0, 0, 0, 0, 0};
    int count[6] = {0, 0, 0, 0, 0, 0};
    double size_max = 0;
    for (int h = 0; h < n_kv_heads_; ++h) {
      const HeadDiagnostics& d = heads_[l * static_cast<size_t>(n_kv_heads_) + h];
      if (!d.scored) continue;
      const double values[6] = {d.clusters,  d.cluster_size_mean, d.cluster_size_max,
                                d.irregular, d.outside_own_chunk, d.whole_cluster_budget_share};
      for (int i = 0; i < 6; ++i)
        if (values[i] >= 0) sum[i] += values[i], ++count[i];
      size_max = std::max(size_max, d.cluster_size_max);
    }
    if (count[0] == 0) {
      layers.push_back(nullptr);
      continue;
    }
    const auto mean = [&](int i) {
      return count[i] > 0 ? nlohmann::json(sum[i] / count[i]) : nlohmann::json(nullptr);
    };
    layers.push_back({{"clusters", mean(0)},
                      {"cluster_size_mean", mean(1)},
                      {"cluster_size_max", mean(2)},
                      {"cluster_size_max_over_heads", size_max},
                      {"irregular", mean(3)},
                      {"outside_own_chunk", mean(4)},
                      {"whole_cluster_budget_share", mean(5)}});
  }
  return layers;
}

void ProtoKvScorer::score(const LayerView& layer, int64_t window, LayerScores& out) {
  const int64_t n_prefix = layer.n_tokens - window;
  const int d = layer.head_dim;
  out.reset(layer.n_kv_heads, n_prefix, true, config_.select == Selection::Clusters);
  WindowScoreConfig window_config = config_.window_scores;
  window_config.window = window;
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) if (worth_parallel(layer))
  for (int h = 0; h < layer.n_kv_heads; ++h) {
    errors.run([&] {
      // The token's own score: pooled window attention (Eq. 4-5) or its window logit sum (psi).
      float* own = out.head_tie(h);
      const ClusteringConfig clustering = config_.clustering(n_prefix, layer.layer, h);
      // The chunk pass (Eq. 10-11 statistics) runs inside the window GEMM's loop over key blocks,
      // on each block's chunks while the GEMM has just read them: one read of the keys for both.
      const int64_t min_bytes =
          config_.fuse_min_bytes >= 0 ? config_.fuse_min_bytes : fused_pass_min_bytes();
      const bool fused_pass = config_.score == ClusterScore::Mean && n_prefix >= 1 &&
                              clustering.prototypes == PrototypeSet::Hybrid &&
                              clustering.deviation == Deviation::Chunk &&
                              n_prefix * d * static_cast<int64_t>(sizeof(float)) > min_bytes;
      thread_local ChunkPassStream pass;
      if (config_.score == ClusterScore::Mean) {
        KeyBlockVisitor visit;
        if (fused_pass) {
          const int64_t chunks = std::clamp<int64_t>(clustering.chunks, 1, n_prefix);
          pass.start(layer.k_head(h), n_prefix, d, chunks, clustering.local_reach(chunks));
          visit = [&](int64_t, int64_t end) { pass.advance(std::min(end, n_prefix)); };
        }
        window_scores_kv_head(layer, h, window_config, own, visit);
      } else {
        window_logit_sums(layer, h, window, own);
      }
      ChunkPassResult precomputed;
      if (fused_pass) precomputed = pass.result();
      Clustering clusters = cluster_keys(layer.k_head(h), n_prefix, d, clustering,
                                         fused_pass ? &precomputed : nullptr);
      std::vector<int64_t> size;
      cluster_scores(clusters.assignment.data(), own, n_prefix,
                     std::max(1, clusters.n_prototypes()), config_.score, out.head_score(h), size);
      if (config_.select == Selection::Clusters)
        std::copy(clusters.assignment.begin(), clusters.assignment.end(), out.head_group(h));
      record_diagnostics(layer.layer, h, std::move(clusters), std::move(size));
    });
  }
  errors.rethrow();
}

const PressEntry kProtoKvEntry{
    .name = "protokv",
    .allocator_role = AllocatorRole::Composes,
    .fixed_allocator = AllocatorKind::Uniform,
    .compresses = true,
    .help =
        [] {
          return std::string(
              "ProtoKV Algorithm 1 per KV head over the prefix keys (positions < n-w,\n"
              "post-RoPE): k consecutive chunks (sizes floor/ceil of n_prefix/k, covering\n"
              "every token); deviation delta = (1-cos(k_t, mu_m))/||sigma_m|| (Eq. 10); the\n"
              "top-p form the irregular set O; regular prototypes = normalised chunk sums\n"
              "without O (Eq. 11); O's keys are hashed with random Fourier features\n"
              "(Eqs. 12-14, r bits, u = 2^r buckets, W ~ N(0, gamma^2), b ~ U(0, 2pi));\n"
              "irregular prototypes = normalised bucket sums, empty buckets dropped (Eq. 15);\n"
              "every prefix token goes to the prototype of highest cosine (Eq. 17, one blocked\n"
              "GEMM); token score = mean of the UNPOOLED window scores over its cluster\n"
              "(Eq. 18); keep the top B-w (ties: the token's own window score, then lower\n"
              "position) plus the window. GQA: the scores are reduced over the group before\n"
              "the cluster mean. Variants of the ICLR version: deviation=, score=, select=;\n"
              "ablations: prototypes=; an opt-in approximation: assign=local\n"
              "(docs/methods.md gives how often it differs from exact).\n");
        },
    .options = protokv_option_specs,
    .make = [](const PressEntry& entry, OptionReader& options,
               const AllocatorConfig& allocator) -> std::unique_ptr<Press> {
      const ProtoKvConfig config = read_protokv_options(options);
      return std::make_unique<ScoringPress>(std::string(entry.name),
                                            std::make_unique<ProtoKvScorer>(config),
                                            config.window_scores.window, allocator);
    },
};

}  // namespace protokv::press
