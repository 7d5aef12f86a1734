// SPDX-License-Identifier: Apache-2.0
// `eval fidelity` metrics recomputed independently: two plain Sessions (full cache and press) run
// the same teacher-forced tokens, and this file computes KL(full ‖ press), top-1 agreement,
// perplexity, top-B recall (with an explicit query-head -> KV-head table under GQA) and the
// per-layer attention-output error with its own code, then compares with run_fidelity. A swapped
// KL argument, a wrong GQA head map or a misaligned step shows here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "eval/fidelity.h"
#include "eval/metrics.h"
#include "protokv/engine.h"
#include "protokv/press_spec.h"
#include "test_engine_model.h"

namespace protokv {
namespace {

using testing::make_random_model;
using testing::RandomModelSpec;

// softmax in double.
std::vector<double> probabilities(std::span<const float> logits) {
  double max_logit = -INFINITY;
  for (float z : logits) max_logit = std::max(max_logit, static_cast<double>(z));
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i)
    total += p[i] = std::exp(static_cast<double>(logits[i]) - max_logit);
  for (double& x : p) x /= total;
  return p;
}

// KL(p ‖ q) = sum_i p_i log(p_i / q_i): the expectation is under the first argument.
double kl(const std::vector<double>& p, const std::vector<double>& q) {
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0.0) sum += p[i] * (std::log(p[i]) - std::log(q[i]));
  return sum;
}

