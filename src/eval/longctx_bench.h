// SPDX-License-Identifier: Apache-2.0
#pragma once
// The long-context benchmarks end to end, one library call each: the CLI's `eval niah|ruler|
// longbench` and the Python package's protokv.eval.niah/ruler/longbench are thin over these, so
// both report the same JSON. Each call makes the benchmark's samples from its options, has every
// (press, budget) answer them (run_longctx), and assembles the report: the dict the CLI prints
// with --json and writes to results.json, the text tables it prints otherwise, and (with an
// output folder) results.json, config.json, samples.jsonl and figures.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "eval/longctx_runner.h"
#include "eval/niah.h"
#include "eval/ruler.h"
#include "eval/shard.h"
#include "protokv/model.h"

namespace protokv::eval {

// The model's identity and shape, as every --json record states it.
nlohmann::json model_json(const LoadedModel& model);

// What every long-context benchmark takes besides its own options.
struct LongctxBenchmarkRun {
  LongctxOptions options;  // runs, allocator, mode, reference, progress (jsonl_path: see out_dir)
  // The caller's facts (tokenizer, seed, threads...); the call adds the model, the runs and its
  // own section.
  nlohmann::json config = nlohmann::json::object();
  // Non-empty: created if needed; samples.jsonl is written there as records are produced (the
  // resume file), then results.json, config.json and the figures.
  std::string out_dir;
  int64_t limit = 0;  // only the first N samples (LongBench: of each dataset); 0: all
  // One shard of the samples (after `limit`): the report covers its samples only, and
  // merge_longctx_runs() joins the shards' folders.
  EvalShard shard;
};

struct LongctxReport {
  nlohmann::json results;  // summary, per-group tables, config, wall_ms, skipped
  std::string text;        // the tables for a terminal (without the skipped-sample lines)
  std::vector<LongctxRecord> records;
  // File name -> SVG (NIAH: one heat map per run); written to out_dir when given.
  std::vector<std::pair<std::string, std::string>> figures;
};

struct NiahBenchmark {
  NiahOptions niah;  // lengths / depths empty: defaults for the model's context
  // Non-empty: the haystack text (repeated / cut to length); `haystack_name` says where it came
  // from (a file path) in the report and in errors.
  std::string haystack_text;
  std::string haystack_name = "haystack";
  std::string haystack_kind = "noise";  // without text: noise (RULER's sentences) or model
};
LongctxReport run_niah_benchmark(const LoadedModel& model, NiahBenchmark benchmark,
                                 LongctxBenchmarkRun run);

struct RulerBenchmark {
  RulerOptions ruler;      // tasks empty: the eleven synthetic (+ qa_1 / qa_2 when their data is
                           // given); lengths empty: the defaults for the model's context
  std::string essay_name;  // where ruler.essay_text came from, for the report
  // kvpress's leaderboard protocol (KvpressRulerProtocol below): the run must have been made
  // with its presses, kept shares, mode and reference; the length is resolved from the model's
  // context (ruler.lengths must be empty) and config.protocol says what was run.
  bool kvpress_protocol = false;
};

// kvpress's RULER leaderboard protocol (`eval ruler --protocol kvpress`, Python
// `ruler(protocol="kvpress")`; its evaluation's defaults for RULER): 4096 tokens (or the model's
// context when smaller), the context compressed before the question is seen (query_aware: false),
// compression ratios 0.25, 0.5, 0.75 and 0.875 = the share of the context's KV pairs removed, so
// protokv kept shares (ratios) 0.75 .. 0.125; every press paired against the full cache. The
// settings it fixes are refused when given, not silently overridden.
struct KvpressRulerProtocol {
  static constexpr int64_t kLength = 4096;
  static constexpr double kKeptShares[] = {0.75, 0.5, 0.25, 0.125};
  static constexpr const char* kMode = "query-agnostic";
  static constexpr const char* kReference = "full";
  // For "<setting> fixed by the protocol: drop it" errors.
  static constexpr const char* kFixes =
      "query-agnostic, 4096 tokens or the model's context, compression ratios "
      "0.25/0.5/0.75/0.875 against full";
  // The presses with the reference `full` first (added when missing).
  static std::vector<std::string> presses(std::vector<std::string> given);
  // Fails on the first of the settings a front end says were given (flag or keyword names) that
  // the protocol fixes: they are refused, not silently overridden.
  static void refuse_given(const std::vector<std::string>& given);
};
LongctxReport run_ruler_benchmark(const LoadedModel& model, RulerBenchmark benchmark,
                                  LongctxBenchmarkRun run);

struct LongbenchBenchmark {
  std::string data_dir;               // <dataset>.jsonl files (<dataset>_e.jsonl for -E)
  std::vector<std::string> datasets;  // empty: every file found
  bool longbench_e = false;
  int64_t max_length = 0;  // middle truncation to N tokens; 0: a prompt beyond the context fails
};
// Names and files are checked before any work (the CLI calls it before loading the model).
void check_longbench_benchmark(const LongbenchBenchmark& benchmark);
LongctxReport run_longbench_benchmark(const LoadedModel& model, const LongbenchBenchmark& benchmark,
                                      LongctxBenchmarkRun run);

// The report of finished records from a run's configuration alone (what prepare and the
// benchmark wrote into LongctxBenchmarkRun::config): the tables, results and figures. Records in
// run-major order, samples in benchmark order (as run_longctx returns them).
LongctxReport assemble_longctx_report(const nlohmann::json& config,
                                      std::vector<LongctxRecord> records, double wall_ms);

// `protokv eval merge`: joins the output folders of a sharded run (every shard 1/N..N/N, each
// finished) into the report one run over all samples writes: the same records in the same
// order, so the same tables and paired intervals (the measured times are the shards'; wall_ms
// their sum). One unsharded folder is accepted too (its tables recomputed). Writes
// results.json, config.json, samples.jsonl and the figures into `out_dir` when given. Throws
// Error naming the folder for a missing, repeated or unfinished shard, a folder of another
// configuration, a record out of place.
LongctxReport merge_longctx_runs(const std::vector<std::string>& dirs, const std::string& out_dir);

}  // namespace protokv::eval
