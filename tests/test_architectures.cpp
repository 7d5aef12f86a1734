// SPDX-License-Identifier: Apache-2.0
// Architectures beyond plain Llama 2 (issue 9 item 1): Llama 3.x rope_freqs factors, linear RoPE
// scaling, partial rotary dimensions, tied output, Qwen2 (biases, NeoX), Qwen3 (per-head q/k
// RMSNorm, explicit head width). Each feature is checked against the naive double-precision
// forward below, which shares no code with the engine (no kernels, no RoPE table), and prefill
// against token-by-token decode; GGUF round trips keep every tensor; bad files give one line.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "model/gguf_names.h"
#include "model/loaders.h"
#include "model/random_model.h"
#include "model/tensor_table.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/gguf.h"
#include "protokv/press_spec.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::TempDir;

// --- naive reference ----------------------------------------------------------------------------

using Vec = std::vector<double>;

double at(const WeightMatrix& m, int64_t r, int64_t c) {
  EXPECT_EQ(m.type, DType::F32);
  return static_cast<const float*>(m.data)[r * m.cols + c];
}

Vec matvec(const WeightMatrix& m, const Vec& x) {
  Vec y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) y[static_cast<size_t>(r)] += at(m, r, c) * x[c];
  return y;
}

// RMSNorm of x[offset, offset + n) in place, weights w[n].
void rmsnorm(Vec& x, size_t offset, size_t n, const float* w, double eps) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += x[offset + i] * x[offset + i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) x[offset + i] = x[offset + i] * scale * w[i];
}

// RoPE as the GGUF/HF definitions state it: pair i of the first n_rot dims turns by
// pos / linear_factor * theta^(-2i/n_rot) / freq_factor[i]; Meta pairs (2i, 2i+1), NeoX pairs
// (i, i + n_rot/2); dims past n_rot untouched.
void rope(Vec& x, int n_heads, int head_dim, int pos, const ModelConfig& c,
          const float* freq_factors, bool local = false) {
  const int n_rot = c.n_rot > 0 ? c.n_rot : head_dim;
  for (int h = 0; h < n_heads; ++h) {
    double* v = x.data() + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < n_rot / 2; ++i) {
      // Gemma 3's local layers: their own base and no scaling.
      const double theta = local ? c.rope_theta_local : c.rope_theta;
      double freq = std::pow(theta, -2.0 * i / n_rot);
      if (!local) freq /= c.rope_linear_factor;
      if (freq_factors != nullptr) freq /= freq_factors[i];
      const double a = pos * freq;
      const int j0 = c.rope_neox ? i : 2 * i;
      const int j1 = c.rope_neox ? i + n_rot / 2 : 2 * i + 1;
      const double x0 = v[j0], x1 = v[j1];
      v[j0] = x0 * std::cos(a) - x1 * std::sin(a);
      v[j1] = x0 * std::sin(a) + x1 * std::cos(a);
    }
  }
}

// GELU, tanh approximation, as ggml's table holds it (GGML_GELU_FP16): the input rounded to F16,
// the formula in float, the result rounded to F16. Computing it in double instead moves ~1% of
// the results across an F16 rounding boundary (one F16 ulp, 5e-4 relative), more than the
// engine's float error.
double gelu_f16(double x) {
  if (x <= -10.0) return 0.0;
  if (x >= 10.0) return x;
  const float h = f16_to_f32(f32_to_f16(static_cast<float>(x)));
  const float g =
      0.5f * h *
      (1.0f + std::tanh(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)));
  return f16_to_f32(f32_to_f16(g));
}

