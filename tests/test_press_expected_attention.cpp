// SPDX-License-Identifier: Apache-2.0
// Expected Attention (kvpress's ExpectedAttentionPress): the scorer against a naive double
// reference written from kvpress's formulas (dense averaged RoPE matrix, pre-RoPE queries given
// directly rather than recovered), and the press on hand-made inputs whose answer is known.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "press/expected_attention.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
#include "test_press_util.h"

namespace protokv {
namespace {

using testing::SyntheticLayer;
using Matrix = std::vector<double>;  // row-major d x d

// RoPE's rotation at `position` as a dense matrix, built pair by pair from the table.
Matrix rotation_matrix(const kernels::RopeTable& rope, double position) {
  const int d = rope.head_dim;
  Matrix r(static_cast<size_t>(d * d), 0.0);
  for (int c = 0; c < d; ++c) r[static_cast<size_t>(c * d + c)] = 1.0;
  for (int i = 0; i < rope.rot_dims / 2; ++i) {
    const int a = rope.neox ? i : 2 * i;
    const int b = rope.neox ? i + rope.rot_dims / 2 : 2 * i + 1;
    const double angle = position * rope.inv_freq[static_cast<size_t>(i)];
    r[static_cast<size_t>(a * d + a)] = std::cos(angle);
    r[static_cast<size_t>(a * d + b)] = -std::sin(angle);
    r[static_cast<size_t>(b * d + a)] = std::sin(angle);
    r[static_cast<size_t>(b * d + b)] = std::cos(angle);
  }
  return r;
}

std::vector<double> times(const Matrix& m, const std::vector<double>& x) {
  const auto d = x.size();
  std::vector<double> y(d, 0.0);
  for (size_t r = 0; r < d; ++r)
    for (size_t c = 0; c < d; ++c) y[r] += m[r * d + c] * x[c];
  return y;
}

Matrix times(const Matrix& a, const Matrix& b, int d, bool transpose_b) {
  Matrix y(static_cast<size_t>(d * d), 0.0);
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < d; ++c)
      for (int k = 0; k < d; ++k)
        y[static_cast<size_t>(r * d + c)] +=
            a[static_cast<size_t>(r * d + k)] *
            (transpose_b ? b[static_cast<size_t>(c * d + k)] : b[static_cast<size_t>(k * d + c)]);
  return y;
}

// A layer whose queries are pre_rope[qh][t] turned by RoPE at position t (keys and values
// random: the scorer reads keys as they are cached, post-RoPE).
struct RotatedLayer {
  SyntheticLayer layer;
  std::vector<double> pre_rope;  // [n_heads, n, d]
};

RotatedLayer rotated_layer(int64_t n, int heads, int kv_heads, int d, bool neox, uint64_t seed) {
  RotatedLayer out{SyntheticLayer(n, heads, kv_heads, d), {}};
  SyntheticLayer& layer = out.layer;
  layer.fill_random(seed);
  layer.rope = kernels::make_rope_table(d, 10000.0f, neox);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  out.pre_rope.resize(static_cast<size_t>(heads * n * d));
  for (int qh = 0; qh < heads; ++qh) {
    // A per-head mean plus anisotropic noise, so that both mean and covariance matter.
    std::vector<double> mean(static_cast<size_t>(d));
    for (double& x : mean) x = 1.5 * normal(rng);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> q(static_cast<size_t>(d));
      for (int c = 0; c < d; ++c)
        q[static_cast<size_t>(c)] = mean[static_cast<size_t>(c)] + (1.0 + c % 3) * normal(rng);
      std::copy(q.begin(), q.end(), out.pre_rope.begin() + (qh * n + t) * d);
      const std::vector<double> post =
          times(rotation_matrix(layer.rope, static_cast<double>(t)), q);
      for (int c = 0; c < d; ++c)
        layer.query(qh, t)[c] = static_cast<float>(post[static_cast<size_t>(c)]);
    }
  }
  return out;
}

