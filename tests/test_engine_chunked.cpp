// SPDX-License-Identifier: Apache-2.0
// Chunked prefill (SessionOptions::ubatch) and Session::append: the prompt fed in chunks, or a
// follow-up turn fed after a (compressed) prefill, gives the logits and caches of a single chunk
// or of token-by-token decode to float rounding; a press still runs once over the whole prompt.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "eval/metrics.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press.h"
#include "protokv/press_spec.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::make_random_model;
using testing::random_tokens;
using testing::RandomModelSpec;

std::vector<float> to_vector(std::span<const float> s) {
  return std::vector<float>(s.begin(), s.end());
}

// Largest |a - b| / max(1, |b|).
float worst_error(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0f, std::fabs(b[i])));
  return worst;
}

// Same entries (positions, log-weights) per head, keys and values to `tol`.
void expect_same_cache(const KvCache& a, const KvCache& b, float tol) {
  ASSERT_EQ(a.n_layers(), b.n_layers());
  for (int l = 0; l < a.n_layers(); ++l)
    for (int h = 0; h < a.n_kv_heads(); ++h) {
      const HeadCache& x = a.layer(l).heads[static_cast<size_t>(h)];
      const HeadCache& y = b.layer(l).heads[static_cast<size_t>(h)];
      ASSERT_EQ(x.size(), y.size()) << "layer " << l << " head " << h;
      EXPECT_TRUE(std::equal(x.positions().begin(), x.positions().end(), y.positions().begin()))
          << "layer " << l << " head " << h;
      const auto n = static_cast<size_t>(x.size() * x.head_dim());
      EXPECT_LE(worst_error({testing::cache_keys(x).data(), n}, {testing::cache_keys(y).data(), n}),
                tol)
          << "layer " << l << " head " << h;
      EXPECT_LE(
          worst_error({testing::cache_values(x).data(), n}, {testing::cache_values(y).data(), n}),
          tol);
      EXPECT_LE(worst_error(x.log_weights(), y.log_weights()), tol);
    }
}

constexpr float kTol = 1e-5f;

struct ChunkCase {
  DType type;
  int ubatch;
};

// A chunk of one token takes decode's mat-vec, which rounds quantised and F16 activations as
// llama.cpp does (kernels::matmul), so the quantised and F16 cases split 37 tokens into chunks
// that leave at least 2 in the last one (5 x 7 + 2, 7 x 5 + 2).
class ChunkedPrefill : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(ChunkedPrefill, EqualsOneShotPrefillAndDecodesTheSame) {
  RandomModelSpec spec;
  spec.type = GetParam().type;
  spec.n_layers = 3;
  spec.biases = true;
  const auto model = make_random_model(spec);
  const auto tokens = random_tokens(37, spec.vocab_size, 11);

  Session whole(model.weights);
  const auto expected = to_vector(whole.prefill(tokens));
  SessionOptions options;
  options.ubatch = GetParam().ubatch;
  Session chunked(model.weights, options);
  const auto actual = to_vector(chunked.prefill(tokens));
  EXPECT_EQ(chunked.n_past(), 37);
  EXPECT_LE(worst_error(actual, expected), kTol);
  expect_same_cache(chunked.cache(), whole.cache(), kTol);
  EXPECT_EQ(chunked.prefill_stats().kv_bytes, whole.prefill_stats().kv_bytes);
  EXPECT_EQ(chunked.prefill_stats().peak_kv_bytes, whole.prefill_stats().peak_kv_bytes);
  for (int32_t t : {5, 9, 2})
    EXPECT_LE(worst_error(chunked.decode(t), to_vector(whole.decode(t))), kTol);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ChunkedPrefill,
                         ::testing::Values(ChunkCase{DType::F32, 1}, ChunkCase{DType::F32, 4},
                                           ChunkCase{DType::F32, 16}, ChunkCase{DType::F32, 36},
                                           ChunkCase{DType::Q8_0, 5}, ChunkCase{DType::F16, 7}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.type)) + "_ubatch" +
                                  std::to_string(info.param.ubatch);
                         });