// Logits of every position (full causal attention, recomputed from scratch; a local layer's query
// at t sees keys u with t - u < sliding_window).
std::vector<Vec> naive_logits(const ModelWeights& w, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = w.config;
  const int hd =
      c.n_heads > 0 ? (c.explicit_head_dim > 0 ? c.explicit_head_dim : c.dim / c.n_heads) : 0;
  const size_t n = tokens.size(), dim = static_cast<size_t>(c.dim);
  std::vector<Vec> x(n, Vec(dim));
  for (size_t t = 0; t < n; ++t)
    for (size_t i = 0; i < dim; ++i)
      x[t][i] = at(w.token_embd, tokens[t], static_cast<int64_t>(i)) * c.embedding_scale;
  for (size_t layer = 0; layer < w.layers.size(); ++layer) {
    const LayerWeights& L = w.layers[layer];
    const bool local = c.is_local_layer(static_cast<int>(layer));
    std::vector<Vec> q(n), k(n), v(n);
    for (size_t t = 0; t < n; ++t) {
      Vec h = x[t];
      rmsnorm(h, 0, dim, L.attn_norm, c.norm_eps);
      q[t] = matvec(L.wq, h);
      k[t] = matvec(L.wk, h);
      v[t] = matvec(L.wv, h);
      for (size_t i = 0; L.bq && i < q[t].size(); ++i) q[t][i] += L.bq[i];
      for (size_t i = 0; L.bk && i < k[t].size(); ++i) k[t][i] += L.bk[i];
      for (size_t i = 0; L.bv && i < v[t].size(); ++i) v[t][i] += L.bv[i];
      for (int h2 = 0; L.attn_q_norm && h2 < c.n_heads; ++h2)
        rmsnorm(q[t], static_cast<size_t>(h2 * hd), static_cast<size_t>(hd), L.attn_q_norm,
                c.norm_eps);
      for (int h2 = 0; L.attn_k_norm && h2 < c.n_kv_heads; ++h2)
        rmsnorm(k[t], static_cast<size_t>(h2 * hd), static_cast<size_t>(hd), L.attn_k_norm,
                c.norm_eps);
      rope(q[t], c.n_heads, hd, static_cast<int>(t), c, w.rope_freqs, local);
      rope(k[t], c.n_kv_heads, hd, static_cast<int>(t), c, w.rope_freqs, local);
    }
    const int group = c.n_heads / c.n_kv_heads;
    for (size_t t = 0; t < n; ++t) {
      Vec att(static_cast<size_t>(c.n_heads * hd), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const size_t qo = static_cast<size_t>(h * hd), ko = static_cast<size_t>(h / group * hd);
        Vec s(t + 1);
        double mx = -1e300;
        const double scale =
            c.attention_scale > 0.0f ? c.attention_scale : 1.0 / std::sqrt(static_cast<double>(hd));
        const size_t first = local && t + 1 > static_cast<size_t>(c.sliding_window)
                                 ? t + 1 - static_cast<size_t>(c.sliding_window)
                                 : 0;
        for (size_t u = first; u <= t; ++u) {
          double d = 0.0;
          for (int i = 0; i < hd; ++i) d += q[t][qo + i] * k[u][ko + i];
          s[u] = d * scale;
          mx = std::max(mx, s[u]);
        }
        double z = 0.0;
        for (size_t u = 0; u <= t; ++u) z += (s[u] = u < first ? 0.0 : std::exp(s[u] - mx));
        for (size_t u = 0; u <= t; ++u)
          for (int i = 0; i < hd; ++i) att[qo + i] += s[u] / z * v[u][ko + i];
      }
      Vec o = matvec(L.wo, att);
      if (L.attn_post_norm) rmsnorm(o, 0, dim, L.attn_post_norm, c.norm_eps);
      for (size_t i = 0; i < dim; ++i) x[t][i] += o[i];
      Vec h = x[t];
      rmsnorm(h, 0, dim, L.ffn_norm, c.norm_eps);
      Vec g = matvec(L.w_gate, h);
      const Vec u = matvec(L.w_up, h);
      const bool gelu = c.ffn_activation == FfnActivation::kGeluTanh;
      for (size_t i = 0; i < g.size(); ++i)
        g[i] = (gelu ? gelu_f16(g[i]) : g[i] / (1.0 + std::exp(-g[i]))) * u[i];
      Vec d = matvec(L.w_down, g);
      if (L.ffn_post_norm) rmsnorm(d, 0, dim, L.ffn_post_norm, c.norm_eps);
      for (size_t i = 0; i < dim; ++i) x[t][i] += d[i];
    }
  }
  std::vector<Vec> logits(n);
  for (size_t t = 0; t < n; ++t) {
    rmsnorm(x[t], 0, dim, w.output_norm, c.norm_eps);
    logits[t] = matvec(c.shared_classifier ? w.token_embd : w.output, x[t]);
    if (c.final_logit_softcap > 0.0f)
      for (double& l : logits[t]) l = c.final_logit_softcap * std::tanh(l / c.final_logit_softcap);
  }
  return logits;
}

