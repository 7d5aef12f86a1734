// SPDX-License-Identifier: Apache-2.0
#pragma once
// ProtoKV (Algorithm 1; variants from its ICLR version). Per KV head, over
// the prefix keys (positions < n - w): hybrid semantic prototypes (chunk means for regular tokens,
// LSH buckets for the irregular ones), every token assigned to its nearest prototype, the
// observation-window scores averaged over each cluster (Eq. 18), then the top B - w tokens by
// that score (ties by the token's own score) plus the window.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "press/entry.h"
#include "press/protokv_clustering.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press/window_scores.h"

namespace protokv::press {

class OptionReader;

enum class ClusterScore { Mean, SumLogits };
enum class Selection { Tokens, Clusters };

struct ProtoKvConfig {
  static constexpr int64_t kDefaultChunkLen = 16;
  static constexpr int64_t kDefaultMaxChunks = 496;
  static constexpr int kDefaultLshBits = 2;
  static constexpr double kDefaultGamma = 1.0;
  static constexpr uint64_t kDefaultSeed = 0;
  static constexpr int kDefaultKappa = 5;
  static constexpr int kDefaultPool = 1;  // Eq. 18: unpooled window scores (snapkv pools 7)

  static WindowScoreConfig default_window_scores() {
    WindowScoreConfig c;
    c.pool = kDefaultPool;
    return c;
  }

  WindowScoreConfig window_scores = default_window_scores();
  int64_t chunks = 0;  // 0: automatic, k = clamp(round(n_prefix / chunk_len), 1, max_chunks)
  int64_t chunk_len = kDefaultChunkLen;
  int64_t max_chunks = kDefaultMaxChunks;
  int lsh_bits = kDefaultLshBits;
  int64_t irregular = 3 * (1 << kDefaultLshBits);  // p = 3u by default (ProtoKV §5.5)
  double gamma = kDefaultGamma;
  uint64_t seed = kDefaultSeed;
  bool lsh_unit_keys = true;  // lsh_input=unit (default, a stated deviation from Eq. 12) | raw
  Deviation deviation = Deviation::Chunk;
  int kappa = kDefaultKappa;
  ClusterScore score = ClusterScore::Mean;
  Selection select = Selection::Tokens;
  PrototypeSet prototypes = PrototypeSet::Hybrid;
  Assignment assignment = Assignment::Exact;  // assign=local: opt-in approximation of Eq. 17
  int local_neighbours = 1;
  // The chunk pass runs inside the window GEMM's loop over key blocks when a head's prefix keys
  // take more than this many bytes (-1: twice this core's L2 cache, see fused_pass_min_bytes());
  // below it a separate pass after the GEMM finds the keys still in cache and costs less. Results
  // are bit-identical either way; tests set 0 to force the fused path.
  int64_t fuse_min_bytes = -1;

  // k for a prefix of n_prefix tokens (never more than n_prefix).
  int64_t resolve_chunks(int64_t n_prefix) const;
  ClusteringConfig clustering(int64_t n_prefix, int layer, int kv_head) const;
};

// Twice this core's L2 cache in bytes (sysconf; 2 x 2 MiB where it is not known): measured on the
// 2 MiB-L2 machine of the README, the separate chunk pass is cheaper up to 4K-token heads (2 MiB
// of keys at head_dim 128), equal at 8K and dearer at 16K.
int64_t fused_pass_min_bytes();

// ProtoKV Eq. 18 for every token: the mean (score=mean) or the sum (sum_logits) of `own` over its
// cluster, summed in double. score [n]; size [count] receives the tokens per cluster.
void cluster_scores(const int32_t* assignment, const float* own, int64_t n, int count,
                    ClusterScore kind, float* score, std::vector<int64_t>& size);

// Reads every protokv option; throws Error for contradictory combinations.
// protokv's option schema (the snapkv window-score rows with pool=1, then its own) and their
// reader.
std::vector<OptionSpec> protokv_option_specs();
ProtoKvConfig read_protokv_options(OptionReader& options);

class ProtoKvScorer final : public Scorer {
 public:
  explicit ProtoKvScorer(ProtoKvConfig config) : config_(config) {}
  std::string name() const override { return "protokv"; }
  void add_config(nlohmann::json& out) const override;
  void begin(const SequenceInfo& info) override;
  void score(const LayerView& layer, int64_t window, LayerScores& out) override;
  void on_kept(int layer, int h, const std::vector<int32_t>& kept) override;
  // Per layer, averaged over the KV heads: clusters (non-empty), cluster_size_mean/max,
  // irregular (|O|), outside_own_chunk (share of prefix tokens whose prototype is not their own
  // chunk's; null without chunks), whole_cluster_budget_share (share of the kept prefix tokens
  // whose whole cluster was kept). Null for a layer that was not compressed.
  nlohmann::json diagnostics() const override;
  const ProtoKvConfig& protokv_config() const { return config_; }

 private:
  struct HeadDiagnostics {
    bool scored = false;
    double clusters = 0, cluster_size_mean = 0, cluster_size_max = 0, irregular = 0;
    double outside_own_chunk = -1;           // < 0: no chunks (prototypes=lsh)
    double whole_cluster_budget_share = -1;  // < 0: nothing of the prefix kept
    std::vector<int32_t> assignment;         // kept until on_kept
    std::vector<int64_t> cluster_size;
  };
  void record_diagnostics(int layer, int h, Clustering clusters, std::vector<int64_t> cluster_size);

  ProtoKvConfig config_;
  int n_kv_heads_ = 0;
  std::vector<HeadDiagnostics> heads_;  // [n_layers * n_kv_heads]
};

extern const PressEntry kProtoKvEntry;

}  // namespace protokv::press
