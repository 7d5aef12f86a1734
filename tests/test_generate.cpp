// SPDX-License-Identifier: Apache-2.0
// The library generate API (protokv/generate.h): the loop the CLI, evals and future front ends
// share. Checked against a hand-written prefill / append / decode loop on a random model.
#include "protokv/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "model/random_model.h"
#include "protokv/error.h"
#include "protokv/tokenizer.h"
#include "test_engine_model.h"

namespace protokv {
namespace {

using testing::make_random_model;
using testing::RandomModelSpec;

SamplerOptions greedy() {
  SamplerOptions o;
  o.temperature = 0.0f;
  return o;
}

// A synthetic tokenizer whose end-of-sequence id is `eos`.
Tokenizer tokenizer_with_eos(int vocab, int32_t eos) {
  SyntheticVocab v = synthetic_vocab(vocab);
  return Tokenizer(std::move(v.pieces), std::move(v.scores), std::move(v.types), 1, eos, 0);
}

// The reference loop: prefill, append the question, then argmax / decode; with `ignoring_eos`,
// that tokenizer's end-of-generation tokens are never picked (GenerateOptions::ignore_eos).
std::vector<int32_t> manual_greedy(const ModelWeights& w, const PromptTokens& prompt, int n,
                                   const Tokenizer* ignoring_eos = nullptr) {
  Session session(w);
  std::span<const float> logits = session.prefill(prompt.prefill);
  if (!prompt.fed_after.empty()) logits = session.append(prompt.fed_after);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> allowed(logits.begin(), logits.end());
    for (int32_t id = 0; ignoring_eos != nullptr && id < static_cast<int32_t>(allowed.size()); ++id)
      if (ignoring_eos->is_end_of_generation(id))
        allowed[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    out.push_back(argmax(allowed));
    if (i + 1 < n) logits = session.decode(out.back());
  }
  return out;
}

TEST(Generate, GreedyMatchesTheHandWrittenLoopAndStreamsEveryToken) {
  const auto model = make_random_model({});
  const auto tokenizer = synthetic_tokenizer(300);
  const PromptTokens prompt = build_prompt(*tokenizer, "the little dog", "", false);
  Session session(model.weights);
  Sampler sampler(greedy());
  GenerateOptions options;
  options.max_new_tokens = 12;
  options.ignore_eos = true;
  std::vector<int32_t> streamed;
  std::string streamed_text;
  const GenerateResult r = generate(session, *tokenizer, prompt, sampler, options,
                                    [&](int32_t token, std::string_view piece) {
                                      streamed.push_back(token);
                                      streamed_text += piece;
                                    });
  EXPECT_EQ(r.tokens, manual_greedy(model.weights, prompt, 12, tokenizer.get()));
  EXPECT_EQ(streamed, r.tokens);
  EXPECT_EQ(streamed_text, r.text);
  EXPECT_EQ(r.stopped, StopReason::kMaxTokens);
  EXPECT_EQ(r.decode_steps, 11);  // the last token needs no forward pass
  EXPECT_EQ(r.prefill.n_tokens, static_cast<int64_t>(prompt.prefill.size()));
  EXPECT_EQ(r.question_tokens, 0);
  EXPECT_EQ(session.n_past(), static_cast<int64_t>(prompt.prefill.size()) + 11);
}

TEST(Generate, QueryAgnosticAppendsTheQuestionAfterThePrompt) {
  const auto model = make_random_model({});
  const auto tokenizer = synthetic_tokenizer(300);
  const PromptTokens aware = build_prompt(*tokenizer, "a cat sat", "who sat?", false);
  const PromptTokens agnostic = build_prompt(*tokenizer, "a cat sat", "who sat?", true);
  // Same tokens either way; only the split differs.
  std::vector<int32_t> joined = agnostic.prefill;
  joined.insert(joined.end(), agnostic.fed_after.begin(), agnostic.fed_after.end());
  EXPECT_EQ(joined, aware.prefill);
  EXPECT_TRUE(aware.fed_after.empty());
  EXPECT_EQ(aware.prefill.front(), tokenizer->bos_id());
  ASSERT_FALSE(agnostic.fed_after.empty());

  Session session(model.weights);
  Sampler sampler(greedy());
  GenerateOptions options;
  options.max_new_tokens = 6;
  options.ignore_eos = true;
  const GenerateResult r = generate(session, *tokenizer, agnostic, sampler, options);
  EXPECT_EQ(r.tokens, manual_greedy(model.weights, agnostic, 6, tokenizer.get()));
  EXPECT_EQ(r.question_tokens, static_cast<int64_t>(agnostic.fed_after.size()));
  EXPECT_EQ(r.prefill.n_tokens, static_cast<int64_t>(agnostic.prefill.size()));
}

TEST(Generate, StopsAtEosUnlessIgnored) {
  const auto model = make_random_model({});
  const auto plain = synthetic_tokenizer(300);
  const PromptTokens prompt = build_prompt(*plain, "once upon a time", "", false);
  const auto expected = manual_greedy(model.weights, prompt, 8);
  // Make the third greedy token the end of sequence (unless it already appeared earlier).
  const int32_t eos = expected[2];
  ASSERT_NE(eos, expected[0]);
  ASSERT_NE(eos, expected[1]);
  const Tokenizer tokenizer = tokenizer_with_eos(300, eos);
  GenerateOptions options;
  options.max_new_tokens = 8;
  Session session(model.weights);
  Sampler sampler(greedy());
  const GenerateResult stopped = generate(session, tokenizer, prompt, sampler, options);
  EXPECT_EQ(stopped.stopped, StopReason::kEos);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 2));
  EXPECT_EQ(stop_reason_name(stopped.stopped), "eos");

