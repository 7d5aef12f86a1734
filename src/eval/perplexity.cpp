// SPDX-License-Identifier: Apache-2.0
#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>

#include "protokv/error.h"
#include "protokv/timer.h"
#include "protokv/tokenizer.h"

namespace protokv::eval {

std::vector<int32_t> perplexity_tokens(const Tokenizer& tokenizer, std::string_view text) {
  Tokenizer::EncodeOptions options;
  options.add_bos = tokenizer.add_bos() && tokenizer.bos_id() >= 0;
  options.parse_special = false;  // llama-perplexity: common_tokenize(..., parse_special = false)
  return tokenizer.encode(text, options);
}

double llama_cpp_nll(std::span<const float> logits, int32_t token) {
  PROTOKV_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(),
                "perplexity: token {} out of range [0, {})", token, logits.size());
  float max_logit = logits[0];
  for (const float v : logits) max_logit = std::max(max_logit, v);
  double sum_exp = 0.0;
  for (const float v : logits) sum_exp += std::exp(v - max_logit);
  return -(static_cast<double>(logits[static_cast<size_t>(token)] - max_logit) - std::log(sum_exp));
}

int64_t perplexity_chunk_count(int64_t n_tokens, int64_t model_context,
                               const PerplexityOptions& options) {
  const int64_t n_ctx = options.n_ctx;
  PROTOKV_CHECK(n_ctx >= 4, "perplexity: context size (-c) must be at least 4, got {}", n_ctx);
  PROTOKV_CHECK(n_ctx <= model_context,
                "perplexity: context size (-c) {} exceeds the model's context length {}", n_ctx,
                model_context);
  PROTOKV_CHECK(options.n_chunks != 0, "perplexity: --chunks must be positive (or -1 for all)");
  PROTOKV_CHECK(n_tokens >= 2 * n_ctx,
                "perplexity: the text tokenizes to only {} tokens; a context of {} needs at least "
                "{}",
                n_tokens, n_ctx, 2 * n_ctx);
  const int64_t n_chunk_max = n_tokens / n_ctx;
  return options.n_chunks < 0 ? n_chunk_max : std::min(options.n_chunks, n_chunk_max);
}

PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int32_t bos,
                            const PerplexityOptions& options, const PerplexityProgress& on_chunk) {
  const int64_t n_ctx = options.n_ctx;
  const auto n_tokens = static_cast<int64_t>(tokens.size());
  const int64_t n_chunk =
      perplexity_chunk_count(n_tokens, session.config().context_length, options);
  const int64_t first = n_ctx / 2;

  PerplexityResult result;
  result.n_text_tokens = n_tokens;
  result.n_ctx = n_ctx;
  double nll = 0.0, nll2 = 0.0;
  int64_t count = 0;
  Timer timer;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  for (int64_t c = 0; c < n_chunk; ++c) {
    std::copy_n(tokens.begin() + c * n_ctx, n_ctx, chunk.begin());
    if (bos >= 0) chunk[0] = bos;
    // Logits at position j predict chunk[j + 1]; positions first .. n_ctx - 2 are scored.
    auto score = [&](std::span<const float> logits, int64_t j) {
      const double v = llama_cpp_nll(logits, chunk[static_cast<size_t>(j + 1)]);
      nll += v;
      nll2 += v * v;
      ++count;
    };
    score(session.prefill(std::span<const int32_t>(chunk.data(), static_cast<size_t>(first + 1))),
          first);
    // The rest of the chunk in one pass, every row's logits (as llama-perplexity's batch does).
    if (n_ctx - 2 > first)
      session.append(
          std::span<const int32_t>(chunk.data() + first + 1,
                                   static_cast<size_t>(n_ctx - 2 - first)),
          [&](int64_t i, std::span<const float> logits) { score(logits, first + 1 + i); });
    result.running_ppl.push_back(std::exp(nll / static_cast<double>(count)));
    result.n_chunks = c + 1;
    result.n_scored = count;
    if (on_chunk) on_chunk(c, result);
  }
  result.seconds = timer.ms() / 1000.0;

  const double mean = nll / static_cast<double>(count);
  const double variance = nll2 / static_cast<double>(count) - mean * mean;
  result.mean_nll = mean;
  result.ppl = std::exp(mean);
  // llama.cpp: the standard error of the mean nll, propagated through exp (d ppl = ppl d nll).
  result.ppl_error =
      variance > 0.0 ? std::sqrt(variance / static_cast<double>(count - 1)) * result.ppl : 0.0;
  return result;
}

}  // namespace protokv::eval
