// SPDX-License-Identifier: Apache-2.0
// core/rng.h: SplitMix64 must produce the reference sequence, so a seed gives the same synthetic
// models, layers and projections on every platform and after every refactor.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>

namespace protokv {
namespace {

TEST(Rng, SplitMix64MatchesReferenceSequence) {
  // First outputs of Vigna's splitmix64.c seeded with 0.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.next(), 0x06C45D188009454Full);
}

TEST(Rng, Mix64IsOneSplitMixStep) {
  for (const uint64_t seed : {uint64_t{0}, uint64_t{7}, uint64_t{20240611}, ~uint64_t{0}}) {
    SplitMix64 rng(seed);
    EXPECT_EQ(rng.next(), mix64(seed));
    EXPECT_EQ(rng.next(), mix64(seed + kSplitMixIncrement));
  }
}

TEST(Rng, StreamSeedsAreTheSplitMixSequence) {
  // stream_seed(seed, s) is the (s+1)-th output of SplitMix64(seed): streams 0, 1, 2, ... differ.
  SplitMix64 rng(7);
  for (uint64_t stream = 0; stream < 4; ++stream) EXPECT_EQ(stream_seed(7, stream), rng.next());
  EXPECT_NE(stream_seed(7, 0), stream_seed(7, 1));
}

TEST(Rng, UniformAndNormalStayInRange) {
  SplitMix64 rng(42);
  double sum = 0.0, sum_sq = 0.0;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double z = rng.normal();
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
  }
  // Mean 0 and variance 1 within about five standard errors.
  EXPECT_NEAR(sum / kDraws, 0.0, 0.04);
  EXPECT_NEAR(sum_sq / kDraws, 1.0, 0.05);
}

}  // namespace
}  // namespace protokv