// --- helpers ------------------------------------------------------------------------------------

ModelConfig tiny(std::string_view arch) {
  ModelConfig c = testing::tiny_config(arch);
  c.rope_theta = 10000.0f;
  return c;
}

std::vector<int32_t> test_tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 37 + 11) % 300);
  return t;
}

double max_abs_diff(std::span<const float> a, const Vec& b) {
  double m = 0.0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Largest |logit| difference, every position, engine prefill vs the naive reference; also checks
// that token-by-token decode gives the prefill's last logits (within F32 rounding).
double engine_vs_naive(const ModelWeights& w, const std::vector<int32_t>& tokens,
                       double decode_tolerance = 1e-4) {
  const std::vector<Vec> expected = naive_logits(w, tokens);
  double worst = 0.0;
  for (size_t n = 1; n <= tokens.size(); ++n) {  // prefill of each prefix: logits of its last row
    Session s(w);
    worst = std::max(worst, max_abs_diff(s.prefill({tokens.data(), n}), expected[n - 1]));
  }
  Session stepwise(w);
  std::span<const float> last = stepwise.prefill({tokens.data(), 1});
  for (size_t i = 1; i < tokens.size(); ++i) last = stepwise.decode(tokens[i]);
  EXPECT_LT(max_abs_diff(last, expected.back()), decode_tolerance) << "decode vs naive";
  return worst;
}

// The naive logits of `w` with `edit` applied differ from w's by more than `at_least`: the
// feature under test matters at the tolerance used.
void expect_feature_matters(const ModelWeights& w, const std::vector<int32_t>& tokens,
                            const std::function<void(ModelWeights&)>& edit, double at_least) {
  ModelWeights other = w;
  edit(other);
  const Vec a = naive_logits(w, tokens).back(), b = naive_logits(other, tokens).back();
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  EXPECT_GT(d, at_least);
}

constexpr double kTol = 2e-4;  // F32 engine vs double reference, logits of magnitude ~1-5
// Gemma 3: GELU reads its input rounded to F16 (as ggml does), a step function; where the
// engine's float input and the reference's double one fall on two sides of an F16 rounding
// boundary the activation differs by one F16 step (~5e-4 relative): measured up to 8e-4 in the
// logits on these models, so 3e-3.
constexpr double kGemmaTol = 3e-3;

// --- features against the reference ------------------------------------------------------------

TEST(Architectures, LlamaRopeFreqFactorsDivideThePairFrequencies) {
  ModelConfig c = tiny("llama");
  c.rope_freq_factors = true;
  ModelWeights w = random_model_weights(c, 11);
  ASSERT_NE(w.rope_freqs, nullptr);
  // Factors strong enough to show in a 24-token test (Llama 3.1's only slow the slowest pairs).
  auto factors = std::make_shared<std::vector<float>>(8);
  for (size_t i = 0; i < 8; ++i) (*factors)[i] = 0.25f + 0.75f * static_cast<float>(i);
  w.rope_freqs = factors->data();
  w.storage.push_back(factors);
  const auto tokens = test_tokens(24);
  EXPECT_LT(engine_vs_naive(w, tokens), kTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.rope_freqs = nullptr; }, 10 * kTol);
}

TEST(Architectures, Llama3FactorsAreTheConvertersFormula) {
  // Llama 3.1 (factor 8, low 1, high 4, original context 8192), theta 500000, head 128: the
  // converter's values, recomputed here in double from the HF definition.
  const std::vector<float> f = llama3_rope_freq_factors(128, 500000.0f, kLlama31Rope);
  ASSERT_EQ(f.size(), 64u);
  int ones = 0, eights = 0, between = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi * std::pow(500000.0, 2.0 * i / 128);
    double expected = 0;
    if (wavelen < 8192.0 / 4) {
      expected = 1;
      ++ones;
    } else if (wavelen > 8192.0) {
      expected = 8;
      ++eights;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      expected = 1 / ((1 - smooth) / 8 + smooth);
      ++between;
    }
    EXPECT_NEAR(f[static_cast<size_t>(i)], expected, 1e-4 * expected) << i;
  }
  EXPECT_GT(ones, 0);
  EXPECT_GT(eights, 0);
  EXPECT_GT(between, 0);
  // make-model's llama3 models carry exactly these factors.
  ModelConfig c = tiny("llama");
  c.rope_theta = 500000.0f;
  c.rope_freq_factors = true;
  const ModelWeights w = random_model_weights(c, 1);
  const std::vector<float> g = llama3_rope_freq_factors(16, 500000.0f, kLlama31Rope);
  EXPECT_EQ(std::memcmp(w.rope_freqs, g.data(), g.size() * 4), 0);
}

