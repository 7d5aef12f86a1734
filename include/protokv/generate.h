// SPDX-License-Identifier: Apache-2.0
#pragma once
// Text generation on top of Session, for the CLI and any other front end (server, bindings):
// prompt text -> tokens (build_prompt) -> prefill, compressed by the session's press -> the
// question (query-agnostic mode) appended as a second chunk -> a sampling loop with a per-token
// callback and stop conditions (max tokens, EOS unless ignored, full context).
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protokv/engine.h"
#include "protokv/sampler.h"

namespace protokv {

class Tokenizer;

// The token protocol of both modes: [BOS where the vocabulary wants it] + context, then "\n" +
// question encoded on its own (no BOS), so query-aware and query-agnostic runs see exactly the same
// tokens and differ only in what is compressed. Query-aware: everything is prefilled (and
// compressed) together, `fed_after` is empty; query-agnostic: the context alone is prefilled and
// compressed, then the question is appended uncompressed (Session::append).
struct PromptTokens {
  std::vector<int32_t> prefill;
  std::vector<int32_t> fed_after;
  int64_t total() const { return static_cast<int64_t>(prefill.size() + fed_after.size()); }
};
PromptTokens build_prompt(const Tokenizer& tokenizer, const std::string& context,
                          const std::string& question, bool query_agnostic);

struct GenerateOptions {
  int max_new_tokens = 256;
  // Never stop for an end-of-generation token: as llama.cpp's --ignore-eos (and llama-server's
  // ignore_eos), their logits are set to -inf before sampling, so none is ever emitted.
  bool ignore_eos = false;
};

enum class StopReason { kMaxTokens, kEos, kContextFull };
// "max_tokens", "eos", "context_full" (the --json spelling).
std::string_view stop_reason_name(StopReason reason);

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated, EOS excluded
  std::string text;             // their decoded text
  StopReason stopped = StopReason::kMaxTokens;
  PrefillStats prefill;         // of the prompt's prefill (compression included)
  int64_t question_tokens = 0;  // appended after the compressed prompt
  double question_ms = 0.0;
  int64_t decode_steps = 0;  // forward passes of generated tokens (the last one needs none)
  double decode_ms = 0.0;    // their total time
};

// Called with each generated token and its decoded text piece, as soon as it is sampled.
using TokenCallback = std::function<void(int32_t token, std::string_view piece)>;

// The generate loop one token at a time, for front ends that interleave many sequences (the
// server's scheduler steps every active session once per round). start() resets the session,
// prefills prompt.prefill and appends prompt.fed_after; each step() then runs the forward pass
// of the token sampled before (none before the first) and samples the next. generate() is
// start() followed by step() until it returns false, so both give the same tokens.
class Generation {
 public:
  // The references must outlive the Generation. Throws Error when max_new_tokens is negative.
  Generation(Session& session, const Tokenizer& tokenizer, Sampler& sampler,
             GenerateOptions options);
  // Throws Error when the prompt is empty or longer than the session's context.
  void start(const PromptTokens& prompt);
  // start() in steps, for a caller that interleaves a long prompt's chunks with other work:
  // begin() checks the prompt and begins the prefill (Session::begin_prefill); each
  // advance_prefill() runs one chunk (SessionOptions::ubatch rows) and returns true once the
  // prompt (and the question appended after it) is in and step() may sample. start() is begin()
  // then advance_prefill() until true.
  void begin(const PromptTokens& prompt);
  bool advance_prefill();
  // Instead of start(): continues the session's current sequence with `tokens` (Session::append:
  // appended in full, never compressed), e.g. a follow-up turn after a cached conversation.
  // result().prefill then describes this append. Throws Error, leaving the session unchanged,
  // when the session holds nothing yet or the tokens do not fit (Session::append).
  void continue_with(std::span<const int32_t> tokens);
  // Runs the forward pass of the token sampled last (if any), samples one token and reports it
  // through on_token; false once generation has stopped (result().stopped says why; no token is
  // reported then).
  bool step(const TokenCallback& on_token = {});
  // The forward pass on its own, for a caller that batches it across sessions (decode_batch):
  // whether the token sampled last still needs its forward pass (false, and generation stops
  // with kContextFull, when the context is full); then forwarded() hands over its logits and
  // time, and step() only samples.
  bool forward_pending();
  int32_t last_token() const { return prev_; }
  void forwarded(std::span<const float> logits, double ms);
  bool finished() const { return finished_; }
  const GenerateResult& result() const { return result_; }

 private:
  Session& session_;
  const Tokenizer& tokenizer_;
  Sampler& sampler_;
  GenerateOptions options_;
  GenerateResult result_;
  std::span<const float> logits_;
  std::vector<int32_t> fed_after_;     // the question, appended once the prompt is in
  std::vector<int32_t> end_tokens_;    // with ignore_eos: the end-of-generation ids, never sampled
  std::vector<float> allowed_logits_;  // the logits with those set to -inf
  int32_t prev_ = 0;
  bool started_ = false;
  bool finished_ = false;
  bool pending_ = false;  // the token sampled last has not been through the model yet
};

// Resets `session`, prefills prompt.prefill, appends prompt.fed_after, then samples up to
// options.max_new_tokens tokens. Throws Error when the prompt is empty, longer than the
// session's context, or max_new_tokens is negative.
GenerateResult generate(Session& session, const Tokenizer& tokenizer, const PromptTokens& prompt,
                        Sampler& sampler, const GenerateOptions& options,
                        const TokenCallback& on_token = {});

}  // namespace protokv