  options.ignore_eos = true;
  Sampler again(greedy());
  const GenerateResult ignored = generate(session, tokenizer, prompt, again, options);
  EXPECT_EQ(ignored.stopped, StopReason::kMaxTokens);
  // As llama.cpp's --ignore-eos: EOS is never sampled (its logit is -inf), so the third token is
  // the best of the others.
  ASSERT_EQ(ignored.tokens.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(ignored.tokens.begin(), ignored.tokens.begin() + 2),
            std::vector<int32_t>(expected.begin(), expected.begin() + 2));
  EXPECT_EQ(std::count(ignored.tokens.begin(), ignored.tokens.end(), eos), 0);
  Session by_hand(model.weights);
  by_hand.prefill(prompt.prefill);
  by_hand.decode(expected[0]);
  const auto last = by_hand.decode(expected[1]);
  std::vector<float> logits(last.begin(), last.end());
  logits[static_cast<size_t>(eos)] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(ignored.tokens[2], std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TEST(Generate, StopsWhenTheContextIsFull) {
  RandomModelSpec spec;
  spec.context_length = 16;
  const auto model = make_random_model(spec);
  const auto tokenizer = synthetic_tokenizer(300);
  PromptTokens prompt;
  prompt.prefill = std::vector<int32_t>(10, 40);
  Session session(model.weights);
  Sampler sampler(greedy());
  GenerateOptions options;
  options.max_new_tokens = 100;
  options.ignore_eos = true;
  const GenerateResult r = generate(session, *tokenizer, prompt, sampler, options);
  EXPECT_EQ(r.stopped, StopReason::kContextFull);
  EXPECT_EQ(stop_reason_name(r.stopped), "context_full");
  EXPECT_EQ(r.tokens.size(), 7u);  // 6 decoded positions fill 10..15, then one more sample
  EXPECT_EQ(r.decode_steps, 6);
  EXPECT_EQ(session.n_past(), 16);
}

TEST(Generate, ZeroTokensAndBadInput) {
  RandomModelSpec spec;
  spec.context_length = 16;
  const auto model = make_random_model(spec);
  const auto tokenizer = synthetic_tokenizer(300);
  Session session(model.weights);
  Sampler sampler(greedy());
  PromptTokens prompt;
  prompt.prefill = {1, 5, 6};
  GenerateOptions options;
  options.max_new_tokens = 0;
  const GenerateResult none = generate(session, *tokenizer, prompt, sampler, options);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.stopped, StopReason::kMaxTokens);
  EXPECT_EQ(none.decode_steps, 0);

  options.max_new_tokens = -1;
  EXPECT_THROW(generate(session, *tokenizer, prompt, sampler, options), Error);
  options.max_new_tokens = 4;
  prompt.fed_after = std::vector<int32_t>(14, 3);  // 3 + 14 > 16
  try {
    generate(session, *tokenizer, prompt, sampler, options);
    FAIL() << "a prompt longer than the context must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the model's context"), std::string::npos);
  }
  EXPECT_THROW(generate(session, *tokenizer, PromptTokens{}, sampler, options), Error);
}

}  // namespace
}  // namespace protokv
