// SPDX-License-Identifier: Apache-2.0
#pragma once
// Expected Attention (Devoto, Jeblick and Jégou, "Expected Attention: KV Cache Compression by
// Estimating Attention from Future Queries Distribution"), as kvpress's ExpectedAttentionPress: the
// queries still to come are modelled as a Gaussian whose mean and covariance are those of the
// prompt's pre-RoPE queries, rotated by the RoPE matrix averaged over the next `future` positions;
// a key's expected (unnormalised) attention is then E[exp(q.k / sqrt(d))] = exp(mu.k / sqrt(d) +
// k^T Sigma k / (2d)), softmax-normalised over the keys, averaged over the query heads of the
// KV head and multiplied by the value's norm. Query-agnostic: nothing of the question is seen.
#include <nlohmann/json.hpp>

#include "press/entry.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press/window_scores.h"

namespace protokv::press {

struct ExpectedAttentionOptions {
  int64_t sinks = 4;       // kvpress n_sink: the first tokens, always kept and left out of the
                           // statistics (their hidden states are outliers)
  int64_t future = 512;    // kvpress n_future_positions: the positions the rotation is averaged
                           // over, starting right after the prompt
  bool covariance = true;  // kvpress use_covariance: the k^T Sigma k / (2d) term
  bool vnorm = true;       // kvpress use_vnorm: score = (p + epsilon) * ||v||
  double epsilon = 0.0;    // kvpress epsilon
  GqaReduce gqa = GqaReduce::Mean;  // kvpress averages the group's probabilities
};

class ExpectedAttentionScorer final : public Scorer {
 public:
  explicit ExpectedAttentionScorer(ExpectedAttentionOptions options) : options_(options) {}
  std::string name() const override { return "expected_attention"; }
  void add_config(nlohmann::json& out) const override;
  void score(const LayerView& layer, int64_t window, LayerScores& out) override;

 private:
  ExpectedAttentionOptions options_;
};

extern const PressEntry kExpectedAttentionEntry;

}  // namespace protokv::press