TEST(ChunkedPrefill, UbatchOfThePromptOrMoreIsBitIdenticalToOneShot) {
  const auto model = make_random_model({});
  const auto tokens = random_tokens(20, 300, 3);
  Session whole(model.weights);
  const auto expected = to_vector(whole.prefill(tokens));
  for (int ubatch : {20, 1000}) {
    SessionOptions options;
    options.ubatch = ubatch;
    Session session(model.weights, options);
    EXPECT_EQ(to_vector(session.prefill(tokens)), expected) << ubatch;
  }
}

// With a compressing press the chunks fill the cache in full and the press runs once over the
// whole prompt, after the final chunk: it keeps the same entries as with one chunk.
TEST(ChunkedPrefill, PressRunsOnceOverTheWholePromptAndKeepsTheSameEntries) {
  RandomModelSpec spec;
  spec.n_layers = 3;
  const auto model = make_random_model(spec);
  const auto tokens = random_tokens(48, spec.vocab_size, 5);
  for (const char* method : {"snapkv", "streaming_llm", "h2o", "adakv", "protokv"}) {
    SCOPED_TRACE(method);
    SessionOptions one_options;
    one_options.press = PressSpec::parse(method);
    one_options.budget.entries = 16;
    SessionOptions chunked_options = one_options;
    chunked_options.ubatch = 7;
    Session one(model.weights, one_options);
    Session chunked(model.weights, chunked_options);
    // Prefill logits never depend on the press: attention inside prefill sees every token.
    EXPECT_LE(worst_error(chunked.prefill(tokens), to_vector(one.prefill(tokens))), kTol);
    expect_same_cache(chunked.cache(), one.cache(), kTol);
    EXPECT_EQ(chunked.prefill_stats().kv_bytes, one.prefill_stats().kv_bytes);
    // The whole uncompressed cache exists before the press runs.
    const size_t hd = static_cast<size_t>(spec.dim / spec.n_heads);
    EXPECT_EQ(chunked.prefill_stats().peak_kv_bytes,
              tokens.size() * static_cast<size_t>(spec.n_layers * spec.n_kv_heads) * hd * 8);
    for (int32_t t : {7, 1})
      EXPECT_LE(worst_error(chunked.decode(t), to_vector(one.decode(t))), kTol);
  }
}

// begin_prefill + prefill_chunk (the server's chunk-per-round prefill) is prefill(), bit for bit:
// same chunk count, same cache, same logits, with and without a press.
TEST(ChunkedPrefill, ChunkByChunkEqualsPrefill) {
  const auto model = make_random_model({});
  const auto prompt = random_tokens(37, 300, 5);
  for (const std::string press : {"full", "snapkv", "pyramidkv"}) {
    for (int64_t ubatch : {0, 8}) {
      SCOPED_TRACE(press + " ubatch " + std::to_string(ubatch));
      SessionOptions o;
      o.ubatch = ubatch;
      if (press != "full") {
        o.press = PressSpec::parse(press);
        o.budget = Budget{12, 0.0};
      }
      Session whole(model.weights, o), stepped(model.weights, o);
      const auto expected = whole.prefill(prompt);
      stepped.begin_prefill(prompt);
      int chunks = 1;
      while (!stepped.prefill_chunk()) ++chunks;
      EXPECT_EQ(chunks, ubatch == 0 ? 1 : (37 + 7) / 8);
      const auto got = stepped.logits();
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expected[i]) << i;
      EXPECT_EQ(stepped.n_past(), whole.n_past());
      EXPECT_EQ(stepped.cache().kv_bytes(), whole.cache().kv_bytes());
      EXPECT_EQ(stepped.decode(7)[3], whole.decode(7)[3]);
    }
  }
  Session s(model.weights);
  EXPECT_THROW(s.prefill_chunk(), Error);  // no begin_prefill
  EXPECT_THROW(s.begin_prefill(std::vector<int32_t>{}), Error);
}