TEST(Architectures, LinearRopeScalingDividesPositions) {
  ModelConfig c = tiny("llama");
  c.rope_linear_factor = 4.0f;
  const ModelWeights w = random_model_weights(c, 12);
  const auto tokens = test_tokens(24);
  EXPECT_LT(engine_vs_naive(w, tokens), kTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.rope_linear_factor = 1.0f; }, 10 * kTol);
}

TEST(Architectures, PartialRotaryRotatesOnlyTheFirstDims) {
  for (const char* arch : {"llama", "qwen2"}) {
    SCOPED_TRACE(arch);
    ModelConfig c = tiny(arch);
    c.n_rot = 6;  // of 16
    const ModelWeights w = random_model_weights(c, 13);
    const auto tokens = test_tokens(20);
    EXPECT_LT(engine_vs_naive(w, tokens), kTol);
    expect_feature_matters(
        w, tokens, [](ModelWeights& m) { m.config.n_rot = 0; }, 10 * kTol);
  }
}

TEST(Architectures, TiedOutputUsesTheEmbedding) {
  ModelConfig c = tiny("llama");
  c.shared_classifier = true;
  const ModelWeights w = random_model_weights(c, 14);
  EXPECT_EQ(w.output.data, w.token_embd.data);
  EXPECT_LT(engine_vs_naive(w, test_tokens(16)), kTol);
}

TEST(Architectures, Qwen2BiasesAndNeoxRope) {
  ModelConfig c = tiny("qwen2");
  c.shared_classifier = true;  // small Qwen2.5 models tie their embeddings
  const ModelWeights w = random_model_weights(c, 15);
  ASSERT_TRUE(c.rope_neox);
  ASSERT_NE(w.layers[1].bk, nullptr);
  const auto tokens = test_tokens(20);
  EXPECT_LT(engine_vs_naive(w, tokens), kTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.layers[0].bk = nullptr; }, 10 * kTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.rope_neox = false; }, 10 * kTol);
}

TEST(Architectures, Qwen3QkNormsAndExplicitHeadDim) {
  ModelConfig c = tiny("qwen3");
  c.explicit_head_dim = 32;  // 4 heads x 32 = 128 != dim 64, as Qwen3-0.6B (16 x 128 > 1024)
  const ModelWeights w = random_model_weights(c, 16);
  EXPECT_EQ(w.layers[0].wq.rows, 128);
  EXPECT_EQ(w.layers[0].wo.cols, 128);
  ASSERT_NE(w.layers[0].attn_q_norm, nullptr);
  EXPECT_EQ(w.layers[0].bq, nullptr);
  const auto tokens = test_tokens(20);
  EXPECT_LT(engine_vs_naive(w, tokens), kTol);
  // Both norms matter, and they are not interchangeable.
  expect_feature_matters(
      w, tokens,
      [](ModelWeights& m) { std::swap(m.layers[0].attn_q_norm, m.layers[0].attn_k_norm); },
      10 * kTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.layers[1].attn_q_norm = nullptr; }, 10 * kTol);
}

// Gemma 3 as llama.cpp runs it: 6 layers, the period-3 pattern (local, local, global), a window of
// 5 tokens, its own local RoPE base; prefixes up to 24 tokens cross the window many times.
ModelConfig tiny_gemma3() {
  ModelConfig c = tiny("gemma3");
  c.n_layers = 6;
  c.n_kv_heads = 1;
  c.explicit_head_dim = 32;  // 4 x 32 = 128 != dim 64, as Gemma 3 270M (4 x 256 > 640)
  c.embedding_scale = std::sqrt(64.0f);
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.sliding_window = 5;
  c.local_layers = {1, 1, 0, 1, 1, 0};
  c.rope_theta_local = 10000.0f;
  c.rope_theta = 1000000.0f;
  c.shared_classifier = true;
  return c;
}

