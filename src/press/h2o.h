// SPDX-License-Identifier: Apache-2.0
#pragma once
// H2O (Zhang et al., "heavy hitters"): score = column sums of the full causal attention of every
// prompt query, reduced over the GQA group (mean by default); keep the top B - w prefix entries
// plus the last w. Option decode=1 adds H2O's decode-time policy: every decode step adds the new
// query's attention to the scores of the entries it saw, and when a head is over its budget the
// lowest-scored entry outside the recent window is evicted. With decode=1 the budget is split as
// in H2O's code (heavy_budget + recent_budget, half and half in its scripts): the last `recent`
// tokens (default B/2) are always kept, in prefill and in decode, and the other B - recent
// entries are heavy hitters.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "press/entry.h"
#include "protokv/press/scoring_press.h"
#include "protokv/press/window_scores.h"

namespace protokv::press {

// Column sums of the causal softmax attention of all n queries of one head over keys [0, limit):
//   out[j] = sum_{i >= j} softmax_i(q_i . k_{0..i} / sqrt(d))[j]
// computed `tile` query rows at a time (a [tile, n] block, never n x n). q, k: [n, d]; out [limit].
void h2o_column_sums(const float* q, const float* k, int64_t n, int d, int64_t limit, int64_t tile,
                     float* out);

class H2oScorer final : public Scorer {
 public:
  static constexpr int64_t kDefaultTile = 64;

  H2oScorer(GqaReduce gqa, bool keep_all_key_scores, int64_t tile = kDefaultTile)
      : gqa_(gqa), keep_all_key_scores_(keep_all_key_scores), tile_(tile) {}
  std::string name() const override { return "h2o"; }
  void add_config(nlohmann::json& out) const override;
  void score(const LayerView& layer, int64_t window, LayerScores& out) override;
  // Scores of all n keys of the last scored layer, window included: [n_kv_heads, n]. Filled only
  // when constructed with keep_all_key_scores.
  const std::vector<float>& all_key_scores() const { return all_key_scores_; }

 private:
  GqaReduce gqa_;
  bool keep_all_key_scores_;
  int64_t tile_;
  std::vector<float> all_key_scores_;
};

class H2oPress final : public ScoringPress {
 public:
  // recent= when not given: half the resolved budget.
  static constexpr int64_t kRecentHalfBudget = 0;

  // `window` is the kept recent window without decode eviction; with it, `recent` (or B/2 for
  // kRecentHalfBudget) replaces it once begin() knows the budget.
  H2oPress(std::unique_ptr<H2oScorer> scorer, int64_t window, AllocatorConfig allocator,
           bool decode_eviction, GqaReduce gqa, int64_t recent = kRecentHalfBudget);
  nlohmann::json config() const override;
  void begin(const SequenceInfo& info, const Budget& budget) override;
  // Uses the engine's attention weights (step.probs); recomputes them only for rows that
  // append() feeds, which come without. Allocates nothing once its scratch has grown.
  void on_decode(const DecodeStep& step) override;
  bool wants_decode_probabilities() const override { return decode_eviction_; }

  // Accumulated scores of `layer`, head `h`, aligned with its cache entries (tests).
  const std::vector<float>& decode_scores(int layer, int h) const;

 protected:
  void on_kept(int layer, int h, const std::vector<int32_t>& kept) override;

 private:
  struct HeadState {
    bool active = false;        // set once the prefill of this head was compressed
    int64_t capacity = 0;       // entries the head may hold (its prefill budget)
    std::vector<float> scores;  // [cache size] accumulated attention per entry
  };
  HeadState& state(int layer, int h);

  H2oScorer* h2o_;  // owned by the base class
  bool decode_eviction_;
  GqaReduce gqa_;
  int64_t recent_;
  int n_kv_heads_ = 0;
  std::vector<HeadState> states_;  // [n_layers, n_kv_heads]
  // Per-step scratch, reused.
  std::vector<float> probs_scratch_;    // [group, entries]
  std::vector<float> keys_scratch_;     // [entries, head_dim]: the head's keys as F32
  std::vector<float> reduced_scratch_;  // [entries]
  std::vector<char> evicted_scratch_;   // [entries]
  std::vector<int32_t> keep_scratch_;
  std::vector<float> kept_scores_scratch_;
};

extern const PressEntry kH2oEntry;

}  // namespace protokv::press
