// SPDX-License-Identifier: Apache-2.0
// Token sampling: greedy, or temperature + top-k + top-p (nucleus) from a seeded mt19937_64.
#include "protokv/sampler.h"

#include <algorithm>
#include <cmath>

#include "protokv/error.h"

namespace protokv {
namespace {

// Uniform in [0, 1) from the top 53 bits: the same stream on every platform (unlike
// std::uniform_real_distribution, whose algorithm is implementation-defined).
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Higher logit first; equal logits in id order, so results do not depend on the sort.
bool better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  PROTOKV_CHECK(!logits.empty(), "cannot sample from empty logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lowest id
  return static_cast<int32_t>(best);
}

Sampler::Sampler(SamplerOptions options) : options_(options), rng_(options.seed) {
  PROTOKV_CHECK(std::isfinite(options_.temperature) && options_.temperature >= 0.0f,
                "temperature must be >= 0, got {}", options_.temperature);
  PROTOKV_CHECK(options_.top_k >= 0, "top-k must be >= 0, got {}", options_.top_k);
  PROTOKV_CHECK(options_.top_p > 0.0f && options_.top_p <= 1.0f, "top-p must be in (0, 1], got {}",
                options_.top_p);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (options_.temperature == 0.0f) return argmax(logits);
  PROTOKV_CHECK(!logits.empty(), "cannot sample from empty logits");

  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) candidates_[i] = {logits[i], static_cast<int32_t>(i)};
  size_t keep = candidates_.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) {
    keep = static_cast<size_t>(options_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                      candidates_.end(), better);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), better);
  }
  candidates_.resize(keep);

  // Softmax of logit / temperature over the candidates (sorted, so the first is the maximum).
  const float max_logit = candidates_.front().first;
  double total = 0.0;
  for (auto& [value, id] : candidates_) {
    value = std::exp((value - max_logit) / options_.temperature);
    total += value;
  }
  // Nucleus: the smallest prefix whose probability reaches top_p (at least one token).
  if (options_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t n = 0;
    while (n < candidates_.size()) {
      cumulative += candidates_[n].first / total;
      ++n;
      if (cumulative >= options_.top_p) break;
    }
    candidates_.resize(n);
    total = 0.0;
    for (const auto& c : candidates_) total += c.first;
  }

  const double r = uniform01(rng_) * total;
  double cumulative = 0.0;
  for (const auto& [weight, id] : candidates_) {
    cumulative += weight;
    if (r < cumulative) return id;
  }
  return candidates_.back().second;  // r rounded up to the total
}

}  // namespace protokv