TEST(Architectures, Gemma3SlidingWindowPostNormsGegluAndScaledEmbedding) {
  const ModelConfig c = tiny_gemma3();
  const ModelWeights w = random_model_weights(c, 17);
  ASSERT_NE(w.layers[0].attn_post_norm, nullptr);
  ASSERT_NE(w.layers[5].ffn_post_norm, nullptr);
  ASSERT_TRUE(c.rope_neox);
  const auto tokens = test_tokens(24);
  EXPECT_LT(engine_vs_naive(w, tokens, kGemmaTol), kGemmaTol);
  // Every Gemma feature changes the output at 10x the tolerance.
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.local_layers.clear(); }, 10 * kGemmaTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.rope_theta_local = m.config.rope_theta; },
      10 * kGemmaTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.layers[1].attn_post_norm = nullptr; }, 10 * kGemmaTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.layers[2].ffn_post_norm = nullptr; }, 10 * kGemmaTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.ffn_activation = FfnActivation::kSilu; },
      10 * kGemmaTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.embedding_scale = 1.0f; }, 10 * kGemmaTol);
}

TEST(Architectures, Gemma3SoftcapAndQueryScale) {
  ModelConfig c = tiny_gemma3();
  c.final_logit_softcap = 2.0f;  // logits of this model reach ~5: the cap bends them visibly
  c.attention_scale = 0.3f;
  const ModelWeights w = random_model_weights(c, 18);
  const auto tokens = test_tokens(12);
  EXPECT_LT(engine_vs_naive(w, tokens, kGemmaTol), kGemmaTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.final_logit_softcap = 0.0f; }, 10 * kGemmaTol);
  expect_feature_matters(
      w, tokens, [](ModelWeights& m) { m.config.attention_scale = 0.0f; }, 10 * kGemmaTol);
}

// Issue 21: "sliding-window layers keep only their window in the cache (real memory, not a
// mask)". The entries were dropped but their memory stayed: the whole prompt's rows, in every
// local layer of every session (a 32K-token Gemma 3 NIAH ran out of 23 GB with 19 sessions).
// Whatever path fills a session — one chunk, several, a shared PrefilledPrompt, a press on the
// global layers, decode and append after — a local head's allocation stays within twice its
// window.
TEST(Architectures, Gemma3LocalLayersHoldOnlyTheirWindowInMemory) {
  ModelConfig c = tiny_gemma3();
  c.context_length = 512;
  const ModelWeights w = random_model_weights(c, 23);
  const auto tokens = test_tokens(300);
  const std::span<const int32_t> prompt(tokens.data(), 200);
  const auto prefilled = PrefilledPrompt::make(w, prompt);
  auto expect_local_heads_small = [&](const Session& s, const std::string& what) {
    for (int l = 0; l < c.n_layers; ++l) {
      if (!c.is_local_layer(l)) continue;
      const HeadCache& head = s.cache().layer(l).heads[0];
      const size_t row_bytes = (2 * static_cast<size_t>(head.head_dim()) + 2) * sizeof(float);
      EXPECT_LE(head.capacity_bytes(), 2 * static_cast<size_t>(c.sliding_window + 1) * row_bytes)
          << what << ", layer " << l << ": " << head.size() << " entries";
    }
  };
  for (const bool with_press : {false, true}) {
    for (const int ubatch : {0, 7, 64}) {
      SessionOptions options;
      options.ubatch = ubatch;
      if (with_press) {
        options.press = PressSpec::parse("snapkv:window=4");
        options.budget.entries = 16;
      }
      const std::string what = fmt::format("press {} ubatch {}", with_press, ubatch);
      Session s(w, options);
      s.prefill(prompt);
      expect_local_heads_small(s, what + ", prefill");
      for (int t = 200; t < 240; ++t) s.decode(tokens[static_cast<size_t>(t)]);
      expect_local_heads_small(s, what + ", decode");
      s.append({tokens.data() + 240, 60});
      expect_local_heads_small(s, what + ", append");
      Session shared(w, options);
      shared.prefill(*prefilled);
      expect_local_heads_small(shared, what + ", shared prefill");
    }
  }
}

