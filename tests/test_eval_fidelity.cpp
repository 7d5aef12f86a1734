// SPDX-License-Identifier: Apache-2.0
// eval fidelity, bench compress and demo on the SYNTHETIC model: end to end, at tiny sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "eval/compress_bench.h"
#include "eval/demo.h"
#include "eval/fidelity.h"
#include "eval/metrics.h"
#include "eval/synthetic.h"
#include "protokv/error.h"
#include "test_util.h"

namespace protokv::eval {
namespace {

using protokv::testing::run_protokv;
using protokv::testing::TempDir;

const std::vector<std::string> kAllPresses = {"full",      "streaming_llm", "h2o",    "snapkv",
                                              "pyramidkv", "adakv",         "protokv"};

struct TinyRun {
  FidelityReport report;
  int64_t prompt_len = 64;
};

const TinyRun& tiny_run() {
  static const TinyRun run = [] {
    TinyRun r;
    const ModelWeights weights = make_synthetic_model(SyntheticModelSpec::tiny());
    FidelityOptions options;
    options.presses = kAllPresses;
    options.budgets = {16, 32, r.prompt_len};  // the last one keeps everything
    options.continuation = 8;
    options.progress = false;
    const auto samples = samples_synthetic(weights.config.vocab_size, r.prompt_len, 2, 5);
    r.report = run_fidelity(weights, samples, options);
    return r;
  }();
  return run;
}

TEST(EvalFidelity, BudgetCoveringThePromptGivesExactlyZeroKlForEveryPress) {
  const auto& run = tiny_run();
  ASSERT_EQ(run.report.rows.size(), kAllPresses.size() * 3);
  for (const auto& row : run.report.rows) {
    ASSERT_TRUE(row.error.empty()) << row.press << " @ " << row.budget << ": " << row.error;
    EXPECT_EQ(row.kl_mean.count(), 2);
    if (row.budget < run.prompt_len) continue;
    EXPECT_EQ(row.kl_mean.mean(), 0.0) << row.press;
    EXPECT_EQ(row.kl_max, 0.0) << row.press;
    EXPECT_EQ(row.top1.mean(), 1.0) << row.press;
    EXPECT_EQ(row.recall.mean(), 1.0) << row.press;
    EXPECT_EQ(row.attn_err_mean.mean(), 0.0) << row.press;
    EXPECT_EQ(row.ppl.mean(), row.ppl_full.mean()) << row.press;
    EXPECT_EQ(row.kv_bytes.mean(), run.report.reference.kv_bytes.mean()) << row.press;
  }
}

TEST(EvalFidelity, SharedPrefillGivesTheSameMetricsBitForBit) {
  const auto& run = tiny_run();
  const ModelWeights weights = make_synthetic_model(SyntheticModelSpec::tiny());
  FidelityOptions options;
  options.presses = kAllPresses;
  options.budgets = {16, 32, run.prompt_len};
  options.continuation = 8;
  options.progress = false;
  options.share_prefill = true;
  const auto samples = samples_synthetic(weights.config.vocab_size, run.prompt_len, 2, 5);
  const FidelityReport shared = run_fidelity(weights, samples, options);
  ASSERT_EQ(shared.rows.size(), run.report.rows.size());
  for (size_t i = 0; i < shared.rows.size(); ++i) {
    const FidelityRow& a = run.report.rows[i];
    const FidelityRow& b = shared.rows[i];
    EXPECT_EQ(a.kl_samples, b.kl_samples) << a.press << " @ " << a.budget;
    EXPECT_EQ(a.top1_samples, b.top1_samples) << a.press;
    EXPECT_EQ(a.recall.mean(), b.recall.mean()) << a.press;
    EXPECT_EQ(a.attn_err_mean.mean(), b.attn_err_mean.mean()) << a.press;
    EXPECT_EQ(a.kv_bytes.mean(), b.kv_bytes.mean()) << a.press;
  }
  EXPECT_EQ(shared.config.value("share_prefill", false), true);
}

TEST(EvalFidelity, FullPressMatchesTheReferenceAtEveryBudget) {
  for (const auto& row : tiny_run().report.rows) {
    if (row.press != "full") continue;
    EXPECT_EQ(row.kl_mean.mean(), 0.0) << row.budget;
    EXPECT_EQ(row.top1.mean(), 1.0) << row.budget;
    EXPECT_EQ(row.recall.mean(), 1.0) << row.budget;
  }
}

TEST(EvalFidelity, CompressionKeepsTheBudgetAndChangesTheOutput) {
  const auto& run = tiny_run();
  const ModelConfig config = make_synthetic_model(SyntheticModelSpec::tiny()).config;
  bool some_kl = false;
  for (const auto& row : run.report.rows) {
    if (row.press == "full" || row.budget >= run.prompt_len) continue;
    // Uniform presses keep exactly `budget` entries per head; adakv/pyramidkv redistribute
    // but keep the same total on average, never more than the full cache.
    const double full_bytes = run.report.reference.kv_bytes.mean();
    EXPECT_LT(row.kv_bytes.mean(), full_bytes) << row.press;
    if (row.press == "snapkv" || row.press == "streaming_llm" || row.press == "h2o") {
      const double expected =
          2.0 * 4.0 * row.budget * config.head_dim() * config.n_kv_heads * config.n_layers;
      EXPECT_EQ(row.kv_bytes.mean(), expected) << row.press;
    }
    EXPECT_GE(row.kl_mean.mean(), 0.0);
    EXPECT_LE(row.kl_mean.mean(), row.kl_max + 1e-12);
    EXPECT_GE(row.top1.mean(), 0.0);
    EXPECT_LE(row.top1.mean(), 1.0);
    EXPECT_GE(row.recall.mean(), 0.0);
    EXPECT_LE(row.recall.mean(), 1.0);
    EXPECT_EQ(row.attn_err_layer.size(), static_cast<size_t>(config.n_layers));
    some_kl = some_kl || row.kl_mean.mean() > 0.0;
  }
  EXPECT_TRUE(some_kl) << "no press changed the next-token distribution at a quarter budget";
}

TEST(EvalFidelity, StreamingLlmRecallCountsOnlyWhatItKept) {
  // streaming_llm keeps sinks + the most recent tokens; a query attending mostly to the middle
  // of the prompt loses those: its recall is below 1 at budget 16 of 64.
  for (const auto& row : tiny_run().report.rows) {
    if (row.press == "streaming_llm" && row.budget == 16) {
      EXPECT_LT(row.recall.mean(), 1.0);
    }
  }
}

TEST(EvalFidelity, MergedEntriesCountTheirMembersInRecallAndTokensPerEntry) {
  // chelsea merges the middle of each head into B entries: every prompt token stays a member of
  // some entry, so a true top-B token always counts as kept (recall 1, where streaming_llm, which
  // drops the middle, scores below 1), and 4 tokens stand behind each stored entry at 16 of 64.
  const ModelWeights weights = make_synthetic_model(SyntheticModelSpec::tiny());
  FidelityOptions options;
  options.presses = {"chelsea:sinks=2,recent=4,outliers=0", "streaming_llm:sinks=2"};
  options.budgets = {16};
  options.continuation = 4;
  options.progress = false;
  const auto samples = samples_synthetic(weights.config.vocab_size, 64, 1, 5);
  const FidelityReport report = run_fidelity(weights, samples, options);
  ASSERT_EQ(report.rows.size(), 2u);
  const int64_t heads = int64_t{weights.config.n_layers} * weights.config.n_kv_heads;
  const FidelityRow& chelsea = report.rows[0];
  ASSERT_TRUE(chelsea.error.empty()) << chelsea.error;
  EXPECT_EQ(chelsea.entries_stored.mean(), static_cast<double>(heads * 16));
  EXPECT_EQ(chelsea.tokens_represented.mean(), static_cast<double>(heads * 64));
  EXPECT_EQ(chelsea.recall.mean(), 1.0);
  EXPECT_GT(chelsea.kl_mean.mean(), 0.0);
  const FidelityRow& streaming = report.rows[1];
  EXPECT_EQ(streaming.entries_stored.mean(), static_cast<double>(heads * 16));
  EXPECT_EQ(streaming.tokens_represented.mean(), static_cast<double>(heads * 16));
  EXPECT_LT(streaming.recall.mean(), 1.0);
  const nlohmann::json json = to_json(report);
  EXPECT_EQ(json["results"][0]["tokens_represented"], static_cast<double>(heads * 64));
  EXPECT_NE(render_table(report).find("4.00"), std::string::npos);  // tok/entry
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every measured number of two reports, timings aside (a resumed sample keeps the timings of the
// run that wrote it).
void expect_same_numbers(const FidelityReport& a, const FidelityReport& b) {
  EXPECT_EQ(a.continuations, b.continuations);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  EXPECT_EQ(a.reference.ppl.mean(), b.reference.ppl.mean());
  for (size_t r = 0; r < a.rows.size(); ++r) {
    const FidelityRow &x = a.rows[r], &y = b.rows[r];
    SCOPED_TRACE(x.press + " @ " + std::to_string(x.budget));
    EXPECT_EQ(x.error, y.error);
    EXPECT_EQ(x.kl_samples, y.kl_samples);
    EXPECT_EQ(x.top1_samples, y.top1_samples);
    EXPECT_EQ(x.kl_max, y.kl_max);
    EXPECT_EQ(x.ppl.count(), y.ppl.count());
    EXPECT_EQ(x.ppl.mean(), y.ppl.mean());
    EXPECT_EQ(x.ppl_full.mean(), y.ppl_full.mean());
    EXPECT_EQ(x.recall.count(), y.recall.count());
    EXPECT_EQ(x.recall.mean(), y.recall.mean());
    EXPECT_EQ(x.attn_err_mean.mean(), y.attn_err_mean.mean());
    ASSERT_EQ(x.attn_err_layer.size(), y.attn_err_layer.size());
    for (size_t l = 0; l < x.attn_err_layer.size(); ++l)
      EXPECT_EQ(x.attn_err_layer[l].mean(), y.attn_err_layer[l].mean());
    EXPECT_EQ(x.kv_bytes.mean(), y.kv_bytes.mean());
    EXPECT_EQ(x.kv_bytes_attended.mean(), y.kv_bytes_attended.mean());
    EXPECT_EQ(x.entries_stored.mean(), y.entries_stored.mean());
    EXPECT_EQ(x.tokens_represented.mean(), y.tokens_represented.mean());
    ASSERT_EQ(x.diagnostics.size(), y.diagnostics.size());
    for (const auto& [key, layers] : x.diagnostics) {
      ASSERT_EQ(layers.size(), y.diagnostics.at(key).size()) << key;
      for (size_t l = 0; l < layers.size(); ++l)
        EXPECT_EQ(layers[l].mean(), y.diagnostics.at(key)[l].mean()) << key;
    }
  }
}

size_t count_lines(const std::filesystem::path& path) {
  const std::string text = slurp(path);
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST(EvalFidelity, ResumeReadsFinishedSamplesBackAndRunsTheRest) {
  TempDir dir;
  const ModelWeights weights = make_synthetic_model(SyntheticModelSpec::tiny());
  FidelityOptions options;
  // chelsea refuses a budget below its sinks + recent entries: an error row to carry over too.
  options.presses = {"full", "chelsea", "snapkv", "protokv"};
  options.budgets = {6, 16};
  options.continuation = 6;
  options.progress = false;
  const auto samples = samples_synthetic(weights.config.vocab_size, 48, 3, 11);
  const auto uninterrupted = run_fidelity(weights, samples, options);
  ASSERT_FALSE(uninterrupted.rows[2].error.empty()) << "chelsea @ 6 must be refused";
  // The refusal is a row of the table, padded to its columns (with the ±std column of several
  // samples it once had one cell too many and the table threw).
  EXPECT_NE(render_table(uninterrupted).find("n/a: "), std::string::npos);

  const auto path = dir / "samples.jsonl";
  options.jsonl_path = path.string();
  const auto written = run_fidelity(weights, samples, options);
  expect_same_numbers(uninterrupted, written);
  ASSERT_EQ(count_lines(path), 4u);  // header + one line per sample

  // Stopped while writing the third line: keep the header, two samples and half of the third.
  std::string text = slurp(path);
  size_t cut = 0;
  for (int line = 0; line < 3; ++line) cut = text.find('\n', cut) + 1;
  const size_t third_end = text.find('\n', cut);
  text.resize(cut + (third_end - cut) / 2);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
  }
  options.resume = true;
  std::set<std::string> run_full;  // samples whose full-cache run was computed, not read back
  options.progress = true;
  options.progress_sink = [&](int64_t, int64_t, const std::string& detail) {
    if (detail.ends_with(": full")) run_full.insert(detail);
  };
  const auto resumed = run_fidelity(weights, samples, options);
  expect_same_numbers(uninterrupted, resumed);
  EXPECT_EQ(run_full, std::set<std::string>{"sample 3/3: full"});
  EXPECT_EQ(count_lines(path), 4u);

  // Everything there: nothing left to run, same numbers again.
  run_full.clear();
  const auto again = run_fidelity(weights, samples, options);
  expect_same_numbers(uninterrupted, again);
  EXPECT_TRUE(run_full.empty());
  EXPECT_EQ(count_lines(path), 4u);

  // Another configuration in the same file is refused, naming the file.
  auto other = options;
  other.budgets = {6, 20};
  try {
    run_fidelity(weights, samples, other);
    FAIL() << "resumed a file of another configuration";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another configuration"), std::string::npos) << e.what();
  }
  // A record edited by hand into nonsense is one error naming the file, not a crash.
  {
    std::string edited = slurp(path);
    const size_t at = edited.find("\"attn_err\":[");
    ASSERT_NE(at, std::string::npos);
    edited.insert(at + 12, "0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << edited;
    try {
      run_fidelity(weights, samples, options);
      FAIL() << "read a record with more attention-error layers than the model";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("samples.jsonl"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("layers"), std::string::npos) << e.what();
    }
  }
  // Without resume the file starts afresh.
  options.resume = false;
  run_fidelity(weights, std::vector<FidelitySample>(samples.begin(), samples.begin() + 1), options);
  EXPECT_EQ(count_lines(path), 2u);
}

TEST(EvalFidelity, RefusesPromptsBeyondTheContextAndUnknownPresses) {
  const ModelWeights weights = make_synthetic_model(SyntheticModelSpec::tiny());
  FidelityOptions options;
  options.presses = {"snapkv"};
  options.budgets = {16};
  options.continuation = 8;
  options.progress = false;
  const auto too_long = samples_synthetic(weights.config.vocab_size, 510, 1, 1);
  EXPECT_THROW(run_fidelity(weights, too_long, options), Error);
  options.presses = {"no_such_press"};
  const auto ok = samples_synthetic(weights.config.vocab_size, 32, 1, 1);
  EXPECT_THROW(run_fidelity(weights, ok, options), Error);
}

TEST(EvalFidelityCli, SyntheticJsonAndOutputFolder) {
  TempDir dir;
  const auto result = run_protokv(
      "eval fidelity --synthetic --prompt-len 64 --continuation 8 --budget 16,32,64 "
      "--press full,snapkv,protokv:prototypes=lsh --samples 1 --quiet --json -t 1 --out '" +
      dir.path().string() + "'");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["config"]["prompt_len"], 64);
  EXPECT_EQ(json["config"]["continuation"], 8);
  EXPECT_EQ(json["config"]["model"], "SYNTHETIC");
  EXPECT_EQ(json["config"]["mode"], "query-aware");
  EXPECT_EQ(json["config"]["presses"].size(), 3u);
  ASSERT_EQ(json["results"].size(), 9u);
  for (const auto& r : json["results"]) {
    for (const char* key : {"press", "budget", "kl_mean", "kl_max", "top1", "ppl", "attn_err",
                            "recall", "kv_bytes", "compress_ms", "samples"}) {
      EXPECT_TRUE(r.contains(key)) << key;
    }
    if (r["budget"] == 64) {
      EXPECT_EQ(r["kl_mean"].get<double>(), 0.0) << r["press"];
    }
  }
  const auto out = dir.path() / "fidelity_synthetic_p64_c8_s1";
  ASSERT_TRUE(std::filesystem::is_directory(out)) << result.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(out / "results.json"))["results"].size(), 9u);
  EXPECT_EQ(nlohmann::json::parse(slurp(out / "config.json"))["prompt_len"], 64);
  EXPECT_EQ(count_lines(out / "samples.jsonl"), 2u);  // header + the one sample
  for (const char* svg : {"kl_mean.svg", "top1.svg", "ppl.svg", "recall.svg", "attn_err.svg"}) {
    const std::string text = slurp(out / svg);
    EXPECT_EQ(text.rfind("<svg", 0), 0u) << svg;
    EXPECT_NE(text.find("<polyline"), std::string::npos) << svg;
    EXPECT_NE(text.find("</svg>"), std::string::npos) << svg;
  }
}

TEST(EvalFidelityCli, TableAndErrors) {
  const auto table = run_protokv(
      "eval fidelity --synthetic --prompt-len 48 --continuation 4 --budget 16 --press snapkv "
      "--samples 1 --quiet -t 1");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("SYNTHETIC"), std::string::npos);
  EXPECT_NE(table.out.find("snapkv"), std::string::npos);
  EXPECT_NE(table.out.find("KL mean"), std::string::npos);
  const auto agnostic =
      run_protokv("eval fidelity --synthetic --budget 16 --press snapkv --mode query-agnostic");
  EXPECT_EQ(agnostic.exit_code, 1);
  EXPECT_NE(agnostic.err.find("not supported"), std::string::npos);
  const auto no_model = run_protokv("eval fidelity --budget 16 --press snapkv");
  EXPECT_EQ(no_model.exit_code, 1);
  EXPECT_NE(no_model.err.find("protokv: error:"), std::string::npos);
  const auto bad_budget = run_protokv("eval fidelity --synthetic --budget 16,x --press snapkv");
  EXPECT_EQ(bad_budget.exit_code, 1);
  const auto bad_reference = run_protokv(
      "eval fidelity --synthetic --prompt-len 48 --continuation 4 --budget 16 --press snapkv "
      "--reference h2o --samples 1 --quiet -t 1");
  EXPECT_EQ(bad_reference.exit_code, 1);
  EXPECT_NE(bad_reference.err.find("--reference h2o is not one of the presses"), std::string::npos)
      << bad_reference.err;
  const auto resume_nowhere =
      run_protokv("eval fidelity --synthetic --budget 16 --press snapkv --resume");
  EXPECT_EQ(resume_nowhere.exit_code, 1);
  EXPECT_NE(resume_nowhere.err.find("--resume needs --out DIR"), std::string::npos)
      << resume_nowhere.err;
}

TEST(EvalFidelityPaired, StudentTQuantilesAndPairedInterval) {
  EXPECT_DOUBLE_EQ(t_quantile_975(1), 12.706);
  EXPECT_DOUBLE_EQ(t_quantile_975(30), 2.042);
  EXPECT_NEAR(t_quantile_975(47), 2.0117, 2e-4);   // 48 samples
  EXPECT_NEAR(t_quantile_975(120), 1.9799, 2e-4);  // tables: 1.980
  EXPECT_NEAR(t_quantile_975(100000), 1.95996, 1e-4);
  EXPECT_THROW(t_quantile_975(0), Error);
  // Differences 1, 2, 3, 4: mean 2.5, sample std sqrt(5/3), se = std / 2, t(3) = 3.182.
  const PairedDifference d = paired_difference({1.5, 2.5, 3.5, 4.5}, {0.5, 0.5, 0.5, 0.5});
  EXPECT_EQ(d.samples, 4);
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_NEAR(d.se, std::sqrt(5.0 / 3.0) / 2.0, 1e-12);
  EXPECT_NEAR(d.lo, 2.5 - 3.182 * std::sqrt(5.0 / 3.0) / 2.0, 1e-12);
  EXPECT_NEAR(d.hi, 2.5 + 3.182 * std::sqrt(5.0 / 3.0) / 2.0, 1e-12);
  // Pairing removes the shared per-sample level: a constant offset has zero spread.
  const PairedDifference offset = paired_difference({10.0, 20.0, 30.0}, {9.0, 19.0, 29.0});
  EXPECT_NEAR(offset.mean, 1.0, 1e-12);
  EXPECT_NEAR(offset.se, 0.0, 1e-12);
  EXPECT_TRUE(std::isnan(paired_difference({1.0}, {0.0}).se));  // one pair: no interval
}

TEST(EvalFidelityPaired, JsonCarriesPerSampleValuesPairedDifferencesAndProtoKvDiagnostics) {
  const auto& run = tiny_run();
  EXPECT_EQ(run.report.paired_reference, "snapkv");  // snapkv is among the presses
  const auto json = to_json(run.report);
  EXPECT_EQ(json["config"]["reference"], "snapkv");
  std::map<int64_t, std::vector<double>> snapkv_kl;
  for (const auto& r : json["results"])
    if (r["press"] == "snapkv")
      snapkv_kl[r["budget"].get<int64_t>()] = r["per_sample"]["kl_mean"].get<std::vector<double>>();
  for (const auto& r : json["results"]) {
    SCOPED_TRACE(r["press"].get<std::string>() + " @ " + r["budget"].dump());
    const auto kl = r["per_sample"]["kl_mean"].get<std::vector<double>>();
    ASSERT_EQ(kl.size(), 2u);
    ASSERT_EQ(r["per_sample"]["top1"].size(), 2u);
    EXPECT_NEAR((kl[0] + kl[1]) / 2.0, r["kl_mean"].get<double>(), 1e-12);
    const auto& paired = r["paired"];
    EXPECT_EQ(paired["reference"], "snapkv");
    const auto& ref = snapkv_kl[r["budget"].get<int64_t>()];
    const double expected = (kl[0] - ref[0] + kl[1] - ref[1]) / 2.0;
    EXPECT_NEAR(paired["kl_mean_diff"]["mean"].get<double>(), expected, 1e-12);
    EXPECT_EQ(paired["kl_mean_diff"]["samples"], 2);
    EXPECT_EQ(paired["kl_mean_diff"]["ci95"].size(), 2u);
    const bool compressed = r["budget"] != run.prompt_len;
    EXPECT_EQ(r.contains("protokv_diagnostics"), r["press"] == "protokv" && compressed);
  }
  for (const auto& r : json["results"]) {
    if (r["press"] != "protokv" || r["budget"] != 16) continue;
    const auto& layers = r["protokv_diagnostics"];
    ASSERT_EQ(layers.size(), static_cast<size_t>(run.report.config["model_config"]["n_layers"]));
    for (const auto& layer : layers) {
      const double prefix = static_cast<double>(run.prompt_len - 8);  // window 8
      EXPECT_GE(layer["clusters"].get<double>(), 1.0);
      // Averages over heads and samples of prefix / clusters: between 1 and the prefix.
      EXPECT_GE(layer["cluster_size_mean"].get<double>(), 1.0);
      EXPECT_LE(layer["cluster_size_mean"].get<double>(), prefix);
      EXPECT_LE(layer["cluster_size_max"].get<double>(), prefix);
      EXPECT_GE(layer["cluster_size_max"].get<double>(), layer["cluster_size_mean"].get<double>());
      EXPECT_EQ(layer["irregular"].get<double>(), 12.0);
      EXPECT_GE(layer["outside_own_chunk"].get<double>(), 0.0);
      EXPECT_LE(layer["outside_own_chunk"].get<double>(), 1.0);
      EXPECT_GE(layer["whole_cluster_budget_share"].get<double>(), 0.0);
      EXPECT_LE(layer["whole_cluster_budget_share"].get<double>(), 1.0);
    }
  }
  EXPECT_NE(render_table(run.report).find("dKL vs snapkv"), std::string::npos);
}

TEST(EvalFidelityPaired, ReferenceDefaultsToFullWithoutSnapKvAndMustBeAPress) {
  const ModelWeights weights = make_synthetic_model(SyntheticModelSpec::tiny());
  FidelityOptions options;
  options.presses = {"h2o"};
  options.budgets = {16};
  options.continuation = 4;
  options.progress = false;
  options.attention_metrics = false;
  const auto samples = samples_synthetic(weights.config.vocab_size, 48, 2, 3);
  const FidelityReport report = run_fidelity(weights, samples, options);
  EXPECT_EQ(report.paired_reference, "full");
  const auto row = to_json(report)["results"][0];
  // Against full (KL 0, top-1 1) the paired difference is the press's own value.
  EXPECT_NEAR(row["paired"]["kl_mean_diff"]["mean"].get<double>(), row["kl_mean"].get<double>(),
              1e-12);
  EXPECT_NEAR(row["paired"]["top1_diff"]["mean"].get<double>(), row["top1"].get<double>() - 1.0,
              1e-12);
  // Seeded samples and a deterministic engine: a second run reproduces every per-sample value.
  const auto again = samples_synthetic(weights.config.vocab_size, 48, 2, 3);
  ASSERT_EQ(again[1].prompt, samples[1].prompt);
  EXPECT_EQ(run_fidelity(weights, again, options).rows[0].kl_samples, report.rows[0].kl_samples);
  options.reference = "snapkv";
  EXPECT_THROW(run_fidelity(weights, samples, options), Error);
}

TEST(EvalFidelityStories, TextSamplesFromTheRealModel) {
  PROTOKV_REQUIRE_STORIES();
  const auto dir = protokv::testing::stories_dir();
  TempDir tmp;
  {
    std::ofstream text(tmp / "story.txt");
    for (int i = 0; i < 12; ++i) {
      text << "Once upon a time, there was a little girl named Lily. She loved to play outside in "
              "the park. One day, she saw a big, red ball. ";
    }
  }
  const auto result = run_protokv(
      "eval fidelity -m '" + (dir / "stories260K.bin").string() + "' -z '" +
      (dir / "tok512.bin").string() + "' -f '" + (tmp / "story.txt").string() +
      "' --prompt-len 96 --continuation 8 --samples 2 --budget 32,96 --press full,snapkv "
      "--quiet --json -t 1");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["config"]["text_source"], "file");
  EXPECT_EQ(json["config"]["samples"], 2);
  for (const auto& r : json["results"]) {
    EXPECT_EQ(r["samples"], 2);
    if (r["budget"] == 96 || r["press"] == "full") {
      EXPECT_EQ(r["kl_mean"].get<double>(), 0.0);
    }
  }
  // Model-sampled prompts (no -f).
  const auto sampled = run_protokv("eval fidelity -m '" + (dir / "stories260K.bin").string() +
                                   "' --prompt-len 64 --continuation 8 --budget 16 --press "
                                   "snapkv --samples 1 --quiet --json -t 1");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.err;
  EXPECT_EQ(nlohmann::json::parse(sampled.out)["config"]["sample_origins"][0]["source"],
            "model-sampled");
}

