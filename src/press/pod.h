// SPDX-License-Identifier: Apache-2.0
#pragma once
// PoD (DESIGN §5 pod), training-free: per KV head, the proximal entries (the first
// `sinks` = n_s and the last n_r = B - n_s) keep their own keys at every layer; the distant ones
// in between keep their keys only at the lowest layer ℓ_a of the head's block of layers, and every
// other layer of the block reads them from there (HeadCache::share_keys) with its own query.
// Values always stay per layer; decode attention is one softmax over proximal + distant logits,
// which equals the gate of paper Eq. 4. The paper post-trains the model for this; we do not.
//
// Blocks come from a table ([kv_head][layer] -> lowest layer of the block, e.g. read from a
// calibration profile) or, without one, from the prompt itself as the layers arrive at prefill:
// the attention rows of the last `queries` prompt queries, compared between layers by
// attention_similarity (1 - JS divergence, averaged over the query heads of a KV head) and
// grouped by pod_block_starts (paper Algorithm 1, threshold `delta`).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "press/calibration_profile.h"
#include "press/entry.h"
#include "protokv/press.h"

namespace protokv::press {

struct PodOptions {
  static constexpr int64_t kDefaultSinks = 16;    // n_s (PoD §3)
  static constexpr int64_t kDefaultQueries = 32;  // q calibration rows per head
  static constexpr double kDefaultDelta = 0.5;    // grouping threshold δ (PoD §3)

  int64_t sinks = kDefaultSinks;
  int64_t queries = kDefaultQueries;
  double delta = kDefaultDelta;
  // Gate threshold τ (PoD §2.3): at a layer that shares keys, a query head skips the
  // distant entries when its gate g_{ℓ,i} of Eq. 4 is >= tau. Empty: never skip.
  std::optional<double> tau;
  // Which gate τ is compared with. false (tau_gate=layer, default, the paper's §2.3 "for layers
  // within a block that are not the lowest, we can preemptively evaluate g_{ℓ,i}"): this
  // layer's own gate, Σexp a^P_ℓ / (Σexp a^P_ℓ + Σexp a^D_ℓ), from its own proximal logits
  // (its query, its keys) and the distant exp-sum of the block's lowest layer at this step —
  // a^D_ℓ = Q_{ℓa} K_{ℓa}^T (Eq. 3) is that layer's, so the gate is exact with scores=lower and
  // costs the proximal logits only; with scores=own the lowest layer's distant exp-sum stands in
  // for this layer's own (an approximation). true (tau_gate=lowest, the first implementation):
  // the block's lowest layer's own gate (its proximal share), the same at every layer above.
  bool gate_at_lowest = false;
  // Distant logits: the block's lowest layer's query and keys, i.e. its attention scores (paper
  // 004 Eq. 3, scores=lower, default), or this layer's query with those keys (DESIGN §5's
  // reading, scores=own).
  bool lower_query = true;
  // [kv_head][layer] -> lowest layer of that layer's block (a calibration profile). Empty: the
  // blocks are calibrated on the prompt. Seam for `profile=FILE`.
  std::optional<std::vector<std::vector<int>>> block_start;
  // The profile block_start came from (`profile=FILE`), checked against the model at begin().
  const CalibrationProfile* profile = nullptr;
  std::string profile_path;
};

// Throws Error unless `table` is a valid block table for n_kv_heads x n_layers: every block is a
// run of consecutive layers and each layer names its block's lowest layer.
void validate_block_table(const std::vector<std::vector<int>>& table, int n_kv_heads, int n_layers);

// The attention rows of the last `queries` prompt queries of every query head of KV head
// `kv_head`: softmax over keys 0 .. position of the query (causal), zeros after.
// Returns [group, queries, n_tokens].
std::vector<float> last_query_attention_rows(const LayerView& layer, int kv_head, int64_t queries);

class PodPress final : public Press {
 public:
  explicit PodPress(PodOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "pod"; }
  nlohmann::json config() const override;
  void begin(const SequenceInfo& info, const Budget& budget) override;
  void compress_prefill(const LayerView& layer, LayerCache& out) override;
  void on_decode(const DecodeStep& step) override;
  bool wants_decode_probabilities() const override { return options_.tau && compressing_; }
  bool selects(int layer) const override;
  void select(int layer, int q_head, const float* q, const HeadCache& head,
              std::vector<int32_t>& out) override;

  // [kv_head][layer] -> lowest layer of its block, as used (calibrated layers so far).
  const std::vector<std::vector<int>>& block_starts() const { return block_start_; }

 private:
  // Greedy grouping of layer.layer for every KV head from the prompt's attention rows.
  void calibrate(const LayerView& layer);
  // PoD Eq. 4's gate of query head `q_head` at a sharing layer (tau_gate=layer): its query `q`
  // on the entries whose keys `head` holds, against the key lender's distant exp-sum.
  double layer_gate(int q_head, const float* q, const HeadCache& head) const;

  struct Calibration {
    std::vector<std::vector<float>> block_rows;  // attention rows of the current block's layers
    std::vector<int> block_layers;               // their layers, ascending
    std::map<std::pair<int, int>, double> similarity;  // (layer, earlier layer) -> sim
  };
  // KV head `kv_head`'s calibration state for `layer`; Error when either is outside the shape
  // begin() was told (a caller driving the press directly with a layer of another model).
  Calibration& calibration(int layer, int kv_head);

  PodOptions options_;
  SequenceInfo info_;
  int64_t budget_ = 0;
  int64_t recent_ = 0;  // n_r = B - n_s
  bool compressing_ = false;
  int next_layer_ = 0;  // the layer the online calibration expects next
  std::vector<std::vector<int>> block_start_;
  std::vector<Calibration> calibration_;  // [kv_head]
  // τ: per layer and query head, the gate of Eq. 4 at this decode step (0 when unknown), and
  // log Σexp of the distant logits (NaN when unknown; -inf when there is no distant entry).
  std::vector<std::vector<float>> gate_;          // [layer][q_head]
  std::vector<std::vector<double>> distant_lse_;  // [layer][q_head]
  std::vector<uint8_t> layer_shares_;  // [layer]: some KV head reads keys from a lower layer
};

extern const PressEntry kPodEntry;

}  // namespace protokv::press