TEST(Architectures, Gemma3LocalLayersKeepOnlyTheirWindow) {
  const ModelConfig c = tiny_gemma3();
  const ModelWeights w = random_model_weights(c, 19);
  const auto tokens = test_tokens(30);
  // Chunked prefill (chunks of 7 > window), then decode: the local layers hold window - 1 entries
  // (the next query sees those and itself), the global layers everything; logits as one chunk.
  Session whole(w);
  const std::span<const float> whole_logits = whole.prefill({tokens.data(), 24});
  const std::vector<float> expected(whole_logits.begin(), whole_logits.end());
  SessionOptions chunked_options;
  chunked_options.ubatch = 7;
  Session chunked(w, chunked_options);
  const std::span<const float> got = chunked.prefill({tokens.data(), 24});
  double worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(got[i] - expected[i])));
  EXPECT_LT(worst, 1e-4);
  for (Session* s : {&whole, &chunked}) {
    for (int l = 0; l < c.n_layers; ++l) {
      const HeadCache& head = s->cache().layer(l).heads[0];
      if (c.is_local_layer(l)) {
        ASSERT_EQ(head.size(), c.sliding_window - 1) << l;
        EXPECT_EQ(head.positions().front(), 24 - (c.sliding_window - 1)) << l;
      } else {
        EXPECT_EQ(head.size(), 24) << l;
      }
    }
  }
  const std::vector<Vec> naive = naive_logits(w, tokens);
  for (size_t t = 24; t < tokens.size(); ++t) {
    const std::span<const float> step = chunked.decode(tokens[t]);
    EXPECT_LT(max_abs_diff(step, naive[t]), kGemmaTol) << t;
    EXPECT_EQ(chunked.cache().layer(0).heads[0].size(), c.sliding_window - 1);
    EXPECT_EQ(chunked.cache().layer(2).heads[0].size(), static_cast<int64_t>(t + 1));
  }
  // append() after a prefill crosses the window the same way.
  Session appended(w);
  appended.prefill({tokens.data(), 10});
  const std::span<const float> last = appended.append({tokens.data() + 10, 20});
  EXPECT_LT(max_abs_diff(last, naive.back()), kGemmaTol);
}

// --- GGUF ---------------------------------------------------------------------------------------

void expect_same_tensors(const ModelWeights& a, const ModelWeights& b) {
  for (const TensorSpec& s : tensor_specs(a.config, /*with_optional=*/true)) {
    const WeightMatrix x = tensor_view(a, s), y = tensor_view(b, s);
    ASSERT_EQ(x.data == nullptr, y.data == nullptr) << s.name;
    if (x.data == nullptr) continue;
    ASSERT_EQ(x.bytes(), y.bytes()) << s.name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.bytes()), 0) << s.name;
  }
}