TEST(SessionAppend, FollowUpTurnEqualsOneShotPrefillOfBoth) {
  RandomModelSpec spec;
  spec.n_layers = 2;
  const auto model = make_random_model(spec);
  const auto tokens = random_tokens(30, spec.vocab_size, 8);
  const std::span<const int32_t> all(tokens);
  Session whole(model.weights);
  const auto expected = to_vector(whole.prefill(all));
  for (int ubatch : {0, 4}) {
    SessionOptions options;
    options.ubatch = ubatch;
    Session turns(model.weights, options);
    turns.prefill(all.first(12));
    turns.append(all.subspan(12, 5));
    const auto actual = to_vector(turns.append(all.subspan(17)));
    EXPECT_EQ(turns.n_past(), 30);
    EXPECT_LE(worst_error(actual, expected), kTol) << ubatch;
    expect_same_cache(turns.cache(), whole.cache(), kTol);
  }
}

// The model of the row-logits tests: weights of `type`, dim 256 (one K-quant block per row).
RandomModelSpec row_logits_model_spec(DType type) {
  RandomModelSpec spec;
  spec.shared_classifier = true;
  spec.type = type;
  spec.dim = 256;
  spec.hidden_dim = 512;
  return spec;
}

// append with every row's logits (perplexity's pass): the logits after each token are those of
// decoding it, in order, whatever the chunking; the returned logits are the last row's. With
// quantised weights each row is multiplied as decode multiplies it (int8 activations), so rows
// agree to float rounding except where a rounding difference in the attention (the prompt's GEMM
// against decode's kernel) flips an activation's int8 rounding; from such a row on, the caches
// differ too and every later row differs a little (a cascade whose start depends on the BLAS
// kernels: 1 row of 35 on OpenBLAS's Prescott kernels, 19 on its SkylakeX ones). The rows'
// arithmetic itself is checked without the cascade by OneRowAppendsAreDecodeSteps below.
TEST(SessionAppend, EveryRowsLogitsAreThoseOfDecodingTokenByToken) {
  for (DType type : {DType::F32, DType::Q4_0, DType::Q4_K}) {
    const RandomModelSpec spec = row_logits_model_spec(type);
    const auto model = make_random_model(spec);
    const auto tokens = random_tokens(45, spec.vocab_size, 9);
    const std::span<const int32_t> all(tokens);
    Session stepwise(model.weights);
    stepwise.prefill(all.first(10));
    std::vector<std::vector<float>> expected;
    for (size_t i = 10; i < tokens.size(); ++i)
      expected.push_back(to_vector(stepwise.decode(all[i])));
    for (int ubatch : {0, 4}) {
      SessionOptions options;
      options.ubatch = ubatch;
      Session batched(model.weights, options);
      batched.prefill(all.first(10));
      std::vector<int64_t> indices;
      std::vector<float> last_row;
      size_t rows_within_rounding = 0;
      const auto returned =
          to_vector(batched.append(all.subspan(10), [&](int64_t i, std::span<const float> logits) {
            ASSERT_LT(static_cast<size_t>(i), expected.size());
            const auto& want = expected[static_cast<size_t>(i)];
            const double relative =
                eval::relative_error(want.data(), logits.data(), static_cast<int64_t>(want.size()));
            if (relative <= 1e-5) ++rows_within_rounding;
            EXPECT_LE(relative, 0.05) << "row " << i << ", " << dtype_name(type);
            indices.push_back(i);
            last_row = to_vector(logits);
          }));
      const std::string what = fmt::format("{}, ubatch {}", dtype_name(type), ubatch);
      // F32: no int8 rounding to flip; the attention's order of sums differs (2.5e-7 measured).
      if (type == DType::F32) {
        EXPECT_EQ(rows_within_rounding, expected.size()) << what;
      }
      std::vector<int64_t> in_order(expected.size());
      std::iota(in_order.begin(), in_order.end(), 0);
      EXPECT_EQ(indices, in_order) << what;
      EXPECT_EQ(returned, last_row) << what;
      EXPECT_EQ(batched.n_past(), 45);
      if (type == DType::F32) expect_same_cache(batched.cache(), stepwise.cache(), kTol);
    }
  }
}