size_t first_argmax(std::span<const float> v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Everything one run leaves: logits of every step, attention outputs and weights of every decode.
struct Recorder final : DecodeObserver {
  int step = 0;
  std::vector<std::vector<float>> attn_out;  // [step * n_layers + layer][n_heads * head_dim]
  // [step][layer][q_head] -> (weights, positions) in cache order.
  std::vector<std::vector<std::vector<std::pair<std::vector<float>, std::vector<int32_t>>>>> probs;
  int n_layers = 0, n_heads = 0;

  bool wants_probabilities() const override { return true; }
  void on_decode(const DecodeStep& decode) override {
    const int layer = decode.layer;
    if (attn_out.size() <= static_cast<size_t>(step * n_layers + layer))
      attn_out.resize(static_cast<size_t>((step + 1) * n_layers));
    attn_out[static_cast<size_t>(step * n_layers + layer)].assign(
        decode.attention_output, decode.attention_output + decode.n_heads * decode.head_dim);
    if (probs.size() <= static_cast<size_t>(step))
      probs.resize(static_cast<size_t>(step + 1),
                   std::vector<std::vector<std::pair<std::vector<float>, std::vector<int32_t>>>>(
                       static_cast<size_t>(n_layers),
                       std::vector<std::pair<std::vector<float>, std::vector<int32_t>>>(
                           static_cast<size_t>(n_heads))));
    std::vector<int32_t> scratch;
    for (int q_head = 0; q_head < decode.n_heads; ++q_head) {
      const auto p = decode.probs(q_head);
      const auto positions = decode.attended_positions(q_head, scratch);
      probs[static_cast<size_t>(step)][static_cast<size_t>(layer)][static_cast<size_t>(q_head)] = {
          {p.begin(), p.end()}, {positions.begin(), positions.end()}};
    }
  }
};

struct RecordedRun {
  std::vector<std::vector<float>> logits;  // [step]: step t predicts continuation[t]
  Recorder recorder;
  std::vector<std::vector<std::vector<int32_t>>> kept;  // [layer][kv head] after prefill
};

RecordedRun record_run(const ModelWeights& weights, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& continuation,
                       std::shared_ptr<const PressSpec> press, int64_t budget) {
  SessionOptions options;
  options.press = std::move(press);
  options.budget.entries = budget;
  Session session(weights, options);
  RecordedRun r;
  r.recorder.n_layers = weights.config.n_layers;
  r.recorder.n_heads = weights.config.n_heads;
  session.set_observer(&r.recorder);
  auto logits = session.prefill(prompt);
  for (int l = 0; l < weights.config.n_layers; ++l) {
    r.kept.emplace_back();
    for (const HeadCache& head : session.cache().layer(l).heads)
      r.kept.back().emplace_back(head.positions().begin(), head.positions().end());
  }
  for (size_t t = 0; t < continuation.size(); ++t) {
    r.logits.emplace_back(logits.begin(), logits.end());
    r.recorder.step = static_cast<int>(t);
    logits = session.decode(continuation[t]);  // also the last: its attention is measured
  }
  return r;
}

TEST(FidelityOracle, MetricsMatchAnIndependentRecomputation) {
  RandomModelSpec spec;
  spec.n_layers = 3;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;  // GQA, group 2: query heads 0, 1 read KV head 0; 2, 3 read KV head 1
  spec.seed = 77;
  const auto model = make_random_model(spec);
  const ModelConfig& c = model.weights.config;
  // The map written out, not computed: qh % n_kv_heads would give 0, 1, 0, 1.
  const int kv_head_of_query_head[4] = {0, 0, 1, 1};

  constexpr int kPrompt = 40, kSteps = 6;
  constexpr int64_t kBudget = 12;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int32_t> token(0, spec.vocab_size - 1);
  eval::FidelitySample sample;
  for (int i = 0; i < kPrompt; ++i) sample.prompt.push_back(token(rng));
  for (int i = 0; i < kSteps; ++i) sample.continuation.push_back(token(rng));

  eval::FidelityOptions options;
  options.presses = {"snapkv"};
  options.budgets = {kBudget};
  options.continuation = kSteps;
  options.attention_metrics = true;
  options.progress = false;
  const eval::FidelityReport report = eval::run_fidelity(model.weights, {sample}, options);
  ASSERT_EQ(report.rows.size(), 1u);
  const eval::FidelityRow& row = report.rows[0];
  ASSERT_TRUE(row.error.empty()) << row.error;

  const RecordedRun full =
      record_run(model.weights, sample.prompt, sample.continuation, nullptr, 0);
  const RecordedRun comp = record_run(model.weights, sample.prompt, sample.continuation,
                                      PressSpec::parse("snapkv"), kBudget);

  // Next-token metrics over the kSteps teacher-forced steps.
  double kl_sum = 0.0, kl_max = 0.0, reverse_kl_sum = 0.0, nll = 0.0;
  int agree = 0;
  for (int t = 0; t < kSteps; ++t) {
    const auto p_full = probabilities(full.logits[static_cast<size_t>(t)]);
    const auto p_press = probabilities(comp.logits[static_cast<size_t>(t)]);
    const double step_kl = kl(p_full, p_press);
    kl_sum += step_kl;
    kl_max = std::max(kl_max, step_kl);
    reverse_kl_sum += kl(p_press, p_full);
    agree += first_argmax(full.logits[static_cast<size_t>(t)]) ==
             first_argmax(comp.logits[static_cast<size_t>(t)]);
    nll -= std::log(p_press[static_cast<size_t>(sample.continuation[static_cast<size_t>(t)])]);
  }
  const double kl_mean = kl_sum / kSteps, reverse_kl_mean = reverse_kl_sum / kSteps;
  ASSERT_GT(kl_mean, 1e-4) << "the press must change the logits for the test to mean anything";
  // The direction is pinned only if the two directions differ by more than the tolerance.
  ASSERT_GT(std::fabs(kl_mean - reverse_kl_mean), 1e-3 * kl_mean);
  EXPECT_NEAR(row.kl_mean.mean(), kl_mean, 1e-6 * kl_mean);
  EXPECT_NEAR(row.kl_max, kl_max, 1e-6 * kl_max);
  EXPECT_DOUBLE_EQ(row.top1.mean(), static_cast<double>(agree) / kSteps);
  EXPECT_NEAR(row.ppl.mean(), std::exp(nll / kSteps), 1e-6 * std::exp(nll / kSteps));

  // Top-B recall: for each decode query, layer and query head, the B prompt positions the full
  // run attended most (ties to the lower position); the share of them kept in the KV head that
  // query head reads.
  double recall_sum = 0.0;
  int recall_count = 0;
  for (int t = 0; t < kSteps; ++t)
    for (int l = 0; l < c.n_layers; ++l)
      for (int qh = 0; qh < c.n_heads; ++qh) {
        // Named references, not a structured binding: clang 14 cannot capture bindings.
        const auto& probs =
            full.recorder
                .probs[static_cast<size_t>(t)][static_cast<size_t>(l)][static_cast<size_t>(qh)];
        const auto& weights = probs.first;
        const auto& positions = probs.second;
        std::vector<size_t> order;
        for (size_t e = 0; e < positions.size(); ++e)
          if (positions[e] < kPrompt) order.push_back(e);
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          return weights[a] != weights[b] ? weights[a] > weights[b] : positions[a] < positions[b];
        });
        order.resize(static_cast<size_t>(kBudget));
        const auto& kept =
            comp.kept[static_cast<size_t>(l)][static_cast<size_t>(kv_head_of_query_head[qh])];
        int hits = 0;
        for (size_t e : order)
          hits += std::find(kept.begin(), kept.end(), positions[e]) != kept.end();
        recall_sum += static_cast<double>(hits) / kBudget;
        ++recall_count;
      }
  const double recall = recall_sum / recall_count;
  EXPECT_NEAR(row.recall.mean(), recall, 1e-12);
  EXPECT_LT(recall, 1.0);  // something the full run attended to was evicted

  // Attention-output error per layer: ||o - o~|| / ||o|| per query head, mean over heads, then
  // over the kSteps decode queries.
  const int hd = c.head_dim();
  ASSERT_EQ(row.attn_err_layer.size(), static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    double layer_sum = 0.0;
    for (int t = 0; t < kSteps; ++t) {
      const auto& o = full.recorder.attn_out[static_cast<size_t>(t * c.n_layers + l)];
      const auto& approx = comp.recorder.attn_out[static_cast<size_t>(t * c.n_layers + l)];
      double head_sum = 0.0;
      for (int h = 0; h < c.n_heads; ++h) {
        double diff = 0.0, norm = 0.0;
        for (int d = 0; d < hd; ++d) {
          const double a = o[static_cast<size_t>(h * hd + d)];
          const double b = approx[static_cast<size_t>(h * hd + d)];
          diff += (a - b) * (a - b);
          norm += a * a;
        }
        head_sum += std::sqrt(diff / norm);
      }
      layer_sum += head_sum / c.n_heads;
    }
    const double expected = layer_sum / kSteps;
    EXPECT_NEAR(row.attn_err_layer[static_cast<size_t>(l)].mean(), expected, 1e-6 * expected + 1e-9)
        << "layer " << l;
  }
}

TEST(FidelityOracle, KlDivergenceTakesTheExpectationUnderItsFirstArgument) {
  // p = (1/2, 1/2), q = (9/10, 1/10):
  //   KL(p ‖ q) = 1/2 ln(5/9) + 1/2 ln 5 = 0.5108256...
  //   KL(q ‖ p) = 9/10 ln(9/5) + 1/10 ln(1/5) = 0.3680642...
  const std::vector<float> p = {0.0f, 0.0f};
  const std::vector<float> q = {std::log(9.0f), 0.0f};
  const double kl_pq = 0.5 * std::log(5.0 / 9.0) + 0.5 * std::log(5.0);
  const double kl_qp = 0.9 * std::log(1.8) + 0.1 * std::log(0.2);
  EXPECT_NEAR(kl_pq, 0.5108256, 1e-6);
  EXPECT_NEAR(kl_qp, 0.3680642, 1e-6);
  EXPECT_NEAR(eval::kl_divergence(p, q), kl_pq, 1e-6);
  EXPECT_NEAR(eval::kl_divergence(q, p), kl_qp, 1e-6);
}

}  // namespace
}  // namespace protokv
