// SPDX-License-Identifier: Apache-2.0
// `protokv eval fidelity`: every (press, budget) against the full cache on the same prompts.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "eval/fidelity.h"
#include "eval/spec_list.h"
#include "eval/synthetic.h"
#include "protokv/error.h"
#include "protokv/model.h"
#include "protokv/press_registry.h"
#include "protokv/threads.h"
#include "protokv/tokenizer.h"

namespace protokv::cli {
namespace {

struct FidelityArgs {
  std::string model;
  std::string tokenizer;
  std::string text;
  bool synthetic = false;
  std::vector<std::string> presses;
  std::string budgets;
  std::string memory_shares;
  std::string alloc;
  std::string reference;
  std::string mode = "query-aware";
  int64_t prompt_len = 448;
  int64_t continuation = 64;
  int samples = 48;  // enough pairs to rank methods ~0.01 nats apart on stories260K
  uint64_t seed = 42;
  int threads = 0;
  bool json = false;
  std::string out_dir;
  bool quiet = false;
  bool greedy = false;
  bool no_attention = false;
  bool share_prefill = false;
  bool resume = false;
  std::string shard;
  CacheTypeOptions cache_type;
};

void run_fidelity_command(const FidelityArgs& args) {
  check_mode(args.mode);
  PROTOKV_CHECK(args.mode == "query-aware",
                "--mode query-agnostic is not supported by eval fidelity yet: the teacher-forced "
                "continuation has no separate question to append after compression");
  PROTOKV_CHECK(args.synthetic != !args.model.empty(),
                "give a model (-m MODEL) or --synthetic, not both and not neither");
  PROTOKV_CHECK(!(args.synthetic && !args.text.empty()),
                "--synthetic uses its own workload: drop -f");
  PROTOKV_CHECK(args.samples >= 1 && args.samples <= 10000, "--samples must be in [1, 10000]");
  PROTOKV_CHECK(args.prompt_len >= 2, "--prompt-len must be at least 2");
  PROTOKV_CHECK(args.continuation >= 1, "--continuation must be at least 1");
  PROTOKV_CHECK(!args.resume || !args.out_dir.empty(), "--resume needs --out DIR");
  set_threads(args.threads);

  eval::FidelityOptions options;
  options.presses = eval::split_press_specs(args.presses);
  PROTOKV_CHECK(args.reference.empty() || args.reference == "full" ||
                    std::find(options.presses.begin(), options.presses.end(), args.reference) !=
                        options.presses.end(),
                "--reference {} is not one of the presses given with --press (or full)",
                args.reference);
  PROTOKV_CHECK(!args.budgets.empty() || !args.memory_shares.empty(),
                "give --budget, --kv-memory-share or both");
  if (!args.budgets.empty()) options.budgets = eval::parse_positive_list(args.budgets, "--budget");
  if (!args.memory_shares.empty())
    options.memory_shares = eval::parse_ratio_list(args.memory_shares, "--kv-memory-share");
  options.alloc = args.alloc;
  options.cache_type = parse_cache_type(args.cache_type);
  options.reference = args.reference;
  options.continuation = args.continuation;
  options.attention_metrics = !args.no_attention;
  options.share_prefill = args.share_prefill;
  options.progress = !args.quiet;
  if (!args.shard.empty()) options.shard = eval::EvalShard::parse(args.shard);

  LoadedModel loaded;
  std::string model_path;  // names the --out subfolder
  nlohmann::json source;
  std::vector<eval::FidelitySample> samples;
  if (args.synthetic) {
    const eval::SyntheticModelSpec spec;
    loaded.weights = eval::make_synthetic_model(spec);
    loaded.path = "SYNTHETIC";
    model_path = "synthetic";
    samples = eval::samples_synthetic(spec.vocab_size, args.prompt_len, args.samples, args.seed);
    source = {{"model", "SYNTHETIC"},
              {"model_description", spec.describe()},
              {"text_source", "SYNTHETIC workload"}};
  } else {
    loaded = load_model(args.model, args.tokenizer);
    model_path = args.model;
    source = {{"model", args.model},
              {"model_format", loaded.format},
              {"tokenizer",
               args.tokenizer.empty() ? (loaded.tokenizer ? "embedded" : "none") : args.tokenizer}};
    if (!args.text.empty()) {
      PROTOKV_CHECK(loaded.tokenizer != nullptr,
                    "-f needs a tokenizer: the model file has none, give one with -z");
      samples = eval::samples_from_text(*loaded.tokenizer, read_text_file(args.text),
                                        args.prompt_len, args.continuation, args.samples);
      source["text"] = args.text;
      source["text_source"] = "file";
    } else {
      // llama convention when the model carries no tokenizer: BOS 1, EOS 2.
      const int32_t bos = loaded.tokenizer ? loaded.tokenizer->bos_id() : 1;
      const int32_t eos = loaded.tokenizer ? loaded.tokenizer->eos_id() : 2;
      samples = eval::samples_from_model(loaded.weights, bos, eos, args.prompt_len,
                                         args.continuation, args.samples, args.seed);
      source["text_source"] = "model-sampled (temperature 1, full cache, from BOS)";
    }
  }
  if (args.greedy) {
    for (auto& s : samples) s.continuation.clear();
  }

  std::string dir;
  if (!args.out_dir.empty()) {
    dir = eval::open_fidelity_out_dir(args.out_dir, model_path, args.prompt_len, args.continuation,
                                      args.samples, args.resume, options);
  }
  eval::FidelityReport report = eval::run_fidelity(loaded.weights, samples, options);
  for (auto& [key, value] : source.items()) report.config[key] = value;
  report.config["seed"] = args.seed;
  report.config["threads"] = num_threads();

  if (args.json) {
    std::printf("%s\n", eval::to_json(report).dump(2).c_str());
  } else {
    std::printf("%s%s", eval::fidelity_title(report).c_str(), eval::render_table(report).c_str());
  }
  if (!dir.empty()) {
    eval::write_report_dir(report, dir);
    std::fprintf(args.json ? stderr : stdout, "wrote %s\n", dir.c_str());
  }
}

}  // namespace

void register_eval(CLI::App& app) {
  auto* eval = app.add_subcommand("eval", "Evaluate KV-cache compression methods");
  eval->require_subcommand(1);
  auto args = std::make_shared<FidelityArgs>();
  auto* cmd = eval->add_subcommand(
      "fidelity",
      "Every (press, budget) against the full cache on the same prompts, teacher-forced over the "
      "same continuation: next-token KL(full||press) mean/max, top-1 agreement, perplexity, "
      "attention-output relative error per layer (ProtoKV Eq. 2; per query head, mean over heads "
      "and continuation queries), top-B attention recall (full's B most-attended prompt "
      "positions per continuation query, layer and query head; share kept in that head's KV "
      "head after prefill), KV bytes, compression ms. Prompts: -f TEXT (cut at evenly spread "
      "offsets, one per sample, continuation = the text's own), the model's own sampled text "
      "(default), or --synthetic. Mode: query-aware only (the whole prompt is compressed).");
  add_model_path_option(*cmd, args->model);
  cmd->add_option("-z,--tokenizer", args->tokenizer, "llama2.c tokenizer.bin (for -f)");
  cmd->add_option("-f,--file", args->text, "UTF-8 text to cut prompts and continuations from");
  cmd->add_flag("--synthetic", args->synthetic,
                "use the built-in SYNTHETIC model and workload (no model file)");
  cmd->add_option("--press", args->presses,
                  "comma-separated press specs, e.g. full,snapkv,protokv:prototypes=lsh")
      ->required();
  cmd->add_option("--budget", args->budgets, "comma-separated budgets (entries per KV head)");
  cmd->add_option("--kv-memory-share", args->memory_shares,
                  "comma-separated shares in (0, 1] of the full cache's KV bytes: each sample's "
                  "budget is solved per press so that it STORES that share (equal memory across "
                  "presses; clusterkv, which stores everything, cannot reach one below 1; "
                  "docs/longcontext.md); rows after the --budget ones");
  cmd->add_option("--alloc", args->alloc,
                  "budget allocator for scoring presses: uniform|pyramid|adakv");
  add_cache_type_options(*cmd, args->cache_type);  // the reference run stays F32
  cmd->add_option("--reference", args->reference,
                  "press the paired KL/top-1 differences are taken against (one of --press, or "
                  "full); default: snapkv when given, else full");
  cmd->add_option("--mode", args->mode, "query-aware (query-agnostic: not supported here yet)")
      ->capture_default_str();
  cmd->add_option("--prompt-len", args->prompt_len, "prompt tokens (BOS included)")
      ->capture_default_str();
  cmd->add_option("--continuation", args->continuation, "teacher-forced continuation tokens")
      ->capture_default_str();
  cmd->add_option("--samples", args->samples, "prompts (text offsets or sampled stories)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "seed of sampled/synthetic prompts (sample s: seed+s)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", args->threads, "threads (0: all cores)")->capture_default_str();
  cmd->add_flag("--greedy", args->greedy,
                "force the full cache's greedy output instead of the text's continuation");
  cmd->add_flag("--no-attention-metrics", args->no_attention,
                "skip attention-output error and recall (faster on large models)");
  cmd->add_flag("--share-prefill", args->share_prefill,
                "run each prompt through the model once and compress that for every press and "
                "budget (the same metrics bit for bit, much faster; prefill_ms then counts "
                "only the copy and the compression)");
  cmd->add_flag(
      "--json", args->json,
      "JSON on stdout: {config, full, results: [{press, budget, memory_share, solved_budget, "
      "kl_mean, kl_max, top1, ppl, attn_err[layer], recall, kv_bytes, stored_share, "
      "attended_share, compress_ms, samples, per_sample: {kl_mean, top1}, paired: {reference, "
      "kl_mean_diff, top1_diff: {mean, se, ci95, samples}}, "
      "protokv_diagnostics: [per layer], ...}]}");
  cmd->add_option("--out", args->out_dir,
                  "write DIR/fidelity_<model>_p<P>_c<M>_s<S>/ with results.json, config.json, "
                  "SVG plots and samples.jsonl (each sample's numbers as it finishes)");
  cmd->add_flag("--resume", args->resume,
                "continue a stopped run of the same configuration from --out's samples.jsonl "
                "(one line per finished sample; those are read back, not run again)");
  cmd->add_option("--shard", args->shard,
                  "I/N: run every N-th sample only, starting with the I-th (1 <= I <= N), for a "
                  "job array; --out gets a _shard<I>of<N> folder and `protokv eval merge` joins "
                  "the N folders into one run's report (docs/scale-out.md)");
  cmd->add_flag("--quiet", args->quiet, "no progress bar");
  cmd->footer("Presses:\n" + press_help());
  cmd->callback([args] { run_fidelity_command(*args); });
  register_eval_longctx(*eval);
}

}  // namespace protokv::cli
