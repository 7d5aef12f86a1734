// SPDX-License-Identifier: Apache-2.0
#pragma once
// Perplexity with llama.cpp's `llama-perplexity` protocol (tools/perplexity/perplexity.cpp,
// perplexity()), so a protokv number can be put next to a llama.cpp number on the same file:
//  - the whole text is tokenised once, with BOS when the vocabulary adds one, specials not parsed;
//  - it is cut into floor(n_tokens / n_ctx) chunks of n_ctx tokens (at most `n_chunks`), at least
//    two chunks' worth of tokens being required;
//  - each chunk is evaluated from an empty cache, its first token replaced by BOS (when added);
//  - only the second half is scored: the logits at positions first = n_ctx/2 .. n_ctx-2 against
//    the tokens that follow them (n_ctx - first - 1 tokens per chunk);
//  - nll = mean(-log p), ppl = exp(nll), error = ppl * sqrt((mean(nll²) - nll²) / (count - 1)).
// Logits come from protokv::Session with a full cache: the chunk's first half + 1 tokens are
// prefilled, the remaining scored positions are decoded one token at a time (teacher-forced).
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "protokv/engine.h"

namespace protokv {
class Tokenizer;
}

namespace protokv::eval {

struct PerplexityOptions {
  int64_t n_ctx = 512;    // tokens per chunk (llama-perplexity -c, default 512)
  int64_t n_chunks = -1;  // chunks to evaluate; < 0: all (llama-perplexity --chunks)
};

struct PerplexityResult {
  int64_t n_text_tokens = 0;  // tokens of the whole text (BOS included)
  int64_t n_ctx = 0;
  int64_t n_chunks = 0;             // chunks evaluated
  int64_t n_scored = 0;             // tokens scored over all chunks
  double mean_nll = 0.0;            // nats per scored token
  double ppl = 0.0;                 // exp(mean_nll)
  double ppl_error = 0.0;           // llama.cpp's "+/-" (0 when the variance is not positive)
  std::vector<double> running_ppl;  // estimate after each chunk (llama.cpp's "[i]x.xxxx,")
  double seconds = 0.0;             // wall time of the evaluation (tokenisation excluded)
};

// The text's tokens as llama-perplexity gets them: common_tokenize(text, add_special = true,
// parse_special = false), i.e. BOS in front when the tokenizer adds one.
std::vector<int32_t> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text);

// -log softmax(logits)[token] computed exactly as llama.cpp's log_softmax(): float max, the sum of
// expf(logit - max) accumulated in double. Throws Error for a token out of range.
double llama_cpp_nll(std::span<const float> logits, int32_t token);

// Validates the protocol's inputs and returns the number of chunks to evaluate. Throws Error (one
// line) when n_ctx < 4, n_ctx exceeds `model_context`, n_chunks == 0, or n_tokens < 2 * n_ctx.
int64_t perplexity_chunk_count(int64_t n_tokens, int64_t model_context,
                               const PerplexityOptions& options);

// Called after each chunk with its 0-based index and the running result (running_ppl filled up to
// that chunk).
using PerplexityProgress = std::function<void(int64_t chunk, const PerplexityResult& so_far)>;

// Runs the protocol above on `tokens` (from perplexity_tokens) with `session` (reset per chunk;
// it must have no press). `bos` replaces each chunk's first token; pass -1 when the vocabulary
// adds no BOS. Throws Error as perplexity_chunk_count() does.
PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int32_t bos,
                            const PerplexityOptions& options,
                            const PerplexityProgress& on_chunk = {});

}  // namespace protokv::eval