// kvpress ExpectedAttentionPress.score, in double, scores of every entry of KV head h.
std::vector<double> reference_scores(const RotatedLayer& in, int h, int64_t sinks, int64_t future,
                                     bool covariance, bool vnorm, double epsilon) {
  const SyntheticLayer& layer = in.layer;
  const int d = layer.d;
  const int64_t n = layer.n, m = n - sinks;
  const int group = layer.n_heads / layer.n_kv_heads;
  Matrix r_mean(static_cast<size_t>(d * d), 0.0);
  for (int64_t f = 0; f < future; ++f) {
    const Matrix r = rotation_matrix(layer.rope, static_cast<double>(n + f));
    for (size_t i = 0; i < r.size(); ++i) r_mean[i] += r[i] / static_cast<double>(future);
  }
  std::vector<double> mean_probs(static_cast<size_t>(m), 0.0);
  for (int g = 0; g < group; ++g) {
    const int qh = h * group + g;
    std::vector<double> mu(static_cast<size_t>(d), 0.0);
    for (int64_t t = sinks; t < n; ++t)
      for (int c = 0; c < d; ++c)
        mu[static_cast<size_t>(c)] += in.pre_rope[static_cast<size_t>((qh * n + t) * d + c)] / m;
    Matrix cov(static_cast<size_t>(d * d), 0.0);
    for (int64_t t = sinks; t < n; ++t)
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b)
          cov[static_cast<size_t>(a * d + b)] +=
              (in.pre_rope[static_cast<size_t>((qh * n + t) * d + a)] -
               mu[static_cast<size_t>(a)]) *
              (in.pre_rope[static_cast<size_t>((qh * n + t) * d + b)] -
               mu[static_cast<size_t>(b)]) /
              m;
    mu = times(r_mean, mu);
    cov = times(times(r_mean, cov, d, false), r_mean, d, true);
    std::vector<double> logits(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) {
      const float* k = layer.k.data() + (h * n + sinks + j) * d;
      double dot = 0.0, quad = 0.0;
      for (int a = 0; a < d; ++a) {
        dot += mu[static_cast<size_t>(a)] * k[a];
        for (int b = 0; b < d; ++b) quad += k[a] * cov[static_cast<size_t>(a * d + b)] * k[b];
      }
      logits[static_cast<size_t>(j)] = dot / std::sqrt(d) + (covariance ? quad / d / 2 : 0.0);
    }
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (double& x : logits) sum += (x = std::exp(x - top));
    for (int64_t j = 0; j < m; ++j)
      mean_probs[static_cast<size_t>(j)] += logits[static_cast<size_t>(j)] / sum / group;
  }
  std::vector<double> scores(static_cast<size_t>(n));
  for (int64_t j = 0; j < m; ++j) {
    double v_norm = 0.0;
    for (int c = 0; c < d; ++c)
      v_norm += std::pow(layer.v[static_cast<size_t>((h * n + sinks + j) * d + c)], 2);
    scores[static_cast<size_t>(sinks + j)] =
        vnorm ? (mean_probs[static_cast<size_t>(j)] + epsilon) * std::sqrt(v_norm)
              : mean_probs[static_cast<size_t>(j)];
  }
  return scores;
}

void expect_scores_match_reference(bool neox, int64_t sinks, int64_t future, bool covariance,
                                   bool vnorm, double epsilon) {
  const RotatedLayer in = rotated_layer(/*n=*/40, /*heads=*/4, /*kv_heads=*/2, /*d=*/8, neox, 5);
  press::ExpectedAttentionOptions options;
  options.sinks = sinks;
  options.future = future;
  options.covariance = covariance;
  options.vnorm = vnorm;
  options.epsilon = epsilon;
  press::ExpectedAttentionScorer scorer(options);
  press::LayerScores scores;
  scorer.score(in.layer.view(), /*window=*/0, scores);
  double layer_max = 0.0;
  for (int h = 0; h < 2; ++h) {
    const std::vector<double> want =
        reference_scores(in, h, sinks, future, covariance, vnorm, epsilon);
    for (int64_t j = sinks; j < in.layer.n; ++j) {
      EXPECT_NEAR(scores.head_score(h)[j], want[static_cast<size_t>(j)],
                  1e-4 * want[static_cast<size_t>(j)] + 1e-7)
          << "head " << h << " entry " << j;
      layer_max = std::max(layer_max, want[static_cast<size_t>(j)]);
    }
  }
  // The sinks are padded with the layer's maximum + 1 (kvpress), in every head.
  for (int h = 0; h < 2; ++h)
    for (int64_t j = 0; j < sinks; ++j) EXPECT_NEAR(scores.head_score(h)[j], layer_max + 1.0, 1e-4);
}

TEST(ExpectedAttention, ScoresMatchANaiveReferenceOfKvpressFormula) {
  expect_scores_match_reference(/*neox=*/false, /*sinks=*/4, /*future=*/512, true, true, 0.0);
}

