// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "eval/metrics.h"
#include "protokv/error.h"

namespace protokv::eval {
namespace {

TEST(Metrics, KlOfADistributionAgainstItselfIsExactlyZero) {
  const std::vector<float> logits = {0.3f, -1.2f, 4.0f, 2.5f, -7.0f};
  EXPECT_EQ(kl_divergence(logits, logits), 0.0);
}

TEST(Metrics, KlMatchesAHandComputation) {
  // p = softmax(0, ln 2) = (1/3, 2/3); q = softmax(0, 0) = (1/2, 1/2).
  const std::vector<float> p = {0.0f, std::log(2.0f)};
  const std::vector<float> q = {0.0f, 0.0f};
  const double expected =
      (1.0 / 3.0) * std::log((1.0 / 3.0) / 0.5) + (2.0 / 3.0) * std::log((2.0 / 3.0) / 0.5);
  EXPECT_NEAR(kl_divergence(p, q), expected, 1e-7);
  // KL is not symmetric: KL(q || p) = ½ ln(½ / ⅓) + ½ ln(½ / ⅔).
  const double reverse = 0.5 * std::log(0.5 / (1.0 / 3.0)) + 0.5 * std::log(0.5 / (2.0 / 3.0));
  EXPECT_NEAR(kl_divergence(q, p), reverse, 1e-7);
}

TEST(Metrics, KlIgnoresAConstantShiftOfTheLogits) {
  const std::vector<float> a = {1.0f, 2.0f, 3.0f};
  const std::vector<float> b = {11.0f, 12.0f, 13.0f};
  EXPECT_NEAR(kl_divergence(a, b), 0.0, 1e-12);
}

TEST(Metrics, KlRejectsMismatchedSizes) {
  const std::vector<float> a = {1.0f, 2.0f};
  const std::vector<float> b = {1.0f};
  EXPECT_THROW(kl_divergence(a, b), Error);
}

TEST(Metrics, LogSoftmaxAtMatchesHandComputation) {
  // softmax(0, ln 3) = (1/4, 3/4).
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(log_softmax_at(logits, 1), std::log(0.75), 1e-7);
  EXPECT_NEAR(log_softmax_at(logits, 0), std::log(0.25), 1e-7);
  EXPECT_THROW(log_softmax_at(logits, 2), Error);
}

TEST(Metrics, Top1AgreementUsesTheLowestIdOnTies) {
  const std::vector<float> a = {1.0f, 5.0f, 5.0f};
  const std::vector<float> b = {1.0f, 5.0f, 2.0f};
  const std::vector<float> c = {1.0f, 2.0f, 5.0f};
  EXPECT_TRUE(same_top1(a, a));
  EXPECT_TRUE(same_top1(a, b));  // a's argmax is id 1 (first of the tie)
  EXPECT_FALSE(same_top1(a, c));
}

TEST(Metrics, RelativeErrorHandCase) {
  const float ref[] = {3.0f, 4.0f};
  const float approx[] = {3.0f, 0.0f};
  EXPECT_NEAR(relative_error(ref, approx, 2), 4.0 / 5.0, 1e-12);
  EXPECT_EQ(relative_error(ref, ref, 2), 0.0);
  const float zero[] = {0.0f, 0.0f};
  EXPECT_EQ(relative_error(zero, zero, 2), 0.0);
  EXPECT_TRUE(std::isinf(relative_error(zero, ref, 2)));
}

TEST(Metrics, TopPositionsRestrictsToThePromptAndBreaksTiesByPosition) {
  // Cache order is not position order; position 40 is a continuation token (limit 32).
  const std::vector<float> weights = {0.10f, 0.30f, 0.05f, 0.30f, 0.25f};
  const std::vector<int32_t> positions = {7, 12, 3, 9, 40};
  const auto top = top_positions(weights, positions, 32, 3);
  EXPECT_EQ(top, (std::vector<int32_t>{9, 12, 7}));
  // Asking for more than there are returns every prompt position.
  EXPECT_EQ(top_positions(weights, positions, 32, 10).size(), 4u);
}

TEST(Metrics, RecallHandCase) {
  const std::vector<int32_t> truth = {1, 5, 9};
  const std::vector<int32_t> kept = {0, 1, 2, 9};  // sorted
  EXPECT_NEAR(recall(truth, kept), 2.0 / 3.0, 1e-12);
  EXPECT_EQ(recall(truth, truth), 1.0);
  EXPECT_EQ(recall({}, kept), 1.0);
  EXPECT_EQ(recall(truth, {}), 0.0);
}

TEST(Metrics, RunningStatsMeanStdMinMax) {
  RunningStats s;
  for (double x : {4.0, 1.0, 3.0, 2.0}) s.add(x);
  EXPECT_EQ(s.count(), 4);
  EXPECT_DOUBLE_EQ(s.mean(), 2.5);
  EXPECT_NEAR(s.stddev(), std::sqrt(1.25), 1e-12);  // population std
  EXPECT_EQ(s.min(), 1.0);
  EXPECT_EQ(s.max(), 4.0);
  RunningStats one;
  one.add(0.0);
  EXPECT_EQ(one.mean(), 0.0);
  EXPECT_EQ(one.stddev(), 0.0);
}

}  // namespace
}  // namespace protokv::eval
