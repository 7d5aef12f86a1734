// SPDX-License-Identifier: Apache-2.0
#pragma once
// `eval fidelity` as a library (DESIGN §6): every (press, budget) against the full cache on the
// same prompts, teacher-forced over the same continuation.
//
// Per sample, the full-cache run prefills the prompt and decodes the M continuation tokens,
// recording the next-token logits of every step (the prefill's last logits predict token 0, the
// decode of token t-1 predicts token t), the attention output of every layer for every
// continuation query, and each query head's attention weights. Each press then prefills the same
// prompt with compression and decodes the same M tokens. Metrics:
//  - KL(full ‖ press) of the next-token distributions (softmax in double), mean and max over the
//    M steps; top-1 agreement; perplexity of the continuation under the press and under full;
//  - attention-output relative error ‖o − õ‖/‖o‖ per layer (ProtoKV Eq. 2): per query head,
//    then the mean over heads and over the M continuation queries;
//  - top-B attention recall: for every continuation query, layer and query head, the B prompt
//    positions that full attended most (B = the budget); the share of them the press kept in that
//    head's KV head after prefill (a token merged into an entry counts as kept); averaged over
//    queries, heads and layers;
//  - entries stored vs prompt tokens they stand for (they differ when a press merges entries);
//  - KV bytes after prefill and time spent in the press.
// With teacher forcing both runs see identical tokens, so differences come from the cache alone.
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/metrics.h"
#include "eval/progress.h"
#include "eval/shard.h"
#include "eval/statistics.h"
#include "protokv/model.h"

namespace protokv {
class Tokenizer;
}

