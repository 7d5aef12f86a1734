#pragma once
// Text generation on top of Session, for the CLI and any other front end (server, bindings):
// prompt text -> tokens (build_prompt) -> prefill, compressed by the session's press -> the
// question (query-agnostic mode) appended as a second chunk -> a sampling loop with a per-token
// callback and stop conditions (max tokens, EOS unless ignored, full context).
#include <cstdint>
#include <functional>
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
  bool ignore_eos = false;  // keep sampling after the end-of-sequence token
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

// Resets `session`, prefills prompt.prefill, appends prompt.fed_after, then samples up to
// options.max_new_tokens tokens. Throws Error when the prompt is empty, longer than the
// session's context, or max_new_tokens is negative.
GenerateResult generate(Session& session, const Tokenizer& tokenizer, const PromptTokens& prompt,
                        Sampler& sampler, const GenerateOptions& options,
                        const TokenCallback& on_token = {});

}  // namespace protokv
