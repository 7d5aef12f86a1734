#include <gtest/gtest.h>

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

TEST(Sampler, RejectsBadOptions) {
  EXPECT_THROW(Sampler({.temperature = -1.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = -2}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 0.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.5f}), Error);
}

}  // namespace
}  // namespace protokv
