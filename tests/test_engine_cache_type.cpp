// SPDX-License-Identifier: Apache-2.0
// Quantised KV caches (SessionOptions::cache_type, --cache-type-k/-v) end to end: every press
// runs on every cache type and stores its rows in that type's bytes; the prompt's own attention
// reads K/V as stored, whether the prompt runs at once or in chunks; a prefilled prompt serves
// sessions of its own cache type only; the CLI takes llama.cpp's flags.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
#include "test_engine_model.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::make_random_model;
using testing::random_tokens;
using testing::RandomModelSpec;
using testing::run_protokv;

// Heads of 32 values (dim 128, 4 heads): the width q8_0 and q4_0 blocks need.
RandomModelSpec model_spec() {
  RandomModelSpec spec;
  spec.dim = 128;
  spec.hidden_dim = 192;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;
  spec.context_length = 512;
  return spec;
}

// Heads of 128 values (dim 256, 2 heads, 1 KV head): quantised types store them rotated
// (KvCacheType::hadamard), keys in one slice of 128, values in two of 64, so decode dots rotated
// queries with the stored rows; from 128 entries on, decode splits the group of 2 query heads
// over 2 threads (a part that starts at the second head).
RandomModelSpec rotated_model_spec() {
  RandomModelSpec spec = model_spec();
  spec.dim = 256;
  spec.n_heads = 2;
  spec.n_kv_heads = 1;
  return spec;
}

