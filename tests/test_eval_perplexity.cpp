// SPDX-License-Identifier: Apache-2.0
// `protokv perplexity` (llama-perplexity's protocol): the library result against a naive
// recomputation on stories260K, and one-line errors for bad input through the CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/metrics.h"
#include "eval/perplexity.h"
#include "protokv/engine.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "protokv/tokenizer.h"
#include "test_util.h"

namespace protokv {
namespace {

using testing::run_protokv;
using testing::stories_dir;
using testing::TempDir;

// A TinyStories-like text of a few hundred tokens.
std::string story_text() {
  std::string text;
  const char* sentences[] = {
      "Once upon a time, there was a little girl named Lily. ",
      "She loved to play outside in the park with her big red ball. ",
      "One day, her friend Tom came to play. They ran and laughed in the sun. ",
      "Then the ball went up into a tall tree, and Lily was sad. ",
      "Tom said, \"Do not be sad, I will help you.\" He got a long stick. ",
      "Together they got the ball down, and they were very happy. ",
      "Lily's mom gave them a cookie, and they said thank you. ",
      "The end.\n"};
  for (int repeat = 0; repeat < 4; ++repeat)
    for (const char* s : sentences) text += s;
  return text;
}

LoadedModel load_stories() {
  return load_model((stories_dir() / "stories260K.bin").string(),
                    (stories_dir() / "tok512.bin").string());
}

TEST(EvalPerplexity, TokensStartWithBosLikeLlamaCpp) {
  PROTOKV_REQUIRE_STORIES();
  const LoadedModel model = load_stories();
  const auto tokens = eval::perplexity_tokens(*model.tokenizer, story_text());
  ASSERT_GE(tokens.size(), 200u);
  EXPECT_EQ(tokens[0], model.tokenizer->bos_id());
  EXPECT_EQ(std::vector<int32_t>(tokens.begin() + 1, tokens.end()),
            model.tokenizer->encode(story_text(), false));
}

TEST(EvalPerplexity, LlamaCppNllIsMinusLogSoftmax) {
  const std::vector<float> logits = {1.0f, -2.0f, 3.5f, 0.25f};
  for (int32_t t = 0; t < 4; ++t)
    EXPECT_NEAR(eval::llama_cpp_nll(logits, t), -eval::log_softmax_at(logits, t), 1e-6);
  EXPECT_THROW(eval::llama_cpp_nll(logits, 4), Error);
}

// Every scored position recomputed from scratch: a fresh prefill of the chunk's prefix (BOS first)
// ending at that position, its last logits scored against the next token.
TEST(EvalPerplexity, MatchesNaiveRecomputationOnStories) {
  PROTOKV_REQUIRE_STORIES();
  const LoadedModel model = load_stories();
  const auto tokens = eval::perplexity_tokens(*model.tokenizer, story_text());
  const int32_t bos = model.tokenizer->bos_id();
  eval::PerplexityOptions options;
  options.n_ctx = 48;
  options.n_chunks = 3;
  ASSERT_GE(tokens.size(), 3u * 48u);

  Session session(model.weights);
  int64_t progress_calls = 0;
  const auto result = eval::perplexity(
      session, tokens, bos, options, [&](int64_t chunk, const eval::PerplexityResult& so_far) {
        EXPECT_EQ(chunk, progress_calls++);
        EXPECT_EQ(so_far.running_ppl.size(), static_cast<size_t>(chunk + 1));
      });
  EXPECT_EQ(progress_calls, 3);

  double nll = 0.0, nll2 = 0.0;
  int64_t count = 0;
  std::vector<double> running;
  Session naive(model.weights);
  for (int64_t c = 0; c < 3; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * 48, tokens.begin() + (c + 1) * 48);
    chunk[0] = bos;
    for (int64_t j = 24; j <= 46; ++j) {
      const auto logits =
          naive.prefill(std::span<const int32_t>(chunk.data(), static_cast<size_t>(j + 1)));
      const double v = -eval::log_softmax_at(logits, chunk[static_cast<size_t>(j + 1)]);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    running.push_back(std::exp(nll / static_cast<double>(count)));
  }
  const double mean = nll / static_cast<double>(count);
  const double ppl = std::exp(mean);
  const double error = std::sqrt((nll2 / static_cast<double>(count) - mean * mean) /
                                 static_cast<double>(count - 1)) *
                       ppl;

  EXPECT_EQ(result.n_text_tokens, static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(result.n_chunks, 3);
  EXPECT_EQ(result.n_scored, 3 * 23);
  EXPECT_EQ(count, 3 * 23);
  ASSERT_EQ(result.running_ppl.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(result.running_ppl[i], running[i], 1e-4 * running[i]);
  EXPECT_NEAR(result.mean_nll, mean, 1e-5);
  EXPECT_NEAR(result.ppl, ppl, 1e-4 * ppl);
  EXPECT_NEAR(result.ppl_error, error, 1e-3 * error);
  // A trained model on in-domain text: far better than uniform over 512 tokens.
  EXPECT_GT(result.ppl, 1.0);
  EXPECT_LT(result.ppl, 100.0);
}

TEST(EvalPerplexity, ChunksDefaultToAllThatFit) {
  PROTOKV_REQUIRE_STORIES();
  const LoadedModel model = load_stories();
  const auto tokens = eval::perplexity_tokens(*model.tokenizer, story_text());
  eval::PerplexityOptions options;
  options.n_ctx = 64;
  EXPECT_EQ(eval::perplexity_chunk_count(static_cast<int64_t>(tokens.size()), 512, options),
            static_cast<int64_t>(tokens.size()) / 64);
  options.n_chunks = 2;
  EXPECT_EQ(eval::perplexity_chunk_count(static_cast<int64_t>(tokens.size()), 512, options), 2);
}

TEST(EvalPerplexity, RejectsBadInput) {
  eval::PerplexityOptions options;
  options.n_ctx = 64;
  EXPECT_THROW(eval::perplexity_chunk_count(127, 512, options), Error);  // < 2 chunks
  EXPECT_NO_THROW(eval::perplexity_chunk_count(128, 512, options));
  EXPECT_THROW(eval::perplexity_chunk_count(10000, 32, options), Error);  // > model context
  options.n_ctx = 3;
  EXPECT_THROW(eval::perplexity_chunk_count(10000, 512, options), Error);
  options.n_ctx = 64;
  options.n_chunks = 0;
  EXPECT_THROW(eval::perplexity_chunk_count(10000, 512, options), Error);
}

std::string stories_args() {
  return "perplexity -m '" + (stories_dir() / "stories260K.bin").string() + "' -z '" +
         (stories_dir() / "tok512.bin").string() + "' -t 1";
}

std::string write_text(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto path = dir / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

TEST(CliPerplexity, PrintsRunningAndFinalEstimateLikeLlamaCpp) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  const std::string text = write_text(dir, "story.txt", story_text());
  const auto r = run_protokv(stories_args() + " -f '" + text + "' -c 64 --chunks 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[1]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(",[2]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[3]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Final estimate: PPL = "), std::string::npos) << r.out;

  const auto j = run_protokv(stories_args() + " -f '" + text + "' -c 64 --chunks 2 --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto json = nlohmann::json::parse(j.out);
  EXPECT_EQ(json["chunks"], 2);
  EXPECT_EQ(json["n_ctx"], 64);
  EXPECT_EQ(json["scored_tokens"], 2 * 31);
  EXPECT_EQ(json["running_ppl"].size(), 2u);
  // The text report prints the same number the JSON holds.
  const std::string final_line =
      fmt::format("Final estimate: PPL = {:.4f} +/- {:.5f}", json["ppl"].get<double>(),
                  json["ppl_error"].get<double>());
  EXPECT_NE(r.out.find(final_line), std::string::npos) << r.out << "\n" << final_line;
}

TEST(CliPerplexity, BadInputGivesOneLineError) {
  PROTOKV_REQUIRE_STORIES();
  TempDir dir;
  const std::string text = write_text(dir, "story.txt", story_text());
  testing::expect_run_fails_with_one_line(
      stories_args() + " -f '" + write_text(dir, "empty.txt", "") + "'", "empty");
  testing::expect_run_fails_with_one_line(
      stories_args() + " -f '" + write_text(dir, "short.txt", "Once upon a time.") + "' -c 64",
      "needs at least 128");
  testing::expect_run_fails_with_one_line(stories_args() + " -f '" + text + "' -c 100000000",
                                          "context length");
  testing::expect_run_fails_with_one_line(stories_args() + " -f '" + text + "' -c 0", "at least 4");
  testing::expect_run_fails_with_one_line(stories_args() + " -f '" + text + "' -c -5",
                                          "at least 4");
  testing::expect_run_fails_with_one_line(stories_args() + " -f '" + text + "' -c 64 --chunks 0",
                                          "--chunks");
  testing::expect_run_fails_with_one_line(
      stories_args() + " -f '" + (dir / "missing.txt").string() + "'", "missing.txt");
}

}  // namespace
}  // namespace protokv
