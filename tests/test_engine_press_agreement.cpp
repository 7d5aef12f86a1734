// SPDX-License-Identifier: Apache-2.0
// Engine <-> press agreement against the independent reference forward pass: the entries a press
// keeps inside Session::prefill must be the entries it keeps when handed the reference's own
// post-RoPE Q/K/V, and decoding over the compressed cache must give the reference's logits with
// attention restricted to exactly those entries. This is what catches an engine that hands the
// press the wrong tensors (queries before RoPE, another layer's keys, a transposed layout).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "protokv/engine.h"
#include "protokv/press_registry.h"
#include "test_engine_model.h"
#include "test_press_util.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::make_random_model;
using testing::random_tokens;
using testing::RandomModelSpec;
using testing::reference_logits;
using testing::ReferenceTensors;
using testing::SyntheticLayer;

// Largest |a - b| / max(1, |b|).
float worst_relative_error(std::span<const float> actual, const std::vector<float>& expected) {
  float worst = 0.0f;
  for (size_t i = 0; i < expected.size(); ++i)
    worst = std::max(worst,
                     std::fabs(actual[i] - expected[i]) / std::max(1.0f, std::fabs(expected[i])));
  return worst;
}

// Layer `l` of the reference, rearranged into the press's head-major F32 view.
SyntheticLayer reference_layer(const ReferenceTensors& t, const ModelConfig& c, int l, int64_t n) {
  const int hd = c.head_dim();
  SyntheticLayer layer(n, c.n_heads, c.n_kv_heads, hd);
  layer.layer = l;
  layer.n_layers = c.n_layers;
  for (int64_t i = 0; i < n; ++i) {
    const auto& q = t.q[static_cast<size_t>(l)][static_cast<size_t>(i)];
    const auto& k = t.k[static_cast<size_t>(l)][static_cast<size_t>(i)];
    const auto& v = t.v[static_cast<size_t>(l)][static_cast<size_t>(i)];
    for (int h = 0; h < c.n_heads; ++h)
      for (int d = 0; d < hd; ++d)
        layer.q[static_cast<size_t>((h * n + i) * hd + d)] =
            static_cast<float>(q[static_cast<size_t>(h * hd + d)]);
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int d = 0; d < hd; ++d) {
        layer.k[static_cast<size_t>((h * n + i) * hd + d)] =
            static_cast<float>(k[static_cast<size_t>(h * hd + d)]);
        layer.v[static_cast<size_t>((h * n + i) * hd + d)] =
            static_cast<float>(v[static_cast<size_t>(h * hd + d)]);
      }
  }
  return layer;
}

using KeptPositions = std::vector<std::vector<std::vector<int32_t>>>;  // [layer][kv head]

KeptPositions cache_positions(const KvCache& cache) {
  KeptPositions out(static_cast<size_t>(cache.n_layers()));
  for (int l = 0; l < cache.n_layers(); ++l)
    for (const HeadCache& head : cache.layer(l).heads)
      out[static_cast<size_t>(l)].emplace_back(head.positions().begin(), head.positions().end());
  return out;
}

struct AgreementCase {
  const char* press;
  int budget;
};

void PrintTo(const AgreementCase& c, std::ostream* os) {
  *os << c.press << " budget " << c.budget;
}

class EnginePressAgreement : public ::testing::TestWithParam<AgreementCase> {};

TEST_P(EnginePressAgreement, KeptEntriesAndDecodeLogitsMatchTheReference) {
  const AgreementCase& param = GetParam();
  RandomModelSpec spec;
  spec.n_layers = 3;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;  // GQA: two query heads per KV head
  spec.seed = 2024;
  const auto model = make_random_model(spec);
  const ModelConfig& c = model.weights.config;
  constexpr int kPrompt = 48, kDecode = 4;
  const auto tokens = random_tokens(kPrompt + kDecode, spec.vocab_size, 17);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + kPrompt);

  SessionOptions options;
  options.press = PressSpec::parse(param.press);
  options.budget.entries = param.budget;
  Session session(model.weights, options);
  const auto prefill_logits = session.prefill(prompt);

  // The same press, fresh, applied to the reference tensors layer by layer.
  ReferenceTensors tensors;
  const auto full_logits = reference_logits(model.weights, prompt, -1, {}, &tensors);
  // Prefill attention sees the whole prompt whatever the press keeps.
  EXPECT_LE(worst_relative_error(prefill_logits, full_logits), 1e-4f);
  const auto oracle = make_press(param.press);
  SequenceInfo info;
  info.n_layers = c.n_layers;
  info.n_heads = c.n_heads;
  info.n_kv_heads = c.n_kv_heads;
  info.head_dim = c.head_dim();
  info.n_tokens = kPrompt;
  oracle->begin(info, options.budget);
  const KeptPositions engine_kept = cache_positions(session.cache());
  int64_t kept_total = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const SyntheticLayer layer = reference_layer(tensors, c, l, kPrompt);
    LayerCache expected = layer.empty_cache();
    oracle->compress_prefill(layer.view(), expected);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const auto& want = expected.heads[static_cast<size_t>(h)].positions();
      EXPECT_EQ(engine_kept[static_cast<size_t>(l)][static_cast<size_t>(h)],
                std::vector<int32_t>(want.begin(), want.end()))
          << param.press << ": layer " << l << ", KV head " << h;
      kept_total += static_cast<int64_t>(want.size());
    }
  }
  EXPECT_LT(kept_total, int64_t{kPrompt} * c.n_layers * c.n_kv_heads);  // it did compress

  // Decode: step s sees what the cache held before it (a press may evict during decode), plus the
  // new token.
  std::vector<KeptPositions> seen_by_step;
  for (int s = 0; s < kDecode; ++s) {
    seen_by_step.push_back(cache_positions(session.cache()));
    const auto logits = session.decode(tokens[static_cast<size_t>(kPrompt + s)]);
    testing::CacheVisibility visibility;
    visibility.kept_by_query = [&](int query, int layer, int kv_head, int position) {
      const auto& seen = seen_by_step[static_cast<size_t>(query - kPrompt)]
                                     [static_cast<size_t>(layer)][static_cast<size_t>(kv_head)];
      return std::find(seen.begin(), seen.end(), position) != seen.end();
    };
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + kPrompt + s + 1);
    EXPECT_LE(
        worst_relative_error(logits, reference_logits(model.weights, prefix, kPrompt, visibility)),
        1e-4f)
        << param.press << ": decode step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Presses, EnginePressAgreement,
                         ::testing::Values(AgreementCase{"snapkv", 16},
                                           AgreementCase{"protokv", 16},
                                           AgreementCase{"h2o:decode=1", 16},
                                           AgreementCase{"adakv", 16},
                                           AgreementCase{"pyramidkv", 20}),
                         [](const auto& info) {
                           std::string name = info.param.press;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace protokv