// The row arithmetic of append's logits without the cascade above: each row appended alone onto
// the same prefilled cache as a decode step, so a flipped int8 rounding (rare) costs one row, not
// every later one. A GEMM with F32 activations would miss every quantised row (by ~1e-3).
TEST(SessionAppend, OneRowAppendsAreDecodeSteps) {
  for (DType type : {DType::Q4_0, DType::Q4_K}) {
    const RandomModelSpec spec = row_logits_model_spec(type);
    const auto model = make_random_model(spec);
    const auto tokens = random_tokens(30, spec.vocab_size, 9);
    const std::span<const int32_t> all(tokens);
    size_t rows = 0, rows_within_tol = 0;
    for (size_t i = 10; i < tokens.size(); ++i, ++rows) {
      Session decoded(model.weights), appended(model.weights);
      decoded.prefill(all.first(i));
      appended.prefill(all.first(i));
      const auto want = to_vector(decoded.decode(all[i]));
      std::vector<float> got;
      appended.append(all.subspan(i, 1),
                      [&](int64_t, std::span<const float> logits) { got = to_vector(logits); });
      ASSERT_EQ(got.size(), want.size());
      if (worst_error(got, want) <= kTol) ++rows_within_tol;
    }
    EXPECT_GE(rows_within_tol, rows * 9 / 10) << dtype_name(type);
  }
}

// A question appended after a compressed context (query-agnostic mode) attends to the ragged,
// log-weighted cache exactly as decoding it token by token does.
TEST(SessionAppend, AfterCompressionEqualsTokenByTokenDecode) {
  RandomModelSpec spec;
  spec.n_layers = 3;
  const auto model = make_random_model(spec);
  const auto tokens = random_tokens(40, spec.vocab_size, 9);
  const std::span<const int32_t> context = std::span<const int32_t>(tokens).first(31);
  const std::span<const int32_t> question = std::span<const int32_t>(tokens).subspan(31);
  // chelsea (small sinks and recent window, no outlier heads): merged entries, whose log-count
  // bias (Chelsea Eq. 2) the prefill attention kernel must add as decode does.
  for (const char* method : {"snapkv", "protokv", "chelsea:sinks=2,recent=4,outliers=0"}) {
    SCOPED_TRACE(method);
    SessionOptions options;
    options.budget.entries = 12;
    options.press = PressSpec::parse(method);
    Session appended(model.weights, options);
    Session decoded(model.weights, options);
    appended.prefill(context);
    decoded.prefill(context);
    const PrefillStats before = appended.prefill_stats();
    std::span<const float> expected;
    for (int32_t t : question) expected = decoded.decode(t);
    const auto actual = to_vector(appended.append(question));
    // The prefill statistics still describe the prompt's prefill.
    EXPECT_EQ(appended.prefill_stats().peak_kv_bytes, before.peak_kv_bytes);
    EXPECT_EQ(appended.prefill_stats().kv_bytes, before.kv_bytes);
    EXPECT_LE(worst_error(actual, to_vector(expected)), kTol);
    expect_same_cache(appended.cache(), decoded.cache(), kTol);
    EXPECT_LE(worst_error(appended.decode(3), to_vector(decoded.decode(3))), kTol);
  }
}

TEST(SessionAppend, InputErrors) {
  RandomModelSpec spec;
  spec.context_length = 16;
  const auto model = make_random_model(spec);
  Session session(model.weights);
  const std::vector<int32_t> ten(10, 1);
  EXPECT_THROW(session.append({}), Error);
  session.prefill(ten);
  try {
    session.append(ten);
    FAIL() << "appending past the context must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context is full"), std::string::npos) << e.what();
  }
  EXPECT_THROW(session.append(std::vector<int32_t>{1, 300}), Error);  // token outside the vocab
  EXPECT_EQ(session.n_past(), 10);  // rejected input leaves the session as it was
  session.append(std::vector<int32_t>(6, 2));
  EXPECT_EQ(session.n_past(), 16);

  SessionOptions bad;
  bad.ubatch = -1;
  EXPECT_THROW(Session(model.weights, bad), Error);
}

}  // namespace
}  // namespace protokv
