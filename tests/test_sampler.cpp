// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "protokv/error.h"
#include "protokv/sampler.h"

namespace protokv {
namespace {

TEST(Sampler, ArgmaxTiesGoToLowestId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(argmax(logits), 1);
  EXPECT_EQ(argmax(std::vector<float>{-3.0f}), 0);
}

TEST(Sampler, GreedyPicksArgmax) {
  Sampler sampler({.temperature = 0.0f, .top_k = 40, .top_p = 0.95f, .seed = 1});
  EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 0.3f, 3.0f, 0.2f}), 2);
  EXPECT_EQ(sampler.sample(std::vector<float>{7.0f, 0.3f, 7.0f, 0.2f}), 0);
}

TEST(Sampler, TopKOneIsGreedy) {
  Sampler sampler({.temperature = 1.5f, .top_k = 1, .top_p = 1.0f, .seed = 3});
  const std::vector<float> logits = {1.0f, 1.2f, 0.9f, 1.1f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sampler.sample(logits), 1);
}

TEST(Sampler, TinyTopPIsGreedy) {
  Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1e-6f, .seed = 3});
  const std::vector<float> logits = {1.0f, 1.2f, 0.9f, 1.19f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sampler.sample(logits), 1);
}

TEST(Sampler, SameSeedSameSequence) {
  const SamplerOptions options{.temperature = 0.9f, .top_k = 0, .top_p = 1.0f, .seed = 77};
  Sampler a(options), b(options);
  Sampler c({.temperature = 0.9f, .top_k = 0, .top_p = 1.0f, .seed = 78});
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(a.sample(logits));
    sb.push_back(b.sample(logits));
    sc.push_back(c.sample(logits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);  // 200 draws over ~50 tokens: a collision of whole sequences is impossible
}

TEST(Sampler, FollowsSoftmaxWithTemperature) {
  // p ∝ exp(logit / T): logits log(1), log(2), log(5) with T = 1 give 0.125, 0.25, 0.625.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f)};
  const int draws = 40000;
  auto frequencies = [&](float temperature) {
    Sampler sampler({.temperature = temperature, .top_k = 0, .top_p = 1.0f, .seed = 5});
    std::vector<double> counts(3, 0.0);
    for (int i = 0; i < draws; ++i) counts[static_cast<size_t>(sampler.sample(logits))] += 1.0;
    for (double& c : counts) c /= draws;
    return counts;
  };
  const auto t1 = frequencies(1.0f);
  EXPECT_NEAR(t1[0], 1.0 / 8, 0.015);
  EXPECT_NEAR(t1[1], 2.0 / 8, 0.015);
  EXPECT_NEAR(t1[2], 5.0 / 8, 0.015);
  // T = 0.5 squares the weights: 1, 4, 25 over 30.
  const auto t05 = frequencies(0.5f);
  EXPECT_NEAR(t05[0], 1.0 / 30, 0.01);
  EXPECT_NEAR(t05[1], 4.0 / 30, 0.015);
  EXPECT_NEAR(t05[2], 25.0 / 30, 0.015);
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f), std::log(2.0f)};
  // top-k 2: tokens 2 and 1 (the tie 1/3 goes to the lower id): weights 5 and 2.
  Sampler top_k({.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = 9});
  int count1 = 0;
  for (int i = 0; i < 20000; ++i) {
    const int32_t t = top_k.sample(logits);
    ASSERT_TRUE(t == 1 || t == 2) << t;
    count1 += t == 1;
  }
  EXPECT_NEAR(count1 / 20000.0, 2.0 / 7, 0.02);
  // Probabilities 0.1, 0.2, 0.5, 0.2: top-p 0.6 keeps {2, 1} (0.5 + 0.2 >= 0.6).
  Sampler top_p({.temperature = 1.0f, .top_k = 0, .top_p = 0.6f, .seed = 9});
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = top_p.sample(logits);
    ASSERT_TRUE(t == 1 || t == 2) << t;
  }
}

// Exact distribution the sampler must follow, computed independently in double precision:
// softmax(logit / T), keep the top k (ties to the lower id), then the smallest prefix whose
// mass reaches p, renormalised over what is kept.
std::vector<double> truncated_distribution(const std::vector<float>& logits, double temperature,
                                           int top_k, double top_p) {
  std::vector<int> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  if (top_k > 0 && static_cast<size_t>(top_k) < order.size()) order.resize(top_k);
  std::vector<double> weight(order.size());
  double total = 0.0;
  for (size_t r = 0; r < order.size(); ++r)
    total += weight[r] =
        std::exp(static_cast<double>(logits[static_cast<size_t>(order[r])]) / temperature);
  size_t kept = order.size();
  if (top_p < 1.0) {
    double cumulative = 0.0;
    for (kept = 0; kept < order.size();) {
      cumulative += weight[kept++] / total;
      if (cumulative >= top_p - 1e-12) break;
    }
  }
  double kept_total = 0.0;
  for (size_t r = 0; r < kept; ++r) kept_total += weight[r];
  std::vector<double> p(logits.size(), 0.0);
  for (size_t r = 0; r < kept; ++r) p[static_cast<size_t>(order[r])] = weight[r] / kept_total;
  return p;
}

std::vector<double> sampled_frequencies(const SamplerOptions& options,
                                        const std::vector<float>& logits, int draws) {
  Sampler sampler(options);
  std::vector<double> counts(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) counts[static_cast<size_t>(sampler.sample(logits))] += 1.0;
  for (double& c : counts) c /= draws;
  return counts;
}