namespace protokv::eval {

// One prompt and the continuation it is teacher-forced over.
struct FidelitySample {
  std::vector<int32_t> prompt;
  std::vector<int32_t> continuation;  // empty: use the full cache's greedy output
  nlohmann::json origin;              // where it came from (offset, seed), recorded in config
};

struct FidelityOptions {
  std::vector<std::string> presses;  // specs: "snapkv", "protokv:prototypes=lsh", "full"
  std::vector<int64_t> budgets;      // entries per KV head per layer
  // Equal-memory points (--kv-memory-share, eval/memory_share.h): per sample and press, the
  // budget at which the press stores this share of the full cache's KV bytes; one row per share
  // after the budgets' rows. Either list may be empty, not both.
  std::vector<double> memory_shares;
  std::string alloc;  // allocator for scoring presses; empty: method default
  // Storage of every press run's keys and values (--cache-type-k/-v); the reference stays F32,
  // so a `full` row measures the cache type's own cost.
  KvCacheType cache_type;
  int64_t continuation = 64;  // M: tokens teacher-forced after the prompt
  // Press the paired differences are taken against: one of `presses`, or "full" (KL 0, top-1 1).
  // Empty: snapkv when it is among the presses, else full.
  std::string reference;
  bool attention_metrics = true;  // attention-output error and top-B recall
  // Run each sample's prompt through the model once and start every (press, budget) from it
  // (PrefilledPrompt): the same numbers, bit for bit, in a fraction of the time; the presses'
  // prefill_ms then counts the copy and the compression only.
  bool share_prefill = false;
  // Results file: one JSON line per sample, appended as each sample finishes (empty: none).
  // With `resume`, the samples already in it are read back instead of run again (same numbers
  // bit for bit; their timings are those of the run that wrote them) and the rest appended; a
  // file written with another configuration is refused.
  std::string jsonl_path;
  bool resume = false;
  // One shard of the samples (eval/shard.h): only its samples run; merge_fidelity_runs() joins
  // the shards' folders into the report of one run.
  EvalShard shard;
  bool progress = true;
  ProgressSink progress_sink;  // set: gets the steps instead of the stderr bar
};

// Metrics of one (press, budget) over all samples; each RunningStats holds one value per sample.
struct FidelityRow {
  std::string press;  // spec as given
  nlohmann::json press_config;
  int64_t budget = 0;          // a budget row: its budget (0 on a memory-share row)
  double memory_share = 0.0;   // a memory-share row: its share (0 on a budget row)
  std::string error;           // non-empty: the press refused this budget (nothing measured)
  RunningStats solved_budget;  // a memory-share row: the budget solved for each sample
  RunningStats kl_mean, top1, ppl, ppl_full, recall, attn_err_mean;
  RunningStats kv_bytes, compress_ms, prefill_ms, decode_ms_per_token;
  RunningStats kv_bytes_attended;  // per decode step; below kv_bytes for a recall press
  // After prefill, all layers and KV heads: entries stored and the prompt tokens they stand for
  // (more tokens than entries when the press merges entries: chelsea).
  RunningStats entries_stored, tokens_represented;
  double kl_max = 0.0;                       // over every step of every sample
  std::vector<RunningStats> attn_err_layer;  // [n_layers]
  // Per sample, in sample order (for paired comparisons).
  std::vector<double> kl_samples, top1_samples;
  // ProtoKV diagnostics (press's own JSON, per layer) accumulated over samples: key -> [layer].
  std::map<std::string, std::vector<RunningStats>> diagnostics;
};

// The full-cache runs' own numbers, per sample.
struct FidelityReference {
  RunningStats ppl, kv_bytes, prefill_ms, decode_ms_per_token;
};

struct FidelityReport {
  nlohmann::json config;
  std::string paired_reference;  // resolved reference of the paired differences: a press or "full"
  // Press-major; per press the budgets, then the memory shares, each in the given order.
  std::vector<FidelityRow> rows;
  FidelityReference reference;
  std::vector<std::vector<int32_t>> continuations;  // the tokens actually forced, per sample
};

// Runs every sample. Throws Error for an unknown press, a prompt plus continuation beyond the
// context, or bad budgets; a press that refuses one budget (e.g. below its window) gets a row
// with `error` set instead.
FidelityReport run_fidelity(const ModelWeights& weights, const std::vector<FidelitySample>& samples,
                            const FidelityOptions& options);

// Samples cut from `text` at `count` evenly spread offsets: prompt = BOS + prompt_len - 1 text
// tokens, continuation = the next `continuation` text tokens.
std::vector<FidelitySample> samples_from_text(const Tokenizer& tokenizer, const std::string& text,
                                              int64_t prompt_len, int64_t continuation, int count);

// The model's own text: sampled at temperature 1 (no top-k/top-p) with the full cache from BOS,
// restarting from BOS at EOS/BOS or when the context fills, concatenated up to prompt_len +
// continuation tokens. Sample s uses seed + s.
std::vector<FidelitySample> samples_from_model(const ModelWeights& weights, int32_t bos,
                                               int32_t eos, int64_t prompt_len,
                                               int64_t continuation, int count, uint64_t seed);

// SYNTHETIC workload prompts (eval/synthetic.h); continuations are the full cache's greedy output.
std::vector<FidelitySample> samples_synthetic(int vocab_size, int64_t prompt_len, int count,
                                              uint64_t seed);

// {"config": ..., "results": [...]}; see the --help of `eval fidelity` for the fields.
nlohmann::json to_json(const FidelityReport& report);
std::string render_table(const FidelityReport& report);

// The folder a run writes under `out` (eval fidelity --out, eval.fidelity(out=)):
// out/fidelity_<model stem>_p<prompt_len>_c<continuation>_s<samples>, with _shard<I>of<N> for
// one shard of a sharded run (so that the shards of a job array may share one --out).
std::string fidelity_out_dir(const std::string& out, const std::string& model_path,
                             int64_t prompt_len, int64_t continuation, int samples,
                             const EvalShard& shard = {});
// eval fidelity --out, eval.fidelity(out=): creates that folder and points `options` at its
// samples.jsonl (each sample's records as it finishes; `resume` skips those already there).
// Returns the folder; Error when it cannot be created.
// `options.shard` names the folder.
std::string open_fidelity_out_dir(const std::string& out, const std::string& model_path,
                                  int64_t prompt_len, int64_t continuation, int samples,
                                  bool resume, FidelityOptions& options);

// The line above the table: model, prompt, continuation, samples (and the shard).
std::string fidelity_title(const FidelityReport& report);

// `protokv eval merge` of `eval fidelity` folders: joins the folders of a sharded run (every
// shard 1/N..N/N, each finished) into the report one run over all samples makes (the same
// per-sample records added in sample order, so the same numbers and paired intervals; the
// timings are the shards'). Writes it like write_report_dir plus the merged samples.jsonl into
// `out_dir` when given. Throws Error naming the folder for a missing, repeated or unfinished
// shard, or folders of different configurations.
FidelityReport merge_fidelity_runs(const std::vector<std::string>& dirs,
                                   const std::string& out_dir);

// Writes results.json, config.json and per metric one SVG against the budget (budget rows, one
// line per press: <metric>.svg) and one against the share of the full cache's KV bytes stored
// (every row: <metric>_vs_memory.svg) into `dir` (created). Returns the files written.
std::vector<std::string> write_report_dir(const FidelityReport& report, const std::string& dir);

}  // namespace protokv::eval
