// SPDX-License-Identifier: Apache-2.0
#pragma once
// One portable random source for everything built from a seed (synthetic models, layers and
// workloads, random-weight models, seeded projections): SplitMix64 (Steele, Lea & Flood 2014,
// the seeding generator of Vigna's xoshiro family). Its output is the same on every platform,
// unlike std::normal_distribution, whose algorithm is implementation-defined.
#include <cmath>
#include <cstdint>
#include <numbers>

namespace protokv {

// SplitMix64's golden-ratio increment (2^64 / phi).
inline constexpr uint64_t kSplitMixIncrement = 0x9E3779B97F4A7C15ull;

// SplitMix64's output for state `x` (the state after one increment): a strong 64-bit mix, used
// to derive independent streams from a seed, e.g. mix64(seed ^ key) or mix64(seed + k·increment).
constexpr uint64_t mix64(uint64_t x) {
  x += kSplitMixIncrement;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Seed of the `stream`-th independent stream derived from one user seed (stream 0, 1, ...).
constexpr uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  return mix64(seed + kSplitMixIncrement * stream);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    const uint64_t x = state_;
    state_ += kSplitMixIncrement;
    return mix64(x);
  }
  // Uniform in [0, 1) from the top 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller; 1 - uniform() lies in (0, 1], so the log is finite.
  double normal() {
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace protokv