// Every token's frequency within 5 standard deviations of its exact probability (a fixed seed
// makes the test deterministic; 5 sigma keeps it far from the edge for any seed), and tokens
// outside the support never drawn.
void expect_follows(const SamplerOptions& options, const std::vector<float>& logits,
                    const std::vector<double>& expected) {
  constexpr int kDraws = 200000;
  ASSERT_EQ(expected.size(), logits.size());
  const std::vector<double> freq = sampled_frequencies(options, logits, kDraws);
  for (size_t t = 0; t < logits.size(); ++t) {
    const double want = expected[t];
    const double sigma = std::sqrt(want * (1.0 - want) / kDraws);
    if (want > 0.0)
      EXPECT_NEAR(freq[t], want, 5.0 * sigma + 1e-12) << "token " << t;
    else
      EXPECT_EQ(freq[t], 0.0) << "token " << t << " is outside the support";
  }
}

TEST(SamplerDistribution, TopKRenormalisesOverTheKept) {
  // Weights 1, 2, 5, 2, 3: top-3 keeps ids 2 (5), 4 (3) and 1 (2; the tie with id 3 goes to the
  // lower id), probabilities 5/10, 3/10, 2/10.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f), std::log(2.0f),
                                     std::log(3.0f)};
  const std::vector<double> exact = {0.0, 0.2, 0.5, 0.0, 0.3};
  const SamplerOptions options{.temperature = 1.0f, .top_k = 3, .top_p = 1.0f, .seed = 11};
  const auto independent = truncated_distribution(logits, 1.0, 3, 1.0);
  for (size_t t = 0; t < exact.size(); ++t) EXPECT_NEAR(independent[t], exact[t], 1e-6);
  expect_follows(options, logits, exact);
}

TEST(SamplerDistribution, TopPRenormalisesOverTheNucleus) {
  // Probabilities 0.1, 0.2, 0.5, 0.2: top-p 0.6 keeps {2, 1} (0.5 + 0.2 >= 0.6), renormalised to
  // 5/7 and 2/7 (without renormalisation the leftover 0.3 would land on one token).
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f), std::log(2.0f)};
  const std::vector<double> exact = {0.0, 2.0 / 7, 5.0 / 7, 0.0};
  expect_follows({.temperature = 1.0f, .top_k = 0, .top_p = 0.6f, .seed = 12}, logits, exact);
}

TEST(SamplerDistribution, TopKThenTopP) {
  // Weights 1, 2, 5, 2, 3 (total 13). top-k 4 keeps ids 2, 4, 1, 3 (total 12); top-p 0.8 over
  // those: 5/12 = 0.42, 8/12 = 0.67, 10/12 = 0.83 >= 0.8, so ids 2, 4, 1 with 5/10, 3/10, 2/10.
  // Top-p over all 13 would not stop there (10/13 = 0.77 < 0.8) and would add id 3.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f), std::log(2.0f),
                                     std::log(3.0f)};
  expect_follows({.temperature = 1.0f, .top_k = 4, .top_p = 0.8f, .seed = 13}, logits,
                 {0.0, 0.2, 0.5, 0.0, 0.3});
  expect_follows({.temperature = 1.0f, .top_k = 4, .top_p = 0.8f, .seed = 13}, logits,
                 truncated_distribution(logits, 1.0, 4, 0.8));
}

TEST(SamplerDistribution, TemperatureWithTruncation) {
  // T = 0.5 squares the weights 1, 2, 5, 2, 3 into 1, 4, 25, 4, 9 (total 43); top-p 0.8 keeps
  // 25/43 = 0.58, then 34/43 = 0.79, then 38/43 = 0.88 >= 0.8: ids 2, 4, 1 with 25, 9, 4 over 38.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f), std::log(2.0f),
                                     std::log(3.0f)};
  expect_follows({.temperature = 0.5f, .top_k = 0, .top_p = 0.8f, .seed = 14}, logits,
                 {0.0, 4.0 / 38, 25.0 / 38, 0.0, 9.0 / 38});
  // T = 2 takes square roots: sqrt(1), sqrt(2), sqrt(5), sqrt(2), sqrt(3), no truncation.
  const double total = 1.0 + std::sqrt(2.0) + std::sqrt(5.0) + std::sqrt(2.0) + std::sqrt(3.0);
  expect_follows({.temperature = 2.0f, .top_k = 0, .top_p = 1.0f, .seed = 15}, logits,
                 {1.0 / total, std::sqrt(2.0) / total, std::sqrt(5.0) / total,
                  std::sqrt(2.0) / total, std::sqrt(3.0) / total});
}

TEST(SamplerDistribution, CumulativeSumEqualToPStopsThere) {
  // Four equal logits: each 1/4 exactly in floating point. With p = 0.5 the second token brings
  // the cumulative sum to exactly 0.5, which reaches p: the nucleus is ids 0 and 1 (ties in id
  // order), each 1/2. A strict '>' would take a third token.
  const std::vector<float> logits = {1.5f, 1.5f, 1.5f, 1.5f};
  // Built element by element: with the braced list {0.5, 0.5, 0.0, 0.0} here, GCC 12.2 at -O2
  // -march=native handed expect_follows four times 0.5 (correct at -O0, without -march=native,
  // and under ASan/UBSan).
  std::vector<double> two_of_four(4, 0.0);
  two_of_four[0] = two_of_four[1] = 0.5;
  expect_follows({.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .seed = 16}, logits, two_of_four);
  // p = 0.75 likewise stops at exactly three tokens.
  std::vector<double> three_of_four(4, 1.0 / 3);
  three_of_four[3] = 0.0;
  expect_follows({.temperature = 1.0f, .top_k = 0, .top_p = 0.75f, .seed = 17}, logits,
                 three_of_four);
}

TEST(Sampler, RejectsBadOptions) {
  EXPECT_THROW(Sampler({.temperature = -1.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = -2}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 0.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.5f}), Error);
}

}  // namespace
}  // namespace protokv
