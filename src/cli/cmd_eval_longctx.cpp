// SPDX-License-Identifier: Apache-2.0
// `protokv eval niah|ruler|longbench`: the long-context benchmarks of the papers, every
// (press, budget) on the same samples (eval/longctx_runner.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "eval/fidelity.h"
#include "eval/longctx_bench.h"
#include "eval/results_file.h"
#include "eval/spec_list.h"
#include "protokv/error.h"

namespace protokv::cli {
namespace {

// Flags shared by the three benchmarks.
struct LongctxArgs {
  ModelOptions model;
  std::vector<std::string> presses = {"full"};
  std::string budgets;
  std::string ratios;
  std::string memory_shares;
  std::string alloc;
  std::string mode = "query-aware";
  std::string reference = "full";
  int64_t limit = 0;
  uint64_t seed = 42;
  bool json = false;
  std::string out_dir;
  bool resume = false;
  std::string shard;
  bool share_prefill = false;
  bool batch_decode = false;
  bool quiet = false;
  CacheTypeOptions cache_type;
};

void add_longctx_options(CLI::App& cmd, LongctxArgs& args) {
  add_model_options(cmd, args.model);
  cmd.add_option("--press", args.presses,
                 "comma-separated press specs, e.g. full,snapkv,protokv:prototypes=lsh "
                 "(full = uncompressed reference)")
      ->capture_default_str();
  cmd.add_option("--budget", args.budgets, "comma-separated budgets (KV entries per head)");
  cmd.add_option("--ratio", args.ratios,
                 "comma-separated kept shares of the prompt in (0, 1], e.g. 0.016,0.1");
  cmd.add_option("--kv-memory-share", args.memory_shares,
                 "comma-separated shares in (0, 1] of the full cache's KV bytes: each sample's "
                 "budget is solved per press so that it STORES that share (equal memory across "
                 "presses; clusterkv, which stores everything, cannot reach one below 1; "
                 "docs/longcontext.md)");
  cmd.add_option("--alloc", args.alloc, "budget allocator: uniform|pyramid|adakv");
  cmd.add_option("--mode", args.mode,
                 "query-aware (question compressed with the context) or query-agnostic "
                 "(context compressed first, question appended after)")
      ->capture_default_str();
  cmd.add_option("--reference", args.reference,
                 "run the others are paired against (accuracy difference, 95% interval)")
      ->capture_default_str();
  cmd.add_option("--limit", args.limit, "only the first N samples (0: all)")->capture_default_str();
  cmd.add_option("--seed", args.seed, "seed of the generated samples")->capture_default_str();
  cmd.add_flag("--json", args.json, "JSON on stdout (the content of results.json)");
  cmd.add_option("--out", args.out_dir,
                 "write DIR/results.json, config.json, samples.jsonl (one line per sample, "
                 "written as it is produced) and SVGs");
  cmd.add_flag("--share-prefill", args.share_prefill,
               "run each prompt through the model once and compress that for every press and "
               "budget (the same records bit for bit, much faster; prefill_ms then counts only "
               "the copy and the compression)");
  cmd.add_flag("--batch-decode", args.batch_decode,
               "decode the answers of every press and budget of a sample together, one batched "
               "forward pass per token (the same records bit for bit, faster; decode_ms is then "
               "the batch's time, not one press's decode speed)");
  cmd.add_flag("--resume", args.resume,
               "continue an interrupted run: reuse DIR/samples.jsonl records (needs --out)");
  cmd.add_option("--shard", args.shard,
                 "I/N: run every N-th sample only, starting with the I-th (1 <= I <= N), for a "
                 "job array; `protokv eval merge` joins the N output folders into one run's "
                 "tables (docs/scale-out.md)");
  cmd.add_flag("--quiet", args.quiet, "no progress bar");
  add_cache_type_options(cmd, args.cache_type);  // every run's, the reference's too
}

// The shared flags as a library run (eval/longctx_bench.h); the model is loaded after the
// checks that need no model.
eval::LongctxBenchmarkRun make_run(const LongctxArgs& args) {
  check_mode(args.mode);
  PROTOKV_CHECK(args.limit >= 0, "--limit must be >= 0");
  PROTOKV_CHECK(!args.resume || !args.out_dir.empty(), "--resume needs --out DIR");
  eval::LongctxBenchmarkRun run;
  const std::vector<int64_t> budgets = args.budgets.empty()
                                           ? std::vector<int64_t>{}
                                           : eval::parse_positive_list(args.budgets, "--budget");
  const std::vector<double> ratios =
      args.ratios.empty() ? std::vector<double>{} : eval::parse_ratio_list(args.ratios, "--ratio");
  const std::vector<double> memory_shares =
      args.memory_shares.empty() ? std::vector<double>{}
                                 : eval::parse_ratio_list(args.memory_shares, "--kv-memory-share");
  const std::vector<std::string> presses = eval::split_press_specs(args.presses);
  for (const auto& press : presses)
    PROTOKV_CHECK(
        press == "full" || !budgets.empty() || !ratios.empty() || !memory_shares.empty(),
        "press {} needs --budget N[,N...], --ratio R[,R...] or --kv-memory-share S[,S...]", press);
  run.options.runs = eval::make_run_specs(presses, budgets, ratios, memory_shares);
  run.options.alloc = args.alloc;
  run.options.query_agnostic = args.mode == "query-agnostic";
  run.options.reference = args.reference;
  run.options.progress = !args.quiet;
  run.options.resume = args.resume;
  run.options.share_prefill = args.share_prefill;
  run.options.batch_decode = args.batch_decode;
  run.options.cache_type = parse_cache_type(args.cache_type);
  run.out_dir = args.out_dir;
  run.limit = args.limit;
  if (!args.shard.empty()) run.shard = eval::EvalShard::parse(args.shard);
  run.config["tokenizer"] =
      args.model.tokenizer_path.empty() ? "embedded" : args.model.tokenizer_path;
  return run;
}

// Prints the report (text or JSON) and the skipped samples, one line each, so that a bad sample
// is visible without reading the JSONL.
void print_report(const LongctxArgs& args, const eval::LongctxReport& report) {
  FILE* info = args.json ? stderr : stdout;
  if (args.json) {
    std::printf("%s\n", report.results.dump(2).c_str());
  } else {
    std::printf("%s", report.text.c_str());
  }
  std::map<std::string, int> seen;
  for (const auto& r : report.records) {
    if (r.error.empty() || seen[r.id]++ > 0) continue;
    std::fprintf(info, "skipped %s: %s\n", r.id.c_str(), r.error.c_str());
  }
  if (!args.out_dir.empty()) std::fprintf(info, "wrote %s\n", args.out_dir.c_str());
}

// ---- niah ---------------------------------------------------------------------------------

struct NiahArgs {
  LongctxArgs common;
  std::string lengths;
  std::string depths;
  std::string haystack_file;
  eval::NiahBenchmark benchmark;
};

void run_niah(NiahArgs& args) {
  eval::LongctxBenchmarkRun run = make_run(args.common);
  eval::NiahBenchmark& b = args.benchmark;
  b.niah.seed = args.common.seed;
  if (!args.lengths.empty()) b.niah.lengths = eval::parse_positive_list(args.lengths, "--lengths");
  if (!args.depths.empty()) b.niah.depths = eval::parse_percent_list(args.depths, "--depths");
  if (!args.haystack_file.empty()) {
    b.haystack_text = read_text_file(args.haystack_file);
    b.haystack_name = args.haystack_file;
  }
  const LoadedModel model = load_model_from_options(args.common.model, /*require_tokenizer=*/true);
  print_report(args.common, eval::run_niah_benchmark(model, b, std::move(run)));
}

// ---- ruler --------------------------------------------------------------------------------

struct RulerArgs {
  LongctxArgs common;
  std::string protocol;
  std::string tasks;
  std::string lengths;
  std::string essay_file;
  eval::RulerBenchmark benchmark;
};

// kvpress's leaderboard protocol (eval::KvpressRulerProtocol): the flags it fixes are refused,
// not silently overridden.
void apply_kvpress_protocol(RulerArgs& args, const CLI::App& cmd) {
  using P = eval::KvpressRulerProtocol;
  std::vector<std::string> given;
  for (const char* flag :
       {"--mode", "--budget", "--ratio", "--kv-memory-share", "--lengths", "--reference"})
    if (cmd.count(flag) > 0) given.emplace_back(flag);
  P::refuse_given(given);
  args.common.mode = P::kMode;
  args.common.ratios = fmt::format("{:g}", fmt::join(P::kKeptShares, ","));
  args.common.reference = P::kReference;
  args.common.presses = P::presses(eval::split_press_specs(args.common.presses));
  args.benchmark.kvpress_protocol = true;
}

void run_ruler(RulerArgs& args, const CLI::App& cmd) {
  PROTOKV_CHECK(args.protocol.empty() || args.protocol == "kvpress",
                "--protocol: '{}' is not a known protocol (kvpress)", args.protocol);
  if (!args.protocol.empty()) apply_kvpress_protocol(args, cmd);
  eval::LongctxBenchmarkRun run = make_run(args.common);
  eval::RulerBenchmark& b = args.benchmark;
  b.ruler.seed = args.common.seed;
  if (!args.tasks.empty()) b.ruler.tasks = eval::split_names(args.tasks);
  if (!args.lengths.empty()) b.ruler.lengths = eval::parse_positive_list(args.lengths, "--lengths");
  if (!args.essay_file.empty()) {
    b.ruler.essay_text = read_text_file(args.essay_file);
    b.essay_name = args.essay_file;
  }
  const LoadedModel model = load_model_from_options(args.common.model, /*require_tokenizer=*/true);
  print_report(args.common, eval::run_ruler_benchmark(model, b, std::move(run)));
}

// ---- longbench ----------------------------------------------------------------------------

struct LongbenchArgs {
  LongctxArgs common;
  std::string datasets;
  eval::LongbenchBenchmark benchmark;
};

void run_longbench(LongbenchArgs& args) {
  eval::LongbenchBenchmark& b = args.benchmark;
  if (!args.datasets.empty()) b.datasets = eval::split_names(args.datasets);
  // Names and files first: an unknown dataset fails before the model is loaded.
  eval::check_longbench_benchmark(b);
  eval::LongctxBenchmarkRun run = make_run(args.common);
  const LoadedModel model = load_model_from_options(args.common.model, /*require_tokenizer=*/true);
  print_report(args.common, eval::run_longbench_benchmark(model, b, std::move(run)));
}

// ---- merge --------------------------------------------------------------------------------

struct MergeArgs {
  std::vector<std::string> dirs;
  std::string out_dir;
  bool json = false;
};

void run_merge(const MergeArgs& args) {
  PROTOKV_CHECK(!args.dirs.empty(), "eval merge: give the shards' folders");
  const nlohmann::json config =
      eval::read_json_object_file((std::filesystem::path(args.dirs[0]) / "config.json").string());
  if (config.contains("teacher_forcing")) {  // eval fidelity's folders
    const eval::FidelityReport report = eval::merge_fidelity_runs(args.dirs, args.out_dir);
    if (args.json) {
      std::printf("%s\n", eval::to_json(report).dump(2).c_str());
    } else {
      std::printf("%s%s", eval::fidelity_title(report).c_str(), eval::render_table(report).c_str());
    }
    if (!args.out_dir.empty())
      std::fprintf(args.json ? stderr : stdout, "wrote %s\n", args.out_dir.c_str());
    return;
  }
  const eval::LongctxReport report = eval::merge_longctx_runs(args.dirs, args.out_dir);
  LongctxArgs print_args;
  print_args.json = args.json;
  print_args.out_dir = args.out_dir;
  print_report(print_args, report);
}

}  // namespace

void register_eval_longctx(CLI::App& eval) {
  {
    auto args = std::make_shared<NiahArgs>();
    auto* cmd = eval.add_subcommand(
        "niah",
        "Needle in a haystack (Kamradt): a grid of context lengths x needle depths per "
        "(press, budget); greedy answer scored by exact containment of the needle's value; "
        "heat-map SVG per run with --out.");
    add_longctx_options(*cmd, args->common);
    cmd->add_option("--lengths", args->lengths,
                    "comma-separated prompt lengths in tokens (default: 512..context in 4-8 "
                    "geometric steps, min(512, context/4) on small models)");
    cmd->add_option("--depths", args->depths,
                    "comma-separated needle depths in % (default 0,10,...,100)");
    cmd->add_option("--haystack", args->haystack_file,
                    "UTF-8 text file for the haystack (repeated/cut to length)");
    cmd->add_option("--haystack-kind", args->benchmark.haystack_kind,
                    "without --haystack: noise (RULER's repeated sentences) or model (the "
                    "model's own sampled text)")
        ->capture_default_str();
    cmd->add_option("--needle", args->benchmark.niah.needle, "needle template ({key}, {value})")
        ->capture_default_str();
    cmd->add_option("--question", args->benchmark.niah.question,
                    "question template ({key}); appended after the context")
        ->capture_default_str();
    cmd->add_option("--max-new-tokens", args->benchmark.niah.max_new_tokens, "tokens generated")
        ->capture_default_str();
    cmd->add_option("--samples", args->benchmark.niah.samples_per_cell,
                    "samples (key/value pairs) per cell")
        ->capture_default_str();
    cmd->callback([args] { run_niah(*args); });
  }
  {
    auto args = std::make_shared<RulerArgs>();
    auto* cmd = eval.add_subcommand(
        "ruler",
        "RULER's synthetic tasks (niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, "
        "niah_multiquery, vt, cwe, fwe; qa_1/qa_2 with --squad/--hotpotqa) with its templates, "
        "generators (seeded) and scoring (string_match_all / string_match_part x100), per task "
        "and averaged, per (press, budget).");
    add_longctx_options(*cmd, args->common);
    cmd->add_option("--protocol", args->protocol,
                    "kvpress: kvpress's leaderboard protocol (query-agnostic, 4096 tokens or the "
                    "model's context, compression ratios 0.25/0.5/0.75/0.875 = share of the "
                    "context removed, paired against full; a score-vs-ratio table and "
                    "score_vs_ratio.svg)");
    cmd->add_option("--tasks", args->tasks, "comma-separated tasks (default: all eleven)");
    cmd->add_option("--lengths", args->lengths,
                    "comma-separated sequence lengths (prompt + generated tokens; default "
                    "4096, 8192, ... up to the context, or the context when smaller)");
    cmd->add_option("--samples", args->benchmark.ruler.samples, "samples per task and length")
        ->capture_default_str();
    cmd->add_option("--haystack", args->essay_file,
                    "UTF-8 text for the essay haystack (RULER: Paul Graham essays); default: "
                    "repeated noise");
    cmd->add_option("--squad", args->benchmark.ruler.squad_path,
                    "SQuAD JSON (v2.0 dev format) for qa_1 (added to the default tasks)");
    cmd->add_option("--hotpotqa", args->benchmark.ruler.hotpotqa_path,
                    "HotpotQA JSON (distractor dev format) for qa_2 (added to the default tasks)");
    cmd->callback([args, cmd] { run_ruler(*args, *cmd); });
  }
  {
    auto args = std::make_shared<LongbenchArgs>();
    auto* cmd = eval.add_subcommand(
        "longbench",
        "LongBench / LongBench-E on the official JSONL files: official prompt templates, "
        "max new tokens, middle truncation to --max-length, official metrics (qa_f1, rouge_l, "
        "classification, retrieval, count, code_sim; Chinese with a character-level stand-in "
        "for jieba), per dataset (and per length bucket with --e) and averaged.");
    add_longctx_options(*cmd, args->common);
    cmd->add_option("--data", args->benchmark.data_dir,
                    "directory of <dataset>.jsonl files (<dataset>_e.jsonl with --e)")
        ->required();
    cmd->add_option("--datasets", args->datasets,
                    "comma-separated datasets (default: every file found in --data)");
    cmd->add_flag("--e", args->benchmark.longbench_e,
                  "LongBench-E: *_e.jsonl, scores per length bucket");
    cmd->add_option("--max-length", args->benchmark.max_length,
                    "truncate prompts in the middle to N tokens (as pred.py); without it, a "
                    "prompt beyond the model's context is an error")
        ->capture_default_str();
    cmd->callback([args] { run_longbench(*args); });
  }
  {
    auto args = std::make_shared<MergeArgs>();
    auto* cmd = eval.add_subcommand(
        "merge",
        "Join the --out folders of a sharded eval niah|ruler|longbench|fidelity (--shard 1/N "
        "..N/N, each finished) into the tables, paired intervals and files one run over every "
        "sample makes (the same records in the same order; times are the shards').");
    cmd->add_option("dirs", args->dirs, "the shards' output folders")->required();
    cmd->add_option(
        "--out", args->out_dir,
        "write DIR/results.json, config.json, samples.jsonl and SVGs of the merged run");
    cmd->add_flag("--json", args->json, "JSON on stdout (the content of results.json)");
    cmd->callback([args] { run_merge(*args); });
  }
}

}  // namespace protokv::cli
