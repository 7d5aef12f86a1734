// SPDX-License-Identifier: Apache-2.0
// `protokv perplexity`: llama.cpp's llama-perplexity protocol on a GGUF (or llama2.c) model, so
// the two engines' numbers on the same file and text can be compared directly.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "eval/perplexity.h"
#include "protokv/error.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

struct PerplexityCliOptions {
  ModelOptions model;
  std::string text_file;
  int64_t n_ctx = 512;
  int64_t n_chunks = -1;
  bool json = false;
  CacheTypeOptions cache_type;
};

void run_perplexity(const PerplexityCliOptions& o) {
  // Option errors before the (possibly slow) model load.
  PROTOKV_CHECK(o.n_ctx >= 4, "perplexity: context size (-c) must be at least 4, got {}", o.n_ctx);
  PROTOKV_CHECK(o.n_chunks != 0, "perplexity: --chunks must be positive (or -1 for all)");
  SessionOptions session_options;
  session_options.cache_type = parse_cache_type(o.cache_type);
  const std::string text = read_text_file(o.text_file);
  PROTOKV_CHECK(!text.empty(), "perplexity: the text file {} is empty", o.text_file);
  const LoadedModel model = load_model_from_options(o.model, /*require_tokenizer=*/true);
  const Tokenizer& tokenizer = *model.tokenizer;
  const std::vector<int32_t> tokens = eval::perplexity_tokens(tokenizer, text);
  const bool add_bos = tokenizer.add_bos() && tokenizer.bos_id() >= 0;

  eval::PerplexityOptions options;
  options.n_ctx = o.n_ctx;
  options.n_chunks = o.n_chunks;
  // Fails here, before anything is printed, when the text is too short or -c does not fit.
  const int64_t n_chunks = eval::perplexity_chunk_count(
      static_cast<int64_t>(tokens.size()), model.weights.config.context_length, options);
  Session session(model.weights, session_options);
  eval::PerplexityProgress progress;
  if (!o.json) {
    fmt::print("perplexity: {} tokens, {} chunks of {}, scoring the last {} of each\n",
               tokens.size(), n_chunks, o.n_ctx, o.n_ctx - o.n_ctx / 2 - 1);
    std::fflush(stdout);
    progress = [](int64_t chunk, const eval::PerplexityResult& so_far) {
      // llama-perplexity's running estimate: "[1]12.3456,[2]11.9876,..."
      fmt::print("[{}]{:.4f},", chunk + 1, so_far.running_ppl.back());
      std::fflush(stdout);
    };
  }
  const eval::PerplexityResult r =
      eval::perplexity(session, tokens, add_bos ? tokenizer.bos_id() : -1, options, progress);

  if (o.json) {
    nlohmann::json out;
    out["model"] = model_json(model);
    out["threads"] = num_threads();
    out["cache_type_k"] = dtype_name(session_options.cache_type.key);
    out["cache_type_v"] = dtype_name(session_options.cache_type.value);
    out["text_tokens"] = r.n_text_tokens;
    out["n_ctx"] = r.n_ctx;
    out["chunks"] = r.n_chunks;
    out["scored_tokens"] = r.n_scored;
    out["mean_nll"] = r.mean_nll;
    out["ppl"] = r.ppl;
    out["ppl_error"] = r.ppl_error;
    out["running_ppl"] = r.running_ppl;
    out["seconds"] = r.seconds;
    fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("\n");
  fmt::print("{} chunks, {} scored tokens, {:.2f} s ({:.1f} tokens/s)\n", r.n_chunks, r.n_scored,
             r.seconds, static_cast<double>(r.n_chunks * r.n_ctx) / r.seconds);
  fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_error);
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityCliOptions>();
  auto* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity of a text with llama.cpp's llama-perplexity protocol: the text (BOS in front) "
      "is cut into chunks of -c tokens, each evaluated from an empty cache with BOS as its first "
      "token, and only the second half of each chunk is scored. Prints the running estimate per "
      "chunk and \"Final estimate: PPL = X +/- Y\" like llama.cpp, so the same GGUF file can be "
      "compared across the two engines. Needs at least 2 * -c tokens of text.");
  add_model_options(*cmd, o->model);
  cmd->add_option("-f,--file", o->text_file, "Text file to score")->required();
  cmd->add_option("-c,--ctx-size", o->n_ctx, "Tokens per chunk")->capture_default_str();
  cmd->add_option("--chunks", o->n_chunks, "Chunks to evaluate (-1: all)")->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the text report");
  add_cache_type_options(*cmd, o->cache_type);
  cmd->callback([o] { run_perplexity(*o); });
}

}  // namespace protokv::cli
