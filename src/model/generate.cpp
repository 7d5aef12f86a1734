// SPDX-License-Identifier: Apache-2.0
// The generate loop (include/protokv/generate.h).
#include "protokv/generate.h"

#include <limits>

#include "protokv/error.h"
#include "protokv/timer.h"
#include "protokv/tokenizer.h"

namespace protokv {

PromptTokens build_prompt(const Tokenizer& tokenizer, const std::string& context,
                          const std::string& question, bool query_agnostic) {
  PromptTokens tokens;
  // BOS where the vocabulary asks for it (tokenizer.ggml.add_bos_token; llama2.c and SentencePiece
  // vocabularies do, GPT-2-style ones do not), and always for an empty context: generation then
  // starts from BOS alone.
  tokens.prefill = tokenizer.encode(context, tokenizer.add_bos() || context.empty());
  if (question.empty()) return tokens;
  std::vector<int32_t> q = tokenizer.encode("\n" + question, /*add_bos=*/false);
  auto& target = query_agnostic ? tokens.fed_after : tokens.prefill;
  target.insert(target.end(), q.begin(), q.end());
  return tokens;
}

std::string_view stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxTokens:
      return "max_tokens";
    case StopReason::kEos:
      return "eos";
    case StopReason::kContextFull:
      return "context_full";
  }
  return "unknown";
}

Generation::Generation(Session& session, const Tokenizer& tokenizer, Sampler& sampler,
                       GenerateOptions options)
    : session_(session), tokenizer_(tokenizer), sampler_(sampler), options_(options) {
  PROTOKV_CHECK(options_.max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}",
                options_.max_new_tokens);
  if (options_.ignore_eos)
    for (int32_t id = 0; id < tokenizer_.vocab_size(); ++id)
      if (tokenizer_.is_end_of_generation(id)) end_tokens_.push_back(id);
}

void Generation::start(const PromptTokens& prompt) {
  begin(prompt);
  while (!advance_prefill()) {
  }
}

void Generation::begin(const PromptTokens& prompt) {
  PROTOKV_CHECK(!prompt.prefill.empty(), "empty prompt: generation needs at least one token");
  const int64_t context_length = session_.config().context_length;
  PROTOKV_CHECK(prompt.total() <= context_length,
                "prompt of {} tokens is longer than the model's context ({} tokens)",
                prompt.total(), context_length);
  result_ = GenerateResult{};
  started_ = finished_ = pending_ = false;
  fed_after_ = prompt.fed_after;
  prev_ = prompt.fed_after.empty() ? prompt.prefill.back() : prompt.fed_after.back();
  session_.begin_prefill(prompt.prefill);
}

bool Generation::advance_prefill() {
  if (started_) return true;
  if (!session_.prefill_chunk()) return false;
  logits_ = session_.logits();
  result_.prefill = session_.prefill_stats();
  const Timer question_timer;
  if (!fed_after_.empty()) logits_ = session_.append(fed_after_);
  result_.question_ms = question_timer.ms();
  result_.question_tokens = static_cast<int64_t>(fed_after_.size());
  started_ = true;
  pending_ = false;
  finished_ = options_.max_new_tokens == 0;
  return true;
}

void Generation::continue_with(std::span<const int32_t> tokens) {
  PROTOKV_CHECK(session_.n_past() > 0, "continue_with() needs a session that holds a sequence");
  result_ = GenerateResult{};
  const Timer timer;
  logits_ = session_.append(tokens);
  result_.prefill.n_tokens = static_cast<int64_t>(tokens.size());
  result_.prefill.prefill_ms = timer.ms();
  result_.prefill.kv_bytes = session_.cache().kv_bytes();
  result_.prefill.peak_kv_bytes = result_.prefill.kv_bytes;
  prev_ = tokens.back();
  started_ = true;
  pending_ = false;
  finished_ = options_.max_new_tokens == 0;
}

bool Generation::forward_pending() {
  if (!pending_ || finished_) return false;
  if (session_.n_past() >= session_.config().context_length) {
    result_.stopped = StopReason::kContextFull;
    finished_ = true;
    pending_ = false;
    return false;
  }
  return true;
}

void Generation::forwarded(std::span<const float> logits, double ms) {
  PROTOKV_CHECK(pending_, "Generation::forwarded() without a pending token");
  logits_ = logits;
  result_.decode_ms += ms;
  ++result_.decode_steps;
  pending_ = false;
}

bool Generation::step(const TokenCallback& on_token) {
  PROTOKV_CHECK(started_, "Generation::step() before start()");
  if (forward_pending()) {
    const Timer step;
    const std::span<const float> logits = session_.decode(prev_);
    forwarded(logits, step.ms());
  }
  if (finished_) return false;
  std::span<const float> logits = logits_;
  if (!end_tokens_.empty()) {  // ignore_eos: as llama.cpp, end-of-generation tokens are banned
    allowed_logits_.assign(logits_.begin(), logits_.end());
    for (const int32_t id : end_tokens_)
      if (id < static_cast<int32_t>(allowed_logits_.size()))
        allowed_logits_[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    logits = allowed_logits_;
  }
  const int32_t next = sampler_.sample(logits);
  if (tokenizer_.is_end_of_generation(next)) {
    result_.stopped = StopReason::kEos;
    finished_ = true;
    return false;
  }
  result_.tokens.push_back(next);
  const std::string piece = tokenizer_.decode(prev_, next);
  result_.text += piece;
  prev_ = next;
  // The last token needs no forward pass.
  if (static_cast<int64_t>(result_.tokens.size()) == options_.max_new_tokens)
    finished_ = true;
  else
    pending_ = true;
  if (on_token) on_token(next, piece);
  return true;
}

GenerateResult generate(Session& session, const Tokenizer& tokenizer, const PromptTokens& prompt,
                        Sampler& sampler, const GenerateOptions& options,
                        const TokenCallback& on_token) {
  Generation generation(session, tokenizer, sampler, options);
  generation.start(prompt);
  while (generation.step(on_token)) {
  }
  return generation.result();
}

}  // namespace protokv