TEST(Architectures, MakeModelFilesRoundTrip) {
  TempDir dir;
  std::vector<ModelConfig> configs;
  configs.push_back(tiny("qwen2"));
  configs.push_back(tiny("qwen3"));
  configs.back().explicit_head_dim = 32;
  configs.push_back(tiny("llama"));
  configs.back().rope_freq_factors = true;
  configs.back().rope_theta = 500000.0f;
  configs.back().shared_classifier = true;
  configs.push_back(tiny("llama"));
  configs.back().rope_linear_factor = 2.0f;
  configs.push_back(tiny_gemma3());
  configs.back().final_logit_softcap = 30.0f;
  // Every row of the architecture registry is among them: a new architecture fails here until
  // its files round-trip.
  for (const Architecture& a : architectures())
    EXPECT_TRUE(std::any_of(configs.begin(), configs.end(),
                            [&](const ModelConfig& c) { return c.architecture == a.name; }))
        << a.name << " has no round trip";
  for (const ModelConfig& c : configs) {
    SCOPED_TRACE(c.architecture);
    RandomModelOptions options;
    options.config = c;
    options.seed = 21;
    const auto path = (dir / "m.gguf").string();
    write_random_model(options, path);
    const GgufFile file = GgufFile::open(path);
    EXPECT_EQ(file.get_string("general.architecture"), c.architecture);
    const ModelWeights back = weights_from_gguf(file);
    EXPECT_EQ(back.config.rope_neox, c.rope_neox);
    EXPECT_EQ(back.config.head_dim(), c.head_dim());
    EXPECT_EQ(back.config.rope_linear_factor, c.rope_linear_factor);
    EXPECT_EQ(back.config.rope_freq_factors, c.rope_freq_factors);
    EXPECT_EQ(back.config.shared_classifier, c.shared_classifier);
    EXPECT_EQ(back.config.local_layers, c.local_layers);
    EXPECT_EQ(back.config.sliding_window, c.sliding_window);
    EXPECT_EQ(back.config.rope_theta_local, c.rope_theta_local);
    EXPECT_EQ(back.config.embedding_scale, c.embedding_scale);
    EXPECT_EQ(back.config.ffn_activation, c.ffn_activation);
    EXPECT_EQ(back.config.final_logit_softcap, c.final_logit_softcap);
    const ModelWeights expected = random_model_weights(c, 21);
    expect_same_tensors(back, expected);
    const auto tokens = test_tokens(8);
    Session a(back), b(expected);
    const auto la = a.prefill(tokens);
    const std::vector<float> first(la.begin(), la.end());
    const auto lb = b.prefill(tokens);
    EXPECT_TRUE(std::equal(first.begin(), first.end(), lb.begin()));
    // Export of the loaded model keeps every tensor (biases, norms, rope_freqs).
    const auto again = (dir / "again.gguf").string();
    export_gguf(back, nullptr, again, {});
    expect_same_tensors(weights_from_gguf(GgufFile::open(again)), expected);
  }
}

// Copies `src` to `dst` without the keys in `drop_keys` and the tensor `drop_tensor`, then lets
// `edit` add or override keys and tensors.
void rewrite(const std::string& src, const std::string& dst, std::set<std::string> drop_keys,
             const std::string& drop_tensor, const std::function<void(GgufWriter&)>& edit = {}) {
  const GgufFile f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [k, v] : f.metadata())
    if (!drop_keys.count(k) && k != "general.alignment") w.set_value(k, v);
  for (const auto& t : f.tensors())
    if (t.name != drop_tensor) w.add_tensor(t.name, t.dims, t.type, t.data, t.nbytes);
  if (edit) edit(w);
  w.write(dst);
}

