// SPDX-License-Identifier: Apache-2.0
#include "eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "protokv/error.h"

namespace protokv::eval {
namespace {

// log Σ exp(x) in double, max-subtracted.
double log_sum_exp(std::span<const float> logits) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (float x : logits) max_logit = std::max(max_logit, static_cast<double>(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  return max_logit + std::log(sum);
}

}  // namespace

double median(std::vector<double> values) {
  PROTOKV_CHECK(!values.empty(), "median of an empty sample");
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits) {
  PROTOKV_CHECK(p_logits.size() == q_logits.size() && !p_logits.empty(),
                "kl_divergence: logit vectors of sizes {} and {}", p_logits.size(),
                q_logits.size());
  const double p_norm = log_sum_exp(p_logits);
  const double q_norm = log_sum_exp(q_logits);
  double kl = 0.0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double log_p = static_cast<double>(p_logits[i]) - p_norm;
    const double log_q = static_cast<double>(q_logits[i]) - q_norm;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  // Rounding can leave a tiny negative value for nearly equal distributions; KL is >= 0.
  return std::max(kl, 0.0);
}

double log_softmax_at(std::span<const float> logits, int32_t token) {
  PROTOKV_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(),
                "log_softmax_at: token {} out of range [0, {})", token, logits.size());
  return static_cast<double>(logits[static_cast<size_t>(token)]) - log_sum_exp(logits);
}

bool same_top1(std::span<const float> a, std::span<const float> b) {
  // std::max_element returns the first maximum: ties go to the lowest id, as protokv::argmax.
  const auto ia = std::max_element(a.begin(), a.end()) - a.begin();
  const auto ib = std::max_element(b.begin(), b.end()) - b.begin();
  return ia == ib;
}

double relative_error(const float* ref, const float* approx, int64_t n) {
  double diff2 = 0.0, ref2 = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(ref[i]) - static_cast<double>(approx[i]);
    diff2 += d * d;
    ref2 += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  if (ref2 == 0.0) return diff2 == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff2 / ref2);
}

std::vector<int32_t> top_positions(std::span<const float> weights,
                                   std::span<const int32_t> positions, int32_t limit,
                                   int64_t count) {
  PROTOKV_CHECK(weights.size() == positions.size(), "top_positions: {} weights for {} positions",
                weights.size(), positions.size());
  std::vector<int32_t> candidates;  // indices into weights
  candidates.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    if (positions[i] < limit) candidates.push_back(static_cast<int32_t>(i));
  }
  const auto before = [&](int32_t a, int32_t b) {
    if (weights[a] != weights[b]) return weights[a] > weights[b];
    return positions[a] < positions[b];
  };
  const size_t k = static_cast<size_t>(std::clamp<int64_t>(count, 0, candidates.size()));
  std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(k),
                    candidates.end(), before);
  std::vector<int32_t> top(k);
  for (size_t i = 0; i < k; ++i) top[i] = positions[static_cast<size_t>(candidates[i])];
  return top;
}

double recall(std::span<const int32_t> truth, std::span<const int32_t> kept_sorted) {
  if (truth.empty()) return 1.0;
  int64_t found = 0;
  for (int32_t p : truth) {
    if (std::binary_search(kept_sorted.begin(), kept_sorted.end(), p)) ++found;
  }
  return static_cast<double>(found) / static_cast<double>(truth.size());
}

void RunningStats::add(double x) {
  ++n_;
  if (n_ == 1) {
    min_ = max_ = x;
  } else {
    min_ = std::min(min_, x);
    max_ = std::max(max_, x);
  }
  const double delta = x - mean_;
  mean_ += delta / static_cast<double>(n_);
  m2_ += delta * (x - mean_);
}

double RunningStats::stddev() const {
  return n_ > 1 ? std::sqrt(std::max(m2_, 0.0) / static_cast<double>(n_)) : 0.0;
}

}  // namespace protokv::eval
