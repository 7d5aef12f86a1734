// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace protokv {

struct SamplerOptions {
  float temperature = 0.8f;  // 0: greedy (argmax, ties to the lowest id)
  int top_k = 40;            // 0: off
  float top_p = 0.95f;       // 1: off
  uint64_t seed = 42;
};

class Sampler {
 public:
  explicit Sampler(SamplerOptions options);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace protokv