TEST(FidelityOutDir, OpensTheRunsFolderOrSaysWhyNot) {
  const TempDir tmp;
  FidelityOptions options;
  const std::string dir =
      open_fidelity_out_dir(tmp.path().string(), "/m/smol.gguf", 64, 8, 3, true, options);
  EXPECT_EQ(dir, (tmp / "fidelity_smol_p64_c8_s3").string());
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_EQ(options.jsonl_path, dir + "/samples.jsonl");
  EXPECT_TRUE(options.resume);

  // A file where the folder should be: one Error line, not a std::filesystem exception.
  std::ofstream(tmp / "file") << "x";
  FidelityOptions other;
  try {
    open_fidelity_out_dir((tmp / "file").string(), "/m/smol.gguf", 64, 8, 3, false, other);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create output directory"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(other.jsonl_path.empty());
}

TEST(BenchCompress, TinyTensorsGiveSaneResults) {
  CompressBenchOptions options;
  options.n_layers = 2;
  options.n_kv_heads = 2;
  options.group_size = 2;
  options.head_dim = 32;
  options.lengths = {256};
  options.presses = {"streaming_llm", "h2o", "protokv"};
  options.budget.entries = 64;
  options.reps = 2;
  options.progress = false;
  const auto report = run_compress_bench(options);
  ASSERT_EQ(report.results.size(), 4u);  // snapkv added first as the reference
  EXPECT_EQ(report.results[0].press, "snapkv");
  EXPECT_EQ(report.results[0].ratio_to_snapkv, 1.0);
  EXPECT_EQ(report.results[0].min_ratio_to_snapkv, 1.0);
  for (const auto& r : report.results)
    EXPECT_DOUBLE_EQ(r.min_ratio_to_snapkv, r.min_ms / report.results[0].min_ms);
  for (const auto& r : report.results) {
    EXPECT_EQ(r.n, 256);
    EXPECT_EQ(r.times_ms.size(), 2u);
    EXPECT_LE(r.min_ms, r.median_ms);
    EXPECT_GE(r.min_ms, 0.0);
    EXPECT_EQ(r.kept_entries, 64 * 2 * 2) << r.press;  // budget × KV heads × layers
    EXPECT_EQ(r.cpu_times_ms.size(), 2u);              // the process's CPU time, per repetition
    EXPECT_LE(r.cpu_min_ms, r.cpu_median_ms);
    EXPECT_GE(r.cpu_min_ms, 0.0);
    if (report.results[0].cpu_min_ms > 0.0) {
      EXPECT_DOUBLE_EQ(r.cpu_min_ratio_to_snapkv, r.cpu_min_ms / report.results[0].cpu_min_ms);
    }
  }
  const auto json = to_json(report);
  EXPECT_EQ(json["results"].size(), 4u);
  EXPECT_EQ(json["config"]["reference"], "snapkv");
  EXPECT_NE(render_table(report).find("x snapkv (min)"), std::string::npos);
  EXPECT_TRUE(json["results"][1].contains("min_ratio_to_snapkv"));
  EXPECT_TRUE(json["results"][1].contains("cpu_min_ratio_to_snapkv"));
  EXPECT_NE(render_table(report).find("CPU x snapkv (min)"), std::string::npos);

  options.budget.entries = 256;  // keeps everything
  EXPECT_THROW(run_compress_bench(options), Error);
  options.budget.entries = 64;
  options.presses = {"full"};
  EXPECT_THROW(run_compress_bench(options), Error);
}

TEST(BenchCompress, MedianOfEvenAndOddSamples) {
  EXPECT_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_THROW(median({}), Error);
}

TEST(Demo, TinyRunPrintsOneSyntheticTable) {
  const auto result = run_protokv("demo --tiny --quiet -t 1 --budget 16,64");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("SYNTHETIC"), std::string::npos);
  for (const char* press : {"full", "streaming_llm", "h2o", "snapkv", "pyramidkv", "protokv"}) {
    EXPECT_NE(result.out.find(press), std::string::npos) << press;
  }
  EXPECT_NE(result.out.find("KL vs full"), std::string::npos);
  EXPECT_NE(result.out.find("protokv eval fidelity -m"), std::string::npos);
}

TEST(Demo, LibraryReportHasEveryPressAndBudget) {
  DemoOptions options;
  options.tiny = true;
  options.budgets = {16, 32};
  options.progress = false;
  const DemoReport report = run_demo(options);
  EXPECT_EQ(report.fidelity.rows.size(), options.presses.size() * 2);
  for (const auto& row : report.fidelity.rows) {
    EXPECT_TRUE(row.error.empty()) << row.press << ": " << row.error;
    EXPECT_GT(row.kv_bytes.mean(), 0.0);
  }
  EXPECT_EQ(demo_json(report)["synthetic"], true);
}

}  // namespace
}  // namespace protokv::eval
