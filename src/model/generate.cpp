// The generate loop (include/protokv/generate.h).
#include "protokv/generate.h"

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

GenerateResult generate(Session& session, const Tokenizer& tokenizer, const PromptTokens& prompt,
                        Sampler& sampler, const GenerateOptions& options,
                        const TokenCallback& on_token) {
  PROTOKV_CHECK(options.max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}",
                options.max_new_tokens);
  PROTOKV_CHECK(!prompt.prefill.empty(), "empty prompt: generation needs at least one token");
  const int64_t context_length = session.config().context_length;
  PROTOKV_CHECK(prompt.total() <= context_length,
                "prompt of {} tokens is longer than the model's context ({} tokens)",
                prompt.total(), context_length);

  GenerateResult result;
  std::span<const float> logits = session.prefill(prompt.prefill);
  result.prefill = session.prefill_stats();

  const Timer question_timer;
  if (!prompt.fed_after.empty()) logits = session.append(prompt.fed_after);
  result.question_ms = question_timer.ms();
  result.question_tokens = static_cast<int64_t>(prompt.fed_after.size());

  int32_t prev = prompt.fed_after.empty() ? prompt.prefill.back() : prompt.fed_after.back();
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int32_t next = sampler.sample(logits);
    if (tokenizer.is_end_of_generation(next) && !options.ignore_eos) {
      result.stopped = StopReason::kEos;
      break;
    }
    result.tokens.push_back(next);
    const std::string piece = tokenizer.decode(prev, next);
    result.text += piece;
    if (on_token) on_token(next, piece);
    prev = next;
    if (i + 1 == options.max_new_tokens) break;  // the last token needs no forward pass
    if (session.n_past() >= context_length) {
      result.stopped = StopReason::kContextFull;
      break;
    }
    const Timer step;
    logits = session.decode(next);
    result.decode_ms += step.ms();
    ++result.decode_steps;
  }
  return result;
}

}  // namespace protokv
