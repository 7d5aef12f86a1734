// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fidelity metrics (definitions: docs/DESIGN.md §6): every metric compares
// a compressed run ("press") against the full-cache run on the same tokens.
#include <cstdint>
#include <span>
#include <vector>

namespace protokv::eval {

// Median of a non-empty sample (mean of the two middle values for an even count); Error when
// empty.
double median(std::vector<double> values);

// KL(p ‖ q) in nats between softmax(p_logits) and softmax(q_logits), computed in double.
// Exactly 0 when the two logit vectors are equal. Both spans must have the same length.
double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits);

// Natural log of softmax(logits)[token], in double (for perplexity: ppl = exp(-mean log p)).
double log_softmax_at(std::span<const float> logits, int32_t token);

// True when both logit vectors have the same argmax (ties go to the lowest id).
bool same_top1(std::span<const float> a, std::span<const float> b);

// ‖ref − approx‖₂ / ‖ref‖₂ over n values (ProtoKV Eq. 2 measures this per head). Returns 0 when
// both are zero and +inf when only ref is zero.
double relative_error(const float* ref, const float* approx, int64_t n);

// Positions of the `count` largest weights (ties: lower position first), restricted to positions
// < limit, in decreasing weight order. `weights` and `positions` are parallel (cache order).
std::vector<int32_t> top_positions(std::span<const float> weights,
                                   std::span<const int32_t> positions, int32_t limit,
                                   int64_t count);

// Share of `truth` (distinct positions) found in `kept` (sorted ascending). 1 for an empty truth.
double recall(std::span<const int32_t> truth, std::span<const int32_t> kept_sorted);

// Mean, population standard deviation, min and max of a sample stream.
class RunningStats {
 public:
  void add(double x);
  int64_t count() const { return n_; }
  double mean() const { return n_ > 0 ? mean_ : 0.0; }
  double stddev() const;
  double min() const { return min_; }
  double max() const { return max_; }

 private:
  int64_t n_ = 0;
  double mean_ = 0.0;
  double m2_ = 0.0;  // Welford's sum of squared deviations
  double min_ = 0.0;
  double max_ = 0.0;
};

}  // namespace protokv::eval
