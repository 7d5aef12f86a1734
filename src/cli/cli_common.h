// SPDX-License-Identifier: Apache-2.0
#pragma once
// Flag plumbing shared by the subcommands that run a model (generate, bench, eval, demo):
// model + tokenizer loading, threads, press / budget / allocator / mode flags, sampler flags, and
// the JSON record of a run's resolved configuration.
//
// CLI11 validators are avoided for values a user commonly gets wrong: their errors print two
// lines; ours go through protokv::Error (one "protokv: error: ..." line, exit code 1).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/units.h"
#include "eval/longctx_bench.h"
#include "eval/report/table.h"
#include "io/text_file.h"
#include "protokv/engine.h"
#include "protokv/model.h"
#include "protokv/press.h"
#include "protokv/press_spec.h"
#include "protokv/sampler.h"

namespace protokv {
class Tokenizer;
}

namespace protokv::cli {

// -m/--model, -z/--tokenizer, -t/--threads.
struct ModelOptions {
  std::string model_path;
  std::string tokenizer_path;  // llama2.c tokenizer.bin; empty: the model file's own
  int threads = 0;             // <= 0: all hardware threads
};
void add_model_options(CLI::App& cmd, ModelOptions& options);
// -m/--model alone, for commands with their own tokenizer and thread flags; one help text.
CLI::Option* add_model_path_option(CLI::App& cmd, std::string& model_path);
// Applies the thread count, then loads the model. With `require_tokenizer`, fails unless -z or
// the model file provides a tokenizer (and checks it fits the model's vocabulary).
LoadedModel load_model_from_options(const ModelOptions& options, bool require_tokenizer);
// The model's identity and shape for --json records.
using eval::model_json;

// -ctk/--cache-type-k, -ctv/--cache-type-v (llama.cpp's flags and values).
struct CacheTypeOptions {
  std::string key = "f32";
  std::string value = "f32";
};
void add_cache_type_options(CLI::App& cmd, CacheTypeOptions& options);
// Throws Error naming the types for an unknown one (the head-width check comes with the model).
KvCacheType parse_cache_type(const CacheTypeOptions& options);

// --press, --budget, --ratio, --alloc, --mode, and the cache types.
struct PressOptions {
  std::string press = "full";  // NAME[:key=value,...]
  int64_t budget = 0;          // entries kept per KV head per layer; 0: unset
  double ratio = 0.0;          // kept share of the prompt; 0: unset
  std::string alloc;           // uniform|pyramid|adakv; empty: the method's default
  std::string mode = "query-aware";
  CacheTypeOptions cache_type;
};
void add_press_options(CLI::App& cmd, PressOptions& options);

// A validated press configuration. `press` is null for "full" without a budget (nothing to do).
struct PressSetup {
  std::shared_ptr<const PressSpec> press;
  Budget budget;
  KvCacheType cache_type;
  bool query_agnostic = false;
  std::string alloc;

  SessionOptions session_options() const;
  // {"press": <press->config()>, "budget": ..., "alloc": ..., "mode": ..., "cache_type_k": ...,
  // "cache_type_v": ...}
  nlohmann::json to_json() const;
};
// Throws Error unless `mode` is query-aware or query-agnostic (the --mode values).
void check_mode(const std::string& mode);
// Builds the press named by `options.press` through the registry and validates budget and mode.
PressSetup make_press_setup(const PressOptions& options);

// --ubatch N: prompt rows per forward chunk (0, the default: the whole prompt at once).
void add_ubatch_option(CLI::App& cmd, int64_t& ubatch);
// Throws Error for a negative --ubatch.
void check_ubatch(int64_t ubatch);

// --temp, --top-k, --top-p, --seed; `options` holds the defaults.
void add_sampler_options(CLI::App& cmd, SamplerOptions& options);
nlohmann::json sampler_json(const SamplerOptions& options);

// Reads a whole text file (prompt or context); Error when unreadable or over
// limits::kMaxTextFileBytes.
using protokv::read_text_file;

// Bytes as "12.3 MiB" etc. for human-readable summaries.

}  // namespace protokv::cli
