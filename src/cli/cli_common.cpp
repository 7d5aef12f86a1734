// SPDX-License-Identifier: Apache-2.0
#include "cli/cli_common.h"

#include <fmt/format.h>

#include "protokv/dtype.h"
#include "protokv/error.h"
#include "protokv/press_registry.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {

CLI::Option* add_model_path_option(CLI::App& cmd, std::string& model_path) {
  return cmd.add_option("-m,--model", model_path, "Model file: GGUF or llama2.c checkpoint (.bin)");
}

void add_model_options(CLI::App& cmd, ModelOptions& options) {
  add_model_path_option(cmd, options.model_path)->required();
  cmd.add_option("-z,--tokenizer", options.tokenizer_path,
                 "llama2.c tokenizer.bin (default: the tokenizer stored in a GGUF model)");
  cmd.add_option("-t,--threads", options.threads, "Threads (default: all hardware threads)");
}

LoadedModel load_model_from_options(const ModelOptions& options, bool require_tokenizer) {
  set_threads(options.threads);
  LoadedModel model = load_model(options.model_path, options.tokenizer_path);
  if (require_tokenizer) {
    if (model.tokenizer == nullptr) {
      fail("{} has no tokenizer: give one with -z (e.g. tokenizer.bin of llama2.c)",
           options.model_path);
    }
    PROTOKV_CHECK(model.tokenizer->vocab_size() <= model.weights.config.vocab_size,
                  "tokenizer has {} tokens but the model only {}", model.tokenizer->vocab_size(),
                  model.weights.config.vocab_size);
  }
  return model;
}

void add_cache_type_options(CLI::App& cmd, CacheTypeOptions& options) {
  const auto help = [](std::string_view what) {
    return fmt::format(
        "KV cache storage of the {} ({}, as llama.cpp's): {} (q8_0 and q4_0 need a head width "
        "divisible by 32). Every attention reads them as stored; composes with every press",
        what, what == "keys" ? "-ctk" : "-ctv", kv_cache_type_names());
  };
  cmd.add_option("--cache-type-k", options.key, help("keys"))->capture_default_str();
  cmd.add_option("--cache-type-v", options.value, help("values"))->capture_default_str();
}

KvCacheType parse_cache_type(const CacheTypeOptions& options) {
  return {kv_cache_type_from_name(options.key), kv_cache_type_from_name(options.value)};
}

void add_press_options(CLI::App& cmd, PressOptions& options) {
  cmd.add_option("--press", options.press,
                 "KV-cache compression: NAME[:key=value,...] (default full = no compression). "
                 "Methods:\n" +
                     press_help());
  cmd.add_option("--budget", options.budget,
                 "KV entries kept per KV head per layer (window and sinks included)");
  cmd.add_option("--ratio", options.ratio,
                 "Kept share of the prompt in (0, 1]: max(1, floor(n * ratio)) entries per head");
  cmd.add_option("--alloc", options.alloc,
                 "Budget allocation across layers/heads: uniform|pyramid|adakv "
                 "(default: the method's own)");
  cmd.add_option("--mode", options.mode,
                 "query-aware (default): compress context + question together; query-agnostic: "
                 "compress the context alone, then feed the question and generate");
  add_cache_type_options(cmd, options.cache_type);
}

void check_mode(const std::string& mode) {
  PROTOKV_CHECK(mode == "query-aware" || mode == "query-agnostic",
                "--mode must be query-aware or query-agnostic, got '{}'", mode);
}

PressSetup make_press_setup(const PressOptions& options) {
  PressSetup setup;
  check_mode(options.mode);
  setup.cache_type = parse_cache_type(options.cache_type);
  setup.query_agnostic = options.mode == "query-agnostic";
  setup.alloc = options.alloc;
  PROTOKV_CHECK(options.budget >= 0, "--budget must be a positive number of entries, got {}",
                options.budget);
  PROTOKV_CHECK(options.budget == 0 || options.ratio == 0.0,
                "give either --budget or --ratio, not both");
  setup.budget.entries = options.budget;
  setup.budget.ratio = options.ratio;
  const bool budget_given = options.budget != 0 || options.ratio != 0.0;
  if (budget_given) setup.budget.validate();

  std::shared_ptr<const PressSpec> press = PressSpec::parse(options.press, options.alloc);
  if (press->name() == "full" && !budget_given)
    return setup;  // nothing to compress (the cache
                   // type still applies)
  PROTOKV_CHECK(budget_given, "--press {} needs --budget N or --ratio R", options.press);
  setup.press = std::move(press);
  return setup;
}

SessionOptions PressSetup::session_options() const {
  SessionOptions options;
  options.press = press;
  options.budget = budget;
  options.cache_type = cache_type;
  return options;
}

nlohmann::json PressSetup::to_json() const {
  nlohmann::json j;
  j["press"] = press ? press->config() : nlohmann::json{{"name", "full"}};
  j["budget"] = budget.is_set() ? nlohmann::json(budget.to_string()) : nlohmann::json(nullptr);
  if (budget.entries > 0) j["budget_entries"] = budget.entries;
  if (budget.ratio > 0.0) j["budget_ratio"] = budget.ratio;
  j["alloc"] = alloc.empty() ? nlohmann::json("default") : nlohmann::json(alloc);
  j["mode"] = query_agnostic ? "query-agnostic" : "query-aware";
  j["cache_type_k"] = dtype_name(cache_type.key);
  j["cache_type_v"] = dtype_name(cache_type.value);
  return j;
}

void add_ubatch_option(CLI::App& cmd, int64_t& ubatch) {
  cmd.add_option("--ubatch", ubatch,
                 "Prefill the prompt in chunks of N tokens (0: the whole prompt at once). With a "
                 "press, compression runs once the final chunk is in")
      ->capture_default_str();
}

void check_ubatch(int64_t ubatch) {
  PROTOKV_CHECK(ubatch >= 0, "--ubatch must be >= 0 (0: the whole prompt), got {}", ubatch);
}

void add_sampler_options(CLI::App& cmd, SamplerOptions& options) {
  cmd.add_option("--temp", options.temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd.add_option("--top-k", options.top_k, "Keep the k most likely tokens; 0 = off")
      ->capture_default_str();
  cmd.add_option("--top-p", options.top_p, "Nucleus sampling threshold; 1 = off")
      ->capture_default_str();
  cmd.add_option("--seed", options.seed, "Random seed of the sampler")->capture_default_str();
}

nlohmann::json sampler_json(const SamplerOptions& options) {
  if (options.temperature == 0.0f) return {{"kind", "greedy"}};
  return {{"kind", "sample"},
          {"temperature", options.temperature},
          {"top_k", options.top_k},
          {"top_p", options.top_p},
          {"seed", options.seed}};
}

}  // namespace protokv::cli