const std::vector<DType>& lossy_types() {
  static const std::vector<DType> types = {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  return types;
}

// Bytes the cache's rows take in its own types: its stored key rows and every value row.
size_t typed_row_bytes(const KvCache& cache) {
  const size_t key_row = dtype_row_bytes(cache.type().key, cache.head_dim());
  const size_t value_row = dtype_row_bytes(cache.type().value, cache.head_dim());
  size_t total = 0;
  for (int l = 0; l < cache.n_layers(); ++l)
    for (const HeadCache& head : cache.layer(l).heads)
      total += static_cast<size_t>(head.key_rows_held()) * key_row +
               static_cast<size_t>(head.size()) * value_row;
  return total;
}

float max_abs_difference(std::span<const float> a, std::span<const float> b) {
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

TEST(CacheTypes, EveryPressRunsOnEveryCacheTypeInItsRowBytes) {
  for (const RandomModelSpec& spec : {model_spec(), rotated_model_spec()})
    for (const std::string& name : press_names()) {
      const auto model = make_random_model(spec);
      const auto prompt = random_tokens(240, model.weights.config.vocab_size, 7);
      for (const DType type : lossy_types()) {
        SCOPED_TRACE(name + " " + std::string(dtype_name(type)) + " head of " +
                     std::to_string(model.weights.config.head_dim()));
        SessionOptions options;
        if (name != "full") {
          options.press = PressSpec::parse(name);
          options.budget.entries = 96;  // room for chelsea's sinks and recent entries
        }
        options.cache_type = {type, type};
        Session session(model.weights, options);
        session.prefill(prompt);
        for (int step = 0; step < 6; ++step) {
          const auto logits = session.decode(static_cast<int32_t>(step + 3));
          for (const float x : logits) ASSERT_TRUE(std::isfinite(x));
        }
        const KvCache& cache = session.cache();
        EXPECT_EQ(cache.type(), (KvCacheType{type, type}));
        EXPECT_EQ(cache.kv_bytes(), typed_row_bytes(cache));
        // Smaller than the same entries in F32.
        EXPECT_LT(cache.kv_bytes(), static_cast<size_t>(cache.total_entries()) * 2 *
                                        static_cast<size_t>(cache.head_dim()) * sizeof(float));
      }
    }
}

// F16 and Q8_0 keep the full cache's logits close to the F32 cache's; each type's cost is
// ordered as its precision on this model's logits (a wrong row read would be far off).
TEST(CacheTypes, LogitsStayCloseToTheF32CacheInOrderOfPrecision) {
  const auto model = make_random_model(model_spec());
  const auto prompt = random_tokens(200, model.weights.config.vocab_size, 11);
  const auto run = [&](DType type) {
    SessionOptions options;
    options.cache_type = {type, type};
    Session session(model.weights, options);
    session.prefill(prompt);
    std::vector<float> all;
    for (int step = 0; step < 8; ++step) {
      const auto logits = session.decode(static_cast<int32_t>(step + 1));
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  };
  const auto f32 = run(DType::F32);
  const float f16 = max_abs_difference(run(DType::F16), f32);
  const float q8 = max_abs_difference(run(DType::Q8_0), f32);
  const float q4 = max_abs_difference(run(DType::Q4_0), f32);
  EXPECT_GT(f16, 0.0f);  // really stored in F16
  EXPECT_LT(f16, 2e-3f);
  EXPECT_LT(q8, 3e-2f);
  EXPECT_LT(f16, q8);
  EXPECT_LT(q8, q4);
}

// Rotated rows (heads of 64): a token decoded after the prompt gets the logits the prompt's
// prefill gives it as its last row (decode: rotated queries against the stored rows, output
// rotated back; prefill: the rows read back unrotated), for q8_0 and q4_0 keys and values; the
// rotation is really on (without it the logits differ). PoD's borrowed keys and the lender
// layer's queries (scores=lower, the default) meet rotated too, in decode and in appended rows:
// its q8_0 logits stay as close to its F32-cache logits as the full cache's do.
TEST(CacheTypes, RotatedRowsDecodeAsThePromptPrefillsThem) {
  const auto model = make_random_model(rotated_model_spec());
  const auto prompt = random_tokens(140, model.weights.config.vocab_size, 13);
  std::vector<int32_t> longer = prompt;
  longer.push_back(17);
  for (const DType type : {DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(dtype_name(type));
    SessionOptions options;
    options.cache_type = {type, type};
    Session prefilled(model.weights, options), decoded(model.weights, options);
    ASSERT_EQ(prefilled.cache().layer(0).heads[0].key_rotation(), 128);
    ASSERT_EQ(prefilled.cache().layer(0).heads[0].value_rotation(), 64);
    const auto expected = prefilled.prefill(longer);
    decoded.prefill(prompt);
    const auto got = decoded.decode(17);
    EXPECT_LT(max_abs_difference(got, expected), 2e-4f);
    SessionOptions unrotated = options;
    unrotated.cache_type.hadamard = false;
    Session plain(model.weights, unrotated);
    plain.prefill(prompt);
    EXPECT_GT(max_abs_difference(plain.decode(17), got), 1e-4f);
  }
  const auto pod_logits = [&](KvCacheType cache_type) {
    SessionOptions options;
    options.cache_type = cache_type;
    options.press = PressSpec::parse("pod:sinks=4");
    options.budget.entries = 32;
    Session session(model.weights, options);
    session.prefill(prompt);
    // Appended rows attend over the borrowed keys gathered as F32 (prefill's cached path).
    const auto appended = random_tokens(8, model.weights.config.vocab_size, 21);
    const auto appended_logits = session.append(appended);
    std::vector<float> all(appended_logits.begin(), appended_logits.end());
    for (int step = 0; step < 4; ++step) {
      const auto logits = session.decode(static_cast<int32_t>(step + 5));
      all.insert(all.end(), logits.begin(), logits.end());
    }
    bool shared = false;
    for (int l = 0; l < session.cache().n_layers(); ++l)
      shared = shared || session.cache().layer(l).heads[0].shares_keys();
    EXPECT_TRUE(shared);
    return all;
  };
  EXPECT_LT(max_abs_difference(pod_logits({DType::Q8_0, DType::Q8_0}),
                               pod_logits({DType::F32, DType::F32})),
            3e-2f);
}

// The prompt's own attention reads K/V as the cache stores them (llama.cpp's does too): the
// whole prompt at once with a press, which attends over its computed rows before the press
// stores them, gives the logits of a chunked prefill, which attends over the rows read back from
// the cache (and compresses after the last chunk).
TEST(CacheTypes, WholeAndChunkedPrefillReadTheStoredRows) {
  const auto model = make_random_model(model_spec());
  const auto prompt = random_tokens(130, model.weights.config.vocab_size, 5);
  for (const DType type : lossy_types()) {
    SCOPED_TRACE(dtype_name(type));
    SessionOptions whole_options;
    whole_options.cache_type = {type, type};
    // With a press the whole prompt's K/V go to it directly (not through the cache).
    whole_options.press = PressSpec::parse("snapkv");
    whole_options.budget.entries = 64;
    SessionOptions chunked_options = whole_options;
    chunked_options.ubatch = 32;
    Session whole(model.weights, whole_options), chunked(model.weights, chunked_options);
    const auto a = whole.prefill(prompt);  // each session's own logits buffer
    const auto b = chunked.prefill(prompt);
    EXPECT_LT(max_abs_difference(a, b), 2e-4f);
    EXPECT_EQ(whole.cache().kv_bytes(), chunked.cache().kv_bytes());
  }
}

TEST(CacheTypes, PrefilledPromptServesSessionsOfItsCacheType) {
  const auto model = make_random_model(model_spec());
  const auto prompt = random_tokens(96, model.weights.config.vocab_size, 3);
  const KvCacheType q8{DType::Q8_0, DType::Q8_0};
  const auto prefilled = PrefilledPrompt::make(model.weights, prompt, 0, q8);
  EXPECT_EQ(prefilled->cache_type(), q8);
  SessionOptions options;
  options.cache_type = q8;
  options.press = PressSpec::parse("snapkv");
  options.budget.entries = 40;
  Session from_prompt(model.weights, options), direct(model.weights, options);
  const auto a = from_prompt.prefill(*prefilled);
  const auto b = direct.prefill(prompt);
  EXPECT_EQ(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()));
  EXPECT_EQ(from_prompt.cache().kv_bytes(), direct.cache().kv_bytes());
  Session f32(model.weights, SessionOptions{});
  EXPECT_THROW(f32.prefill(*prefilled), Error);
}

TEST(CacheTypes, CliTakesLlamaCppsFlagsAndRefusesWhatDoesNotFit) {
  PROTOKV_REQUIRE_STORIES();
  const std::string base = "generate -m " + (testing::stories_dir() / "stories260K.bin").string() +
                           " -z " + (testing::stories_dir() / "tok512.bin").string() +
                           " -t 1 -n 4 --temp 0 --json";
  const auto f16 = run_protokv(base + " -ctk f16 --cache-type-v bf16");
  ASSERT_EQ(f16.exit_code, 0) << f16.err;
  const auto j = nlohmann::json::parse(f16.out);
  EXPECT_EQ(j["config"]["cache_type_k"], "f16");
  EXPECT_EQ(j["config"]["cache_type_v"], "bf16");
  // stories260K: 5 layers x 4 KV heads x 8 dims x (K + V) x 2 bytes per token.
  EXPECT_EQ(j["kv_bytes_after_prefill"], 640);
  EXPECT_EQ(j["kv_bytes_full"], 640);
  // Heads of 8 values cannot hold 32-value blocks; an unknown type lists the known ones.
  const auto q8 = run_protokv(base + " -ctv q8_0");
  EXPECT_EQ(q8.exit_code, 1);
  EXPECT_NE(q8.err.find("--cache-type-v: q8_0 stores blocks of 32 values, which do not divide "
                        "this model's head width of 8"),
            std::string::npos)
      << q8.err;
  const auto unknown = run_protokv(base + " --cache-type-k q5_K");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("unknown KV cache type 'q5_K' (types: f32, f16, bf16, q8_0, q4_0)"),
            std::string::npos)
      << unknown.err;
}

}  // namespace
}  // namespace protokv