std::string load_error(const std::string& path) {
  try {
    load_gguf_model(path);
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << path << " loaded";
  return {};
}

TEST(Architectures, BadFilesGiveOneLineErrors) {
  TempDir dir;
  auto make = [&](const ModelConfig& c, const std::string& name) {
    RandomModelOptions o;
    o.config = c;
    const auto path = (dir / name).string();
    write_random_model(o, path);
    return path;
  };
  ModelConfig q3 = tiny("qwen3");
  q3.explicit_head_dim = 32;
  const std::string qwen3 = make(q3, "q3.gguf");
  const std::string qwen2 = make(tiny("qwen2"), "q2.gguf");
  const std::string llama = make(tiny("llama"), "l.gguf");
  const auto bad = (dir / "bad.gguf").string();
  struct Case {
    std::string src;
    std::set<std::string> drop_keys;
    std::string drop_tensor;
    std::function<void(GgufWriter&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {qwen3, {}, "blk.1.attn_q_norm.weight", {}, "blk.1.attn_q_norm.weight"},
      {qwen3, {}, "blk.0.attn_k_norm.weight", {}, "blk.0.attn_k_norm.weight"},
      {qwen2, {}, "blk.1.attn_v.bias", {}, "blk.1.attn_v.bias"},
      {qwen2,
       {"qwen2.attention.layer_norm_rms_epsilon"},
       "",
       {},
       "qwen2.attention.layer_norm_rms_epsilon"},
      {qwen3,
       {"qwen3.attention.key_length"},
       "",
       {},
       "qwen3.rope.dimension_count = 32 must be even and at most the head dimension 16"},
      {qwen3,
       {"qwen3.attention.key_length", "qwen3.rope.dimension_count"},
       "",
       {},
       "blk.0.attn_q.weight has shape"},
      {qwen2,
       {},
       "",
       [](GgufWriter& w) { w.set_string("general.architecture", "gpt2"); },
       "unsupported model architecture 'gpt2'"},
      {llama,
       {},
       "",
       [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "yarn"); },
       "RoPE scaling 'yarn' (llama.rope.scaling.type)"},
      {llama,
       {},
       "",
       [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "longrope"); },
       "longrope"},
      {llama,
       {},
       "",
       [](GgufWriter& w) { w.set_f32("llama.rope.scaling.attn_factor", 1.5f); },
       "llama.rope.scaling.attn_factor"},
      {llama,
       {},
       "",
       [](GgufWriter& w) { w.set_u32("llama.rope.dimension_count", 18); },
       "llama.rope.dimension_count = 18 must be even and at most the head dimension 16"},
      {llama,
       {},
       "",
       [](GgufWriter& w) { w.set_u32("llama.rope.dimension_count", 7); },
       "llama.rope.dimension_count = 7"},
      {llama,
       {},
       "",
       [](GgufWriter& w) { w.set_u32("llama.attention.head_count", 5); },
       "head count 5 (llama.attention.head_count) does not divide embedding length 64"},
      {qwen3,
       {"qwen3.rope.dimension_count"},
       "",
       [](GgufWriter& w) {
         w.set_u32("qwen3.attention.key_length", 31);
         w.set_u32("qwen3.attention.value_length", 31);
       },
       "head dimension 31 must be even"},
      {qwen3,
       {},
       "",
       [](GgufWriter& w) { w.set_u32("qwen3.attention.value_length", 16); },
       "qwen3.attention.value_length = 16 differs"},
      {qwen2,
       {},
       "",
       [](GgufWriter& w) { w.set_u32("qwen2.attention.key_length", 32); },
       "qwen2 needs"},
      {qwen2,
       {},
       "",
       [](GgufWriter& w) { w.set_f32("qwen2.rope.scaling.factor", -3.0f); },
       "invalid qwen2.rope.scaling.factor"},
      {llama,
       {},
       "",
       [](GgufWriter& w) {
         static const float f[7] = {1, 1, 1, 1, 1, 1, 1};
         w.add_tensor("rope_freqs.weight", {7}, DType::F32, f, sizeof f);
       },
       "rope_freqs.weight has shape 7 but the model needs 8"},
      {qwen2,
       {},
       "",
       [](GgufWriter& w) {
         static const float f[8] = {1, 1, 1, 1, 1, 1, 1, 1};
         w.add_tensor("rope_freqs.weight", {8}, DType::F32, f, sizeof f);
       },
       "tensor rope_freqs.weight is not used by architecture 'qwen2'"},
      {llama,
       {},
       "",
       [](GgufWriter& w) {
         static const float f[64] = {};
         w.add_tensor("blk.0.attn_output.bias", {64}, DType::F32, f, sizeof f);
       },
       "tensor blk.0.attn_output.bias is not part of a llama model with 2 blocks"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    rewrite(c.src, bad, c.drop_keys, c.drop_tensor, c.edit);
    const std::string error = load_error(bad);
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

TEST(Architectures, AbsurdConfigsAreRejected) {
  auto error_of = [](const ModelConfig& c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelConfig c = tiny("qwen3");
  c.n_rot = 18;
  EXPECT_NE(error_of(c).find("invalid RoPE dimension count 18"), std::string::npos);
  c = tiny("qwen3");
  c.explicit_head_dim = 15;
  EXPECT_NE(error_of(c).find("head dimension 15 must be even"), std::string::npos);
  c = tiny("llama");
  c.n_heads = 3;
  EXPECT_NE(error_of(c).find("head count 3 does not divide"), std::string::npos);
  c.n_kv_heads = 3;
  c.explicit_head_dim = 16;  // explicit widths need not divide dim
  EXPECT_EQ(error_of(c), "no error");
  c = tiny("llama");
  c.rope_linear_factor = 0.0f;
  EXPECT_NE(error_of(c).find("linear RoPE scaling factor"), std::string::npos);
}

}  // namespace
}  // namespace protokv