TEST(ExpectedAttention, ScoresMatchTheReferenceWithNeoxPairsAndEveryOption) {
  expect_scores_match_reference(/*neox=*/true, 4, 512, true, true, 0.0);
  expect_scores_match_reference(true, /*sinks=*/0, /*future=*/7, true, true, 0.0);
  expect_scores_match_reference(false, 2, 64, /*covariance=*/false, true, 0.0);
  expect_scores_match_reference(false, 4, 512, true, /*vnorm=*/false, 0.0);
  expect_scores_match_reference(false, 4, 512, true, true, /*epsilon=*/0.02);
}

// Keys that are all zero give every entry the same expected attention, so the value norms decide;
// the sinks are kept whatever their values.
TEST(ExpectedAttention, EqualAttentionLeavesTheLargestValueNormsAndTheSinks) {
  SyntheticLayer layer(10, 2, 1, 4);
  layer.fill_random(3);
  std::fill(layer.k.begin(), layer.k.end(), 0.0f);
  const std::vector<float> norms = {9, 9, 0.1f, 5, 0.2f, 7, 0.3f, 6, 0.4f, 0.5f};
  for (int64_t t = 0; t < 10; ++t) {
    float* v = layer.v.data() + t * 4;
    std::fill(v, v + 4, 0.0f);
    v[t % 4] = norms[static_cast<size_t>(t)];
  }
  auto press = make_press("expected_attention:sinks=2");
  EXPECT_EQ(press->config()["window"], 0);  // kvpress keeps no window
  press->begin(layer.info(), testing::entries(5));
  LayerCache cache = layer.empty_cache();
  press->compress_prefill(layer.view(), cache);
  // Sinks 0, 1, then the three largest value norms after them: 5 (7), 7 (6), 3 (5).
  EXPECT_EQ(testing::kept_positions(cache.heads[0]), (std::vector<int32_t>{0, 1, 3, 5, 7}));
  testing::expect_valid_head(layer, cache.heads[0], 0, 0, 2);
}

// Queries with zero mean and a large variance along one RoPE pair: the covariance term favours
// the keys that lie in that pair, which the mean alone cannot see. The pair is the slow one
// (coordinates 2, 3: 500000^-1/2 rad per position): averaged over 512 future positions, the fast
// pair's rotation (1 rad per position) nearly cancels, and so would its statistics.
TEST(ExpectedAttention, TheCovarianceTermKeepsKeysAlongTheQueriesSpread) {
  const int64_t n = 13;
  SyntheticLayer layer(n, 1, 1, 4);
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Pre-RoPE q = (0, 0, x, y), x, y ~ N(0, 3^2), after the sink in opposite pairs (t, t + 1) so
  // that the mean is exactly zero; then RoPE.
  for (int64_t t = 1; t < n; t += 2) {
    const float x = 3.0f * normal(rng), y = 3.0f * normal(rng);
    for (int64_t u = t; u < t + 2; ++u) {
      float* q = layer.query(0, u);
      q[2] = u == t ? x : -x;
      q[3] = u == t ? y : -y;
      kernels::rope(q, 1, 4, static_cast<int32_t>(u), layer.spec.rope_theta, false);
    }
  }
  // Keys of norm 1: along the slow pair at positions 0 (the sink), 3, 6, 9, 12, along the fast
  // pair elsewhere (where the queries never point).
  for (int64_t j = 0; j < n; ++j) layer.key(0, j)[j % 3 == 0 ? 2 + j % 2 : j % 2] = 1.0f;
  for (float& x : layer.v) x = 1.0f;
  auto keep = [&](const std::string& spec) {
    auto press = make_press(spec);
    press->begin(layer.info(), testing::entries(5));
    LayerCache cache = layer.empty_cache();
    press->compress_prefill(layer.view(), cache);
    return testing::kept_positions(cache.heads[0]);
  };
  EXPECT_EQ(keep("expected_attention:sinks=1"), (std::vector<int32_t>{0, 3, 6, 9, 12}));
  // Without the covariance every key scores alike up to rounding (zero mean): no preference.
  EXPECT_NE(keep("expected_attention:sinks=1,covariance=0"),
            (std::vector<int32_t>{0, 3, 6, 9, 12}));
}

TEST(ExpectedAttention, RefusesAViewWithoutRoPE) {
  SyntheticLayer layer(16, 2, 1, 4);
  layer.fill_random(1);
  LayerView view = layer.view();
  view.rope = {};
  auto press = make_press("expected_attention");
  press->begin(layer.info(), testing::entries(4));
  LayerCache cache = layer.empty_cache();
  EXPECT_THROW(press->compress_prefill(view, cache), Error);
}

}  // namespace
}  // namespace protokv
