// SPDX-License-Identifier: Apache-2.0
// The SYNTHETIC model, workload and benchmark tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "eval/synthetic.h"
#include "protokv/error.h"

namespace protokv::eval {
namespace {

TEST(SyntheticModel, HasTheRequestedShapesInOwnedBuffers) {
  const SyntheticModelSpec spec = SyntheticModelSpec::tiny();
  const ModelWeights w = make_synthetic_model(spec);
  EXPECT_NO_THROW(w.config.validate());
  EXPECT_EQ(w.config.dim, spec.dim);
  EXPECT_EQ(w.config.n_kv_heads, spec.n_kv_heads);
  ASSERT_EQ(w.layers.size(), static_cast<size_t>(spec.n_layers));
  const int64_t hd = w.config.head_dim();
  EXPECT_EQ(w.layers[0].wq.rows, spec.n_heads * hd);
  EXPECT_EQ(w.layers[0].wk.rows, spec.n_kv_heads * hd);
  EXPECT_EQ(w.layers[0].w_down.cols, spec.hidden_dim);
  EXPECT_EQ(w.output.rows, spec.vocab_size);
  EXPECT_FALSE(w.storage.empty());
  EXPECT_EQ(w.weight_bytes(), static_cast<size_t>(w.parameter_count()) * 4);
}

TEST(SyntheticModel, IsReproducibleFromItsSeed) {
  SyntheticModelSpec spec = SyntheticModelSpec::tiny();
  const ModelWeights a = make_synthetic_model(spec);
  const ModelWeights b = make_synthetic_model(spec);
  spec.seed += 1;
  const ModelWeights c = make_synthetic_model(spec);
  const auto* wa = static_cast<const float*>(a.layers[1].wq.data);
  const auto* wb = static_cast<const float*>(b.layers[1].wq.data);
  const auto* wc = static_cast<const float*>(c.layers[1].wq.data);
  const int64_t n = a.layers[1].wq.rows * a.layers[1].wq.cols;
  EXPECT_TRUE(std::equal(wa, wa + n, wb));
  EXPECT_FALSE(std::equal(wa, wa + n, wc));
}

TEST(SyntheticModel, QueriesShareMostOfTheirKeyProjection) {
  // Cosine between a query head's W_q and its KV head's W_k is about √(1 − ε²): this is what
  // makes a query attend to earlier occurrences of its own token.
  const SyntheticModelSpec spec = SyntheticModelSpec::tiny();
  const ModelWeights w = make_synthetic_model(spec);
  const int64_t size = w.config.head_dim() * w.config.dim;
  const auto* wq = static_cast<const float*>(w.layers[0].wq.data);
  const auto* wk = static_cast<const float*>(w.layers[0].wk.data);
  const auto cosine = [&](const float* a, const float* b) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < size; ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / std::sqrt(aa * bb);
  };
  const double expected = std::sqrt(1.0 - spec.qk_noise * spec.qk_noise);
  EXPECT_NEAR(cosine(wq, wk), expected, 0.05);       // head 0 ↔ KV head 0
  EXPECT_NEAR(cosine(wq + 2 * size, wk), 0.0, 0.1);  // head 2 belongs to KV head 1
  EXPECT_NEAR(cosine(wq + 2 * size, wk + size), expected, 0.05);
}

TEST(SyntheticPrompt, PlantsPairsAndEndsByRecallingAKey) {
  using V = SyntheticTokens;
  const int vocab = 512;
  const auto tokens = make_synthetic_prompt(1024, vocab, 3);
  ASSERT_EQ(tokens.size(), 1024u);
  EXPECT_EQ(tokens[0], V::kBos);
  for (int32_t t : tokens) {
    EXPECT_GE(t, 1);
    EXPECT_LT(t, vocab);
  }
  const auto is_key = [](int32_t t) { return t >= V::kFirstKey && t < V::kFirstKey + V::kNumKeys; };
  const int32_t last = tokens.back();
  ASSERT_TRUE(is_key(last));
  // The recalled key was planted earlier, followed by a value token.
  bool planted = false;
  for (size_t i = 1; i + 1 < tokens.size() - 8; ++i) {
    if (tokens[i] == last && tokens[i + 1] >= V::kFirstValue &&
        tokens[i + 1] < V::kFirstValue + V::kNumValues) {
      planted = true;
    }
  }
  EXPECT_TRUE(planted);
  EXPECT_EQ(tokens, make_synthetic_prompt(1024, vocab, 3));
  EXPECT_NE(tokens, make_synthetic_prompt(1024, vocab, 4));
  EXPECT_THROW(make_synthetic_prompt(8, vocab, 1), Error);
  EXPECT_THROW(make_synthetic_prompt(64, 100, 1), Error);
}

TEST(SyntheticPrompt, ShortPromptsStillWork) {
  for (int64_t n : {16, 17, 64, 65, 192}) {
    const auto tokens = make_synthetic_prompt(n, 160, 1);
    EXPECT_EQ(static_cast<int64_t>(tokens.size()), n);
    EXPECT_EQ(tokens[0], SyntheticTokens::kBos);
  }
}

TEST(SyntheticLayer, HasShapesSinkOutliersAndIsReproducible) {
  SyntheticLayerSpec spec;
  spec.n_tokens = 256;
  spec.n_kv_heads = 2;
  spec.group_size = 2;
  spec.head_dim = 32;
  const SyntheticLayer layer = make_synthetic_layer(spec);
  const LayerView view = layer.view(1, 3);
  EXPECT_EQ(view.layer, 1);
  EXPECT_EQ(view.n_layers, 3);
  EXPECT_EQ(view.n_heads, 4);
  EXPECT_EQ(view.group_size(), 2);
  EXPECT_EQ(layer.q.size(), 4u * 256 * 32);
  EXPECT_EQ(layer.k.size(), 2u * 256 * 32);
  EXPECT_EQ(layer.positions[255], 255);
  // RoPE keeps norms: the sink (token 0) is far larger than a typical key.
  const auto norm = [&](const float* x) {
    double s = 0;
    for (int c = 0; c < 32; ++c) s += x[c] * x[c];
    return std::sqrt(s);
  };
  const double sink = norm(view.k_head(0));
  const double typical = norm(view.k_head(0) + 100 * 32);
  EXPECT_GT(sink, 1.5 * typical);  // ≈ 6·√d against ≈ 13
  EXPECT_GT(typical, 8.0);         // the outlier channels alone give √(8² + 6²) = 10
  const SyntheticLayer again = make_synthetic_layer(spec);
  EXPECT_EQ(layer.k, again.k);
  EXPECT_EQ(layer.q, again.q);
  spec.n_tokens = 8;
  EXPECT_THROW(make_synthetic_layer(spec), Error);
}

}  // namespace
}  // namespace protokv::eval
