// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared harness of the long-context benchmarks (`eval niah`, `eval ruler`, `eval longbench`):
// every (press, budget) answers the same samples by greedy decoding; each sample's context is
// prefilled once per (press, budget); per-sample records are appended to a JSONL file as they are
// produced, so a stopped run resumes where it was (--resume); a sample that fails (prompt too
// long, a press that refuses the budget) is recorded with its error and skipped, never the run.
//
// Token protocol (the same as `protokv generate --mode`): the prompt is two token spans,
// `context` (BOS included) and `question` (encoded on its own, no BOS), so query-aware and
// query-agnostic runs see exactly the same tokens and differ only in what is compressed:
//  - query-aware: context + question are prefilled (and compressed) together;
//  - query-agnostic: the context alone is prefilled and compressed, then the question tokens are
//    appended one by one through Session::decode (the realistic protocol: the cache is
//    compressed before the question is known).
// One question per sample: the engine has no cache snapshot, so several questions on one
// compressed context would need a re-prefill each anyway (RULER's multi-query task asks its
// queries in one prompt, as the original does).
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/progress.h"
#include "protokv/limits.h"
#include "protokv/model.h"
#include "protokv/press.h"
#include "protokv/press_spec.h"

namespace protokv {
class Tokenizer;
}

namespace protokv::eval {

struct LongctxSample {
  std::string id;                    // unique and stable across runs (the resume key)
  std::vector<int32_t> context;      // BOS + context tokens
  std::vector<int32_t> question;     // appended after the context (may be empty)
  std::vector<std::string> answers;  // references for the scorer
  int max_new_tokens = 32;
  nlohmann::json meta = nlohmann::json::object();  // task, length, depth, dataset... (grouping)
  std::string error;  // set by the generator: the sample is recorded as skipped, not run
  // Position in the benchmark's whole sample list (a shard's samples keep theirs: the merge
  // orders records by it); -1: the sample's position in the list run_longctx is given.
  int64_t index = -1;
};

// Scores one prediction of one sample in [0, 1].
using LongctxScorer = std::function<double(const LongctxSample&, const std::string& prediction)>;

// One (press, budget) configuration. `press` == "full" with no budget: the uncompressed cache.
struct LongctxRunSpec {
  std::string press = "full";
  Budget budget;
  // In (0, 1]: instead of a budget, each sample's budget is solved so that the press stores this
  // share of the full cache's KV bytes (eval/memory_share.h; --kv-memory-share).
  double memory_share = 0.0;
  // Set: the press itself (one written in Python, say), `press` its name in labels; it carries
  // its own allocator, so LongctxOptions::alloc must then be empty.
  std::shared_ptr<const PressSpec> press_object;
  std::string label() const;  // "full", "snapkv@64", "snapkv@r0.25", "snapkv@m0.06"
  bool compresses() const { return budget.is_set() || memory_share > 0.0; }
};

// "full,snapkv" x budgets "64,128" (or ratios "0.1,0.25", or memory shares "0.06,0.25") -> runs;
// full appears once (no budget). Throws Error for a run given twice (labels key the records), a
// memory share outside (0, 1] or more than limits::kMaxEvalRuns runs.
std::vector<LongctxRunSpec> make_run_specs(const std::vector<std::string>& presses,
                                           const std::vector<int64_t>& budgets,
                                           const std::vector<double>& ratios,
                                           const std::vector<double>& memory_shares = {});

struct LongctxOptions {
  std::vector<LongctxRunSpec> runs;
  std::string alloc;  // budget allocator for scoring presses; empty: method default
  bool query_agnostic = false;
  // Every run's KV cache type (llama.cpp's -ctk / -ctv; the reference run's too: its memory is
  // then the type's full cache, and every memory share a share of that).
  KvCacheType cache_type;
  std::string reference = "full";  // label of the run the others are paired against
  std::string jsonl_path;          // empty: keep records in memory only
  bool resume = false;             // reuse records of jsonl_path whose (run, id) match
  // "I/N" for one shard of a sharded run (eval/shard.h), empty otherwise: it is part of the
  // results file's header, so a shard resumes its own file and no other.
  std::string shard;
  // Each sample's prompt runs through the model once and every run compresses a copy of it
  // (PrefilledPrompt; the same records bit for bit, prefill_ms then counts the copy and the
  // compression only).
  bool share_prefill = false;
  // Each sample's runs answer together: one decode_batch per generated token over every run
  // still answering (each run's tokens bit-identical to decoding alone; the weights are read once
  // per step for all runs). decode_ms is then the wall time of the batched steps a run took part
  // in, not its own decode speed.
  bool batch_decode = false;
  bool progress = true;
  std::string progress_label = "eval";
  ProgressSink progress_sink;  // set: gets the steps instead of the stderr bar
};

// The header line of a long-context results file (samples.jsonl), which a resume and a merge
// must match: the mode, the allocator ("default" when none), the shard ("I/N", empty for a whole
// run) and the cache types (dtype names; named only when either is not f32, so that files of
// F32 runs written before the types existed still match).
nlohmann::json longctx_results_header(std::string_view mode, std::string_view alloc,
                                      std::string_view shard, std::string_view cache_type_k,
                                      std::string_view cache_type_v);

// One sample answered by one run.
struct LongctxRecord {
  std::string run;  // LongctxRunSpec::label()
  std::string id;
  int64_t sample = -1;  // LongctxSample::index: the record's place when shards are merged
  std::string prediction;
  double score = 0.0;
  std::string error;  // non-empty: skipped (not scored)
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double compress_ms = 0.0;
  double prefill_ms = 0.0;
  size_t kv_bytes = 0;       // after prefill (and after the question in query-agnostic mode)
  size_t peak_kv_bytes = 0;  // prefill's peak
  // What the last decode step's attention read (PrefillStats::decode_attended_kv_bytes): below
  // kv_bytes for a recall press (clusterkv); 0 when no decode step ran.
  size_t attended_kv_bytes = 0;
  // What the full cache holds for the prompt (full_kv_bytes): kv_bytes and attended_kv_bytes
  // over it are the stored and attended shares; 0 in records written before it was kept.
  size_t full_kv_bytes = 0;
  int64_t budget = 0;      // the solved budget of a memory-share run, else 0
  double decode_ms = 0.0;  // question feeding + generation
  nlohmann::json meta;
  bool resumed = false;
  nlohmann::json to_json() const;
  static LongctxRecord from_json(const nlohmann::json& j);
};

// Mean score of a set of records, with the paired difference against the reference.
struct LongctxSummary {
  std::string run;
  int64_t scored = 0;
  int64_t skipped = 0;
  double mean_score = 0.0;  // in [0, 1]
  // Paired with the reference on the samples both scored: mean(run - reference) and the
  // half-width of its 95% Student-t interval (t(0.975, n - 1) * sd / sqrt(n), sd with n - 1;
  // NaN for n = 1); n = 0: none.
  int64_t paired = 0;
  double diff_mean = 0.0;
  double diff_ci95 = 0.0;
  double compress_ms = 0.0;  // mean per scored sample
  double kv_bytes = 0.0;     // mean per scored sample
  double peak_kv_bytes = 0.0;
  // Means of kv_bytes / full_kv_bytes and attended_kv_bytes / full_kv_bytes over the scored
  // records that know full_kv_bytes (the attended share of records that decoded); NaN if none.
  double stored_share = NAN;
  double attended_share = NAN;
  nlohmann::json to_json() const;
};

struct LongctxResult {
  std::vector<LongctxRecord> records;  // run-major, samples in order
  double wall_ms = 0.0;
};

// Runs every spec over every sample. Throws Error for an unknown press, a bad budget, a resume
// file written with another configuration. Per-sample failures become records with `error`.
LongctxResult run_longctx(const ModelWeights& weights, const Tokenizer& tokenizer,
                          const std::vector<LongctxSample>& samples, const LongctxScorer& scorer,
                          const LongctxOptions& options);

// Summaries of `records` per run (in `runs` order), restricted to records accepted by `filter`
// (null: all), paired against `reference` (a label; absent: no pairing).
std::vector<LongctxSummary> summarize(
    const std::vector<LongctxRecord>& records, const std::vector<LongctxRunSpec>& runs,
    const std::string& reference,
    const std::function<bool(const LongctxRecord&)>& filter = nullptr);
// The same by run labels (a merged run knows its runs by label only).
std::vector<LongctxSummary> summarize(
    const std::vector<LongctxRecord>& records, const std::vector<std::string>& labels,
    const std::string& reference,
    const std::function<bool(const LongctxRecord&)>& filter = nullptr);

// Greedy text of a finished generation, cut at the first EOS, with invalid UTF-8 replaced.
std::string decode_prediction(const Tokenizer& tokenizer, const std::vector<int32_t>& tokens);

// Remaining time as "1m23s" from done/total and elapsed ms ("?" before the first step).
std::string format_eta(int64_t done, int64_t total, double elapsed_ms);

}  // namespace protokv::eval